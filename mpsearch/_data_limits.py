"""Limits on data inputs, checked from headers before anything is decompressed or decoded.

Consumes paths and open streams; produces nothing but a :class:`~mpsearch.errors.DataError`
naming the file, what it declares and the limit, so a 1 MB .npz that expands to GBs, or an .npy
header that promises more bytes than the file holds, is refused before numpy allocates.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpsearch.errors import DataError

__all__ = ["CORRUPT", "LIMITS", "Limits", "check_npz", "first_line", "npy_bytes"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Input limits checked before anything is decoded.

    ``data_bytes``: the declared (uncompressed) bytes of all arrays of one .npz/.npy;
    ``npz_ratio``: an .npz member over 64 MiB may expand at most this many times its
    compressed size (``numpy.savez``, uncompressed, is never refused by it);
    ``image_pixels``: pixels of one image, read from its header before decoding;
    ``image_side``: largest ``size``/``crop`` an image option may ask for.
    """

    data_bytes: int = 4 << 30
    npz_ratio: float = 100.0
    image_pixels: int = 40_000_000
    image_side: int = 8192


LIMITS = Limits()
_RATIO_CHECKED_FROM = 64 << 20


#: What a truncated or corrupt .npz/.npy raises inside numpy and zipfile.
CORRUPT = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError)


def check_npz(path: Path, limits: Limits) -> None:
    """Refuse an archive by its zip directory and .npy headers, before decompressing it."""
    total = 0
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            total += info.file_size
            ratio = info.file_size / max(1, info.compress_size)
            if info.file_size > _RATIO_CHECKED_FROM and ratio > limits.npz_ratio:
                raise DataError(
                    f"{path}: member '{info.filename}' expands {ratio:.0f}x to "
                    f"{info.file_size / 2**20:.0f} MiB (limit {limits.npz_ratio:g}x): a zip "
                    "bomb or degenerate data; save real data with numpy.savez (uncompressed)")
            if info.filename.endswith(".npy"):
                with archive.open(info) as member:
                    declared = npy_bytes(member)
                if declared > info.file_size:
                    raise DataError(f"{path}: member '{info.filename}' declares {declared} "
                                    f"bytes but holds {info.file_size}; the archive is "
                                    "corrupt, re-save it with numpy.savez")
    if total > limits.data_bytes:
        raise DataError(f"{path}: the arrays take {total / 2**30:.1f} GiB (limit "
                        f"{limits.data_bytes / 2**30:.0f} GiB); use a smaller calibration set")


def npy_bytes(stream: Any) -> int:
    """Bytes of the array an .npy stream's header declares."""
    version = np.lib.format.read_magic(stream)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    shape, _, dtype = read(stream)
    return int(np.prod(shape, dtype=np.float64)) * int(np.dtype(dtype).itemsize)


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else "no detail"
