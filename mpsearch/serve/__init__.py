"""``mpsearch serve``: the local Starlette web interface and its background jobs."""

from __future__ import annotations

from mpsearch.serve._access import LOOPBACK_HOSTS
from mpsearch.serve._app import (
    ServeConfig,
    bundled_files,
    create_app,
)

__all__ = [
    "LOOPBACK_HOSTS",
    "ServeConfig",
    "bundled_files",
    "create_app",
]
