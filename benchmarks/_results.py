"""Shared by the benchmark scripts: their ``## Section`` of benchmarks/RESULTS.md, and loading
a sibling script (``models.py``, ``real_models.py``) by path, the folder not being a package."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

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


def publish(section: str, text: str, write: bool, path: Path = RESULTS) -> None:
    """Print a benchmark's section and, when ``write``, put it into RESULTS.md."""
    print(text)
    if write:
        write_section(section, text, path)
        print(f"updated the {section} section of {path.name}")


def load_sibling(name: str) -> ModuleType | None:
    """``benchmarks/<name>.py`` imported by path, or None when the file is missing."""
    path = RESULTS.parent / f"{name}.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses in the module look themselves up there
    spec.loader.exec_module(module)
    return module
