"""The memory budget of data inputs, enforced on the bytes actually decoded.

Consumes paths and open streams; produces arrays, or a :class:`~mpsearch.errors.DataError`
naming the file, what it holds and the limit. An ``.npz`` is refused first by what its zip
directory and ``.npy`` headers declare, then read member by member with its own bounded
decompressors (deflate, bzip2, lzma or stored): every chunk of output is counted against one
running total and the archive's and the member's expansion ratio, so a zip that understates its
sizes stops at the budget, not after inflating a whole bzip2 block.
"""

from __future__ import annotations

import bz2
import lzma
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from mpsearch.errors import DataError

__all__ = ["CORRUPT", "LIMITS", "Budget", "Limits", "check_npz", "first_line", "npy_bytes",
           "read_npz", "unzip", "zip_members"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Input limits, checked before and while anything is decoded.

    ``data_bytes``: the memory budget of one data source: the decoded arrays of an
    .npz/.npy, the decoded images (with the working copy of the largest one) or what a reader
    returns (inside a process bound of 1 GiB, beside the model and its activations);
    ``npz_ratio``: once more than ``ratio_from`` bytes are decoded, an .npz (and each member)
    may expand at most this many times the compressed bytes read (``numpy.savez``,
    uncompressed, is never refused by it); ``image_pixels``: pixels of one image, read from its
    header before decoding; ``image_side``: largest ``size``/``crop`` an image option may ask
    for.
    """

    data_bytes: int = 512 << 20
    npz_ratio: float = 100.0
    ratio_from: int = 4 << 20
    image_pixels: int = 40_000_000
    image_side: int = 8192


LIMITS = Limits()
_RAW_CHUNK = 64 << 10
_OUT_CHUNK = 1 << 20
_LOCAL_HEADER = struct.Struct("<4sHHHHHLLLHH")
#: Most members a zip (an .npz or a zip of images) may list.
MAX_MEMBERS = 100_000
_MEMBER_ENTRY = 168  # directory bytes allowed per member (46 fixed, the rest its name)

#: What a truncated or corrupt .npz/.npy raises inside numpy and zipfile.
CORRUPT = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError,
           lzma.LZMAError)


class Budget:
    """The running count of decoded bytes of one data source against ``limits``."""

    def __init__(self, source: object, limits: Limits) -> None:
        self.source, self.limits, self.used = source, limits, 0

    def take(self, count: int, what: str) -> None:
        """Count ``count`` more bytes; :class:`DataError` past the budget."""
        self.used += int(count)
        if self.used > self.limits.data_bytes:
            raise DataError(
                f"{self.source}: {what} takes the data past {self.used / 2**20:.0f} MiB "
                f"decoded (memory budget {self.limits.data_bytes / 2**20:.0f} MiB); use a "
                "smaller data set, smaller images or a smaller 'size'")


def zip_members(path: Path, limit: int = MAX_MEMBERS) -> int:
    """The member count a zip's end record declares, read before :mod:`zipfile` builds an
    object per member (a 256 MB directory would take GBs); :class:`DataError` past ``limit``."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 65557))
        tail = f.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or at + 22 > len(tail):
            raise zipfile.BadZipFile("File is not a zip file")
        count, directory = struct.unpack("<HL", tail[at + 10:at + 16])
        if at >= 20 and tail[at - 20:at - 16] == b"PK\x06\x07":
            (record,) = struct.unpack("<Q", tail[at - 12:at - 4])  # the zip64 end record
            f.seek(record)
            head = f.read(48)
            if head[:4] == b"PK\x06\x06":
                count, directory = struct.unpack("<QQ", head[32:48])
    if count > limit or directory > limit * _MEMBER_ENTRY:  # zipfile reads the whole directory
        raise DataError(f"{path}: the zip lists {count} members in a {directory}-byte "
                        f"directory (limit {limit} members); pack fewer files")
    return int(count)


def check_npz(path: Path, limits: Limits) -> None:
    """Refuse an archive by its zip directory alone, before decompressing anything."""
    total = 0
    zip_members(path)
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            total += info.file_size
            if info.file_size > limits.ratio_from:
                _check_ratio(path, info.filename, info.file_size, info.compress_size, limits)
    if total > limits.data_bytes:
        raise DataError(f"{path}: the arrays take {total / 2**20:.0f} MiB (memory budget "
                        f"{limits.data_bytes / 2**20:.0f} MiB); use a smaller data set")


def _check_ratio(path: Path, name: str, decoded: int, packed: int, limits: Limits) -> None:
    ratio = decoded / max(1, packed)
    if ratio > limits.npz_ratio:
        raise DataError(
            f"{path}: member '{name}' expands {ratio:.0f}x to {decoded / 2**20:.0f} MiB (limit "
            f"{limits.npz_ratio:g}x): a zip bomb or degenerate data; save real data with "
            "numpy.savez (uncompressed)")


class _Member:
    """One zip member's decoded bytes, read through a bounded decompressor and counted."""

    def __init__(self, file: IO[bytes], info: zipfile.ZipInfo, path: Path, budget: Budget,
                 packed_total: list[int]) -> None:
        self.file, self.info, self.path, self.budget = file, info, path, budget
        self.packed_total = packed_total  # [compressed bytes read from the whole archive]
        file.seek(info.header_offset)
        fields = _LOCAL_HEADER.unpack(file.read(_LOCAL_HEADER.size))
        if fields[0] != b"PK\x03\x04":
            raise zipfile.BadZipFile(f"bad local header of member '{info.filename}'")
        if info.flag_bits & 0x1:
            raise DataError(f"{path}: member '{info.filename}' is encrypted; save the data "
                            "with numpy.savez")
        self.offset = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
        self.left = info.compress_size  # raw bytes this member may still read
        self.packed = self.decoded = 0
        self.done = False
        self.flow = self._decompressor(info.compress_type)

    def _decompressor(self, method: int) -> _Flow | None:
        if method == zipfile.ZIP_STORED:
            return None
        if method == zipfile.ZIP_DEFLATED:
            return _Flow(zlib.decompressobj(-15))
        if method == zipfile.ZIP_BZIP2:
            return _Flow(bz2.BZ2Decompressor())
        if method == zipfile.ZIP_LZMA:
            return _Flow(_zip_lzma(self._raw(4), self._raw))
        raise DataError(f"{self.path}: member '{self.info.filename}' uses zip compression "
                        f"method {method}; save the data with numpy.savez")

    def _raw(self, size: int) -> bytes:
        size = min(size, self.left)
        self.file.seek(self.offset + self.packed)
        data = self.file.read(size)
        self.packed += len(data)
        self.left -= len(data)
        self.packed_total[0] += len(data)
        return data

    def read(self, size: int) -> bytes:
        """Exactly ``size`` decoded bytes (fewer only at the member's end)."""
        parts, want = [], size
        while want > 0 and not self.done:
            chunk = self._next(min(want, _OUT_CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            want -= len(chunk)
        return b"".join(parts)

    def _next(self, size: int) -> bytes:
        if self.flow is None:  # stored: the raw bytes are the data
            out = self._raw(min(size, _RAW_CHUNK))
            self.done = not out
        else:
            out = self.flow.next(size, self._raw)
            self.done = self.flow.eof or (not out and self.left == 0)
        self._count(len(out))
        return out

    def _count(self, count: int) -> None:
        self.decoded += count
        name = self.info.filename
        self.budget.take(count, f"member '{name}'")
        limits = self.budget.limits
        if self.decoded > limits.ratio_from:
            _check_ratio(self.path, name, self.decoded, self.packed, limits)
        if self.budget.used > limits.ratio_from:
            _check_ratio(self.path, "(all members)", self.budget.used, self.packed_total[0],
                         limits)


class _Flow:
    """A zlib, bz2 or lzma decompressor driven with ``max_length``: never more output at once
    than asked for, whatever the input holds."""

    def __init__(self, decompressor: Any) -> None:
        self.d, self.tail, self.eof = decompressor, b"", False

    def next(self, size: int, raw: Callable[[int], bytes]) -> bytes:
        while True:
            if hasattr(self.d, "unconsumed_tail"):  # zlib
                data = self.d.unconsumed_tail or raw(_RAW_CHUNK)
                out = self.d.decompress(data, size) if data else self.d.flush(size)
            else:
                data = raw(_RAW_CHUNK) if self.d.needs_input else b""
                if not data and self.d.needs_input:
                    self.eof = self.d.eof
                    return b""
                out = self.d.decompress(data, size)
            self.eof = bool(self.d.eof)
            if out or self.eof or not data:
                return bytes(out)


def _zip_lzma(head: bytes, raw: Callable[[int], bytes]) -> Any:
    """The decompressor of a zip LZMA member (2-byte version, 2-byte properties size, LZMA1
    properties, then a raw stream), as :mod:`zipfile` builds it."""
    if len(head) < 4:
        raise EOFError("truncated lzma member")
    (size,) = struct.unpack("<H", head[2:4])
    props = raw(size)
    filt = lzma._decode_filter_properties(lzma.FILTER_LZMA1, props)  # type: ignore[attr-defined]
    return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[filt])


def read_npz(path: Path, limits: Limits) -> dict[str, np.ndarray]:
    """The arrays of an .npz, each member decoded in bounded chunks against the budget."""
    check_npz(path, limits)
    budget, packed = Budget(path, limits), [0]
    arrays: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as file:
        for info in archive.infolist():
            if info.is_dir():
                continue
            if not info.filename.endswith(".npy"):
                raise DataError(f"{path}: member '{info.filename}' is not an .npy array; keep "
                                "only arrays saved with numpy.savez in the archive")
            member = _Member(file, info, path, budget, packed)
            arrays[info.filename[:-4]] = _read_array(member, info, path, limits)
    return arrays


def unzip(path: Path, limits: Limits, target: Callable[[zipfile.ZipInfo], Path | None]
          ) -> int:
    """Unpack the members ``target`` maps to a file (None skips one), each decoded in bounded
    chunks against the budget and the ratio limits; the number of files written."""
    budget, packed, count = Budget(path, limits), [0], 0
    zip_members(path)
    with zipfile.ZipFile(path) as archive, open(path, "rb") as file:
        for info in archive.infolist():
            out = None if info.is_dir() else target(info)
            if out is None:
                continue
            member = _Member(file, info, path, budget, packed)
            with out.open("wb") as sink:
                while chunk := member.read(_OUT_CHUNK):
                    sink.write(chunk)
            count += 1
    return count


def _read_array(member: _Member, info: zipfile.ZipInfo, path: Path, limits: Limits
                ) -> np.ndarray:
    shape, fortran, dtype = _npy_header(member)
    if dtype.hasobject:
        raise DataError(f"{path}: member '{info.filename}' holds Python objects (dtype "
                        f"{dtype}); save numeric arrays only")
    declared = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    if declared > info.file_size:
        raise DataError(f"{path}: member '{info.filename}' declares {declared} bytes but holds "
                        f"{info.file_size}; the archive is corrupt, re-save it with numpy.savez")
    if member.budget.used + declared > limits.data_bytes:
        member.budget.take(declared, f"member '{info.filename}'")
    array = np.empty(shape[::-1] if fortran else shape, dtype=dtype)
    flat = array.reshape(-1).view(np.uint8)
    filled = 0
    while filled < declared:
        chunk = member.read(min(_OUT_CHUNK, declared - filled))
        if not chunk:
            raise EOFError(f"member '{info.filename}' ends after {filled} of {declared} bytes")
        flat[filled:filled + len(chunk)] = np.frombuffer(chunk, np.uint8)
        filled += len(chunk)
    if member.read(1):
        raise DataError(f"{path}: member '{info.filename}' holds more than its .npy header "
                        "declares; the archive is corrupt, re-save it with numpy.savez")
    return array.T if fortran else array


def _npy_header(stream: Any) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    version = np.lib.format.read_magic(stream)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read(stream, max_header_size=10_000)
    return tuple(int(d) for d in shape), bool(fortran), np.dtype(dtype)


def npy_bytes(stream: Any) -> int:
    """Bytes of the array an .npy stream's header declares."""
    shape, _, dtype = _npy_header(stream)
    return int(np.prod(shape, dtype=np.float64)) * int(dtype.itemsize)


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else "no detail"
