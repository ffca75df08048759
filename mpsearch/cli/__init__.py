"""The ``mpsearch`` command line: one small module per sub-command."""

from __future__ import annotations

from mpsearch.cli._main import (
    main,
)

__all__ = [
    "main",
]
