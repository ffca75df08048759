"""File input and output under one budget: every file mpsearch reads whole is read through
:func:`read_bytes` (a size cap, checked while reading, so an endless ``/dev/zero`` stops at it),
and every file it writes appears whole or not at all.

Reads of a run directory's own files follow no symbolic link and take regular files only.
JSON is parsed by :func:`load_json`: its memory is estimated from its text before parsing, its
nesting bounded and a non-finite number refused, naming the field (mpsearch writes none).
Writes go to a temporary file in the destination folder, are flushed, given the permissions a
plain ``open()`` would give (the umask read once at import, never changed) and renamed over
the destination.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:  # onnx costs the CLI ~0.6 s at start-up (ml_dtypes): typed, not imported
    import onnx

__all__ = ["JSON_DEPTH", "JSON_MEMORY", "READ_LIMIT", "atomic_write", "check_json",
           "load_json", "parse_json", "read_bytes", "read_text", "write_json", "write_model"]

#: Bytes of any one file read whole (a spec, an assignment, a run directory's JSON).
READ_LIMIT = 256 << 20
#: Memory a parsed JSON document may take, as estimated from its text before parsing.
JSON_MEMORY = 384 << 20
#: How deep JSON arrays and objects may nest (mpsearch writes at most a few levels).
JSON_DEPTH = 64
_CHUNK = 1 << 20
#: Bytes of Python objects one JSON value may take beyond its text (a list, dict or float).
_VALUE_COST = 100


def _read_umask() -> int:
    """The process umask, read once at import. Linux shows it in ``/proc/self/status``; elsewhere
    ``os.umask`` must set it to read it, a process-wide change (briefly, once, at import)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_read_umask()


def atomic_write(path: str | os.PathLike[str], payload: bytes | Callable[[BinaryIO], Any]
                 ) -> None:
    """Write ``payload`` (bytes, or a function writing to a binary file) to ``path`` atomically."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        _write(handle, tmp, target, payload)
    except OSError as e:  # a full disk or a quota: name the file, not the temporary one
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None or e.filename == tmp:
            raise OSError(e.errno, e.strerror, str(target)) from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write(handle: int, tmp: str, target: Path,
           payload: bytes | Callable[[BinaryIO], Any]) -> None:
    """Fill the temporary file ``tmp`` (open as ``handle``), then rename it to ``target``."""
    with os.fdopen(handle, "wb") as f:
        if isinstance(payload, bytes):
            f.write(payload)
        else:
            payload(f)
        f.flush()
        os.fchmod(f.fileno(), _FILE_MODE)
        os.fsync(f.fileno())
    os.replace(tmp, target)


def json_finite(value: Any) -> Any:
    """``value`` with every non-finite float (at any depth) as None: the one rule by which
    mpsearch writes NaN and infinity to JSON, which has neither."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_finite(v) for v in value]
    return value


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """JSON, atomically; non-finite floats become null (:func:`json_finite`)."""
    atomic_write(path, json.dumps(json_finite(data), indent=2).encode())


def write_model(path: str | os.PathLike[str], model: onnx.ModelProto) -> None:
    """An ONNX model, atomically, serialized deterministically."""
    atomic_write(path, model.SerializeToString(deterministic=True))


def read_bytes(path: str | os.PathLike[str], error: type[Exception], *,
               limit: int = READ_LIMIT, links: bool = True, fix: str = "") -> bytes:
    """The bytes of ``path``, at most ``limit`` of them: ``error`` (one line naming the file)
    past it, counted while reading, so a pipe or a device that never ends stops there.
    ``links=False`` (a run directory's own files): a symbolic link or anything but a regular
    file is refused. A missing file raises FileNotFoundError for the caller to word.
    ``fix`` ends the messages (what the user should do)."""
    name = os.fspath(path)
    fix = fix or "check the path"
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if links else os.O_NOFOLLOW)
    try:
        fd = os.open(name, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP and not links:
            raise error(f"{name}: is a symbolic link, which mpsearch does not follow inside a "
                        f"run directory; {fix}") from e
        raise error(f"{name}: cannot read the file ({e.strerror}); {fix}") from e
    with os.fdopen(fd, "rb", buffering=0) as f:
        info = os.fstat(fd)
        regular = stat.S_ISREG(info.st_mode)
        if not regular and not links:
            raise error(f"{name}: is not a regular file; {fix}")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        if regular and info.st_size > limit:
            raise error(_too_big(name, info.st_size, limit, fix))
        parts, size = [], 0
        try:
            while size <= limit:
                chunk = f.read(min(_CHUNK, limit + 1 - size))
                if not chunk:
                    break
                parts.append(chunk)
                size += len(chunk)
        except OSError as e:
            raise error(f"{name}: cannot read the file ({e.strerror}); {fix}") from e
    if size > limit:
        raise error(_too_big(name, None, limit, fix))
    return b"".join(parts)


def _too_big(name: str, size: int | None, limit: int, fix: str) -> str:
    held = "it reads on past the limit" if size is None else f"{size / 2**20:.3g} MiB"
    return (f"{name}: the file is larger than mpsearch reads ({held}, limit "
            f"{limit / 2**20:.3g} MiB); {fix}")


def read_text(path: str | os.PathLike[str], error: type[Exception], *,
              limit: int = READ_LIMIT, links: bool = True, fix: str = "") -> str:
    """:func:`read_bytes` decoded as UTF-8; ``error`` naming the line of a byte that is not."""
    data = read_bytes(path, error, limit=limit, links=links, fix=fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(f"{os.fspath(path)}:{line}: byte {data[e.start]:#04x} is not UTF-8; save "
                    "the file as UTF-8") from e


def load_json(path: str | os.PathLike[str], error: type[Exception], *,
              limit: int = READ_LIMIT, links: bool = True, fix: str = "") -> Any:
    """The JSON value of ``path``, read by :func:`read_bytes` and parsed by
    :func:`parse_json`."""
    data = read_bytes(path, error, limit=limit, links=links, fix=fix)
    return parse_json(data, os.fspath(path), error, fix=fix)


def parse_json(data: bytes, where: str, error: type[Exception], *, fix: str = "",
               memory: int = JSON_MEMORY, finite: bool = True) -> Any:
    """Parse JSON text, ``error`` (naming ``where``) when it is not JSON, would take more than
    ``memory`` bytes as Python objects (estimated from its separators first), nests deeper
    than :data:`JSON_DEPTH` or (``finite``) holds a non-finite number. ``finite`` False is for
    files another library writes with them (Optuna's journal: an infinite SQNR attribute)."""
    fix = fix or "fix or delete the file"
    values = sum(data.count(c) for c in (b",", b":", b"[", b"{")) + 1
    estimate = 3 * len(data) + _VALUE_COST * values
    if estimate > memory:
        raise error(f"{where}: {len(data) / 2**20:.0f} MiB of JSON holding up to {values} "
                    f"values would take about {estimate / 2**20:.0f} MiB to load (limit "
                    f"{memory / 2**20:.0f} MiB); {fix}")
    try:
        value = json.loads(data)
    except RecursionError as e:
        raise error(f"{where}: arrays and objects nest deeper than {JSON_DEPTH} levels; "
                    f"{fix}") from e
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise error(f"{where}: not valid JSON ({str(e).splitlines()[0][:120]}); {fix}") from e
    check_json(value, where, error, fix=fix, finite=finite)
    return value


def check_json(value: Any, where: str, error: type[Exception], *, fix: str = "",
               finite: bool = True) -> None:
    """``error`` naming the field when ``value`` nests deeper than :data:`JSON_DEPTH` or
    (``finite``) holds a non-finite float (JSON's ``NaN``, ``Infinity``, or ``1e999``)."""
    fix = fix or "fix or delete the file"
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, field, depth = stack.pop()
        if finite and isinstance(item, float) and not math.isfinite(item):
            raise error(f"{where}: field '{field or '(top level)'}' is {item}, a number JSON "
                        f"does not have (mpsearch writes none); {fix}")
        children = (item.items() if isinstance(item, dict)
                    else enumerate(item) if isinstance(item, list) else ())
        for key, child in children:
            if isinstance(child, (dict, list, float)):
                if depth + 1 > JSON_DEPTH:
                    raise error(f"{where}: arrays and objects nest deeper than {JSON_DEPTH} "
                                f"levels; {fix}")
                name = f"{field}[{key}]" if isinstance(key, int) else \
                    f"{field}.{key}" if field else str(key)
                stack.append((child, name[:200], depth + 1))
