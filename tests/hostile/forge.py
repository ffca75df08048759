"""Builders of the hostile inputs that tests make in ``tmp_path`` (small files, built fast):
zips written byte by byte, so a member's declared sizes can lie, in any compression method,
and PNGs whose pixels compress to almost nothing."""

from __future__ import annotations

import bz2
import io
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Member", "compress", "npy_header", "png", "write_zip", "zeros"]


@dataclass(frozen=True)
class Member:
    """One zip member: ``data`` is already compressed with ``method``; ``size`` and
    ``packed`` are what the directory declares (None: the truth)."""

    name: str
    method: int
    data: bytes
    crc: int
    real_size: int
    size: int | None = None
    packed: int | None = None


def zeros(total: int, chunk: int = 1 << 20) -> list[bytes]:
    """``total`` zero bytes in chunks (never one big buffer)."""
    return [bytes(min(chunk, total - i)) for i in range(0, total, chunk)]


def compress(method: int, head: bytes, body_zeros: int) -> tuple[bytes, int, int]:
    """(compressed bytes, crc, size) of ``head`` followed by ``body_zeros`` zero bytes."""
    if method == zipfile.ZIP_DEFLATED:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
    elif method == zipfile.ZIP_BZIP2:
        c = bz2.BZ2Compressor(9)
    elif method == zipfile.ZIP_LZMA:
        c = zipfile.LZMACompressor()  # type: ignore[attr-defined]
    else:
        raise ValueError(method)
    crc = zlib.crc32(head)
    parts = [c.compress(head)]
    block = bytes(1 << 20)
    left = body_zeros
    while left > 0:
        piece = block if left >= len(block) else bytes(left)
        crc = zlib.crc32(piece, crc)
        parts.append(c.compress(piece))
        left -= len(piece)
    parts.append(c.flush())
    return b"".join(parts), crc & 0xFFFFFFFF, len(head) + body_zeros


def npy_header(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": dtype, "fortran_order": False, "shape": shape})
    return out.getvalue()


def write_zip(path: Path, members: list[Member]) -> None:
    """A zip whose central directory says what each member declares (zip64 not used)."""
    body, central = io.BytesIO(), io.BytesIO()
    for m in members:
        offset = body.tell()
        size = m.real_size if m.size is None else m.size
        packed = len(m.data) if m.packed is None else m.packed
        name = m.name.encode()
        version = 63 if m.method == zipfile.ZIP_LZMA else 46 if m.method == 12 else 20
        flags = 0x2 if m.method == zipfile.ZIP_LZMA else 0
        body.write(struct.pack("<4sHHHHHLLLHH", b"PK\x03\x04", version, flags, m.method, 0,
                               0x21, m.crc, packed, size, len(name), 0) + name + m.data)
        central.write(struct.pack("<4sHHHHHHLLLHHHHHLL", b"PK\x01\x02", 20, version, flags,
                                  m.method, 0, 0x21, m.crc, packed, size, len(name), 0, 0, 0,
                                  0, 0, offset) + name)
    start, cd = body.tell(), central.getvalue()
    end = struct.pack("<4sHHHHLLH", b"PK\x05\x06", 0, 0, len(members), len(members), len(cd),
                      start, 0)
    path.write_bytes(body.getvalue() + cd + end)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(
        ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(width: int, height: int) -> bytes:
    """A complete black RGB PNG of ``width`` x ``height`` (its rows compress ~1000x)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    c = zlib.compressobj(9)
    row = bytes(width * 3 + 1)
    rows = b"".join(c.compress(row) for _ in range(height)) + c.flush()
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", rows)
            + _chunk(b"IEND", b""))
