"""Atomic file output: every file mpsearch writes appears whole or not at all.

Writes go to a temporary file in the destination folder, are flushed, given the permissions a
plain ``open()`` would give (the umask read once at import, never changed) and renamed over
the destination.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:  # onnx costs the CLI ~0.6 s at start-up (ml_dtypes): typed, not imported
    import onnx

__all__ = ["atomic_write", "write_json", "write_model"]


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
