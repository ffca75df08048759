"""Shared by the benchmark scripts: replace one ``## Section`` of benchmarks/RESULTS.md."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mpsearch._io import atomic_write  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(section: str, text: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section headed ``section`` (e.g. ``## Quantize``) with ``text``,
    which starts with that heading, leaving the other sections untouched."""
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
    body = text.rstrip("\n") + "\n\n"
    new = pattern.sub(lambda _: body, old, count=1) if pattern.search(old) else (
        old.rstrip("\n") + "\n\n" + body)
    atomic_write(path, (new.rstrip("\n") + "\n").encode())
