"""Generators of hostile run-directory files, made at test time in ``tmp_path`` (nothing big is
committed): each replaces one file of a finished run with what an attacker or a damaged disk
leaves there: a sparse file far larger than memory, a link to an endless device, a deeply
nested or memory-hungry JSON document, non-finite numbers, or a deflate bomb in place of a
calibration table."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

_SPEC = importlib.util.spec_from_file_location("hostile_forge", Path(__file__).with_name(
    "forge.py"))
assert _SPEC is not None and _SPEC.loader is not None
forge = sys.modules.setdefault("hostile_forge", importlib.util.module_from_spec(_SPEC))
if not hasattr(forge, "write_zip"):
    _SPEC.loader.exec_module(forge)

__all__ = ["GENERATORS", "deep", "endless", "json_memory", "nonfinite", "npz_bomb", "sparse"]


def sparse(path: Path, size: int = 64 << 30) -> None:
    """A file of ``size`` bytes of zeros that takes no disk space (a hole)."""
    path.unlink(missing_ok=True)
    with path.open("wb") as f:
        f.truncate(size)


def endless(path: Path) -> None:
    """A link to ``/dev/zero``: a file that never ends."""
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def deep(path: Path, depth: int = 100_000) -> None:
    """JSON arrays nested ``depth`` levels (200 kB)."""
    path.write_bytes(b"[" * depth + b"]" * depth)


def json_memory(path: Path, mib: int = 40) -> None:
    """``mib`` MiB of JSON that is one list of empty lists: ~21 times its size as Python
    objects."""
    count = (mib << 20) // 3
    path.write_bytes(b"[" + b"[]," * count + b"[]]")


def nonfinite(path: Path, where: Callable[[Any], tuple[Any, Any]]) -> None:
    """The file's JSON with the field ``where(document)`` names (its container, its key) set to
    NaN, written as Python's json module writes NaN."""
    document = json.loads(path.read_text())
    container, key = where(document)
    container[key] = math.nan
    path.write_text(json.dumps(document))


def npz_bomb(path: Path, gib: int = 3, *, lie: bool = False) -> None:
    """An .npz whose one member ``hists.npy`` is ``gib`` GiB of int64 zeros deflated to a few
    MB; ``lie``: its zip directory declares 1 MiB instead."""
    total = gib << 30
    head = forge.npy_header((total // 8,), "<i8")
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = bytes(1 << 20)
    first = c.compress(head + block[len(head):]) + c.flush(zlib.Z_FULL_FLUSH)
    repeated = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)  # no reference across a flush
    blocks = total >> 20
    data = first + repeated * (blocks - 1) + c.flush()
    crc = zlib.crc32(head + block[len(head):])
    for _ in range(blocks - 1):
        crc = zlib.crc32(block, crc)
    member = forge.Member("hists.npy", zipfile.ZIP_DEFLATED, data, crc & 0xFFFFFFFF, total,
                          size=(1 << 20) if lie else None)
    forge.write_zip(path, [member])


#: name -> generator of one hostile file at a path.
GENERATORS: dict[str, Callable[[Path], None]] = {
    "sparse": sparse, "endless": endless, "deep": deep, "json_memory": json_memory,
    "npz_bomb": npz_bomb, "npz_bomb_lying": lambda p: npz_bomb(p, lie=True),
}
