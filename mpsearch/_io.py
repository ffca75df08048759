"""Atomic file output: every file mpsearch writes appears whole or not at all.

Writes go to a temporary file in the destination folder, are flushed, given the permissions a
plain ``open()`` would give (umask applied) and renamed over the destination.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import onnx

__all__ = ["atomic_write", "write_json", "write_model"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike[str], payload: bytes | Callable[[BinaryIO], Any]
                 ) -> None:
    """Write ``payload`` (bytes, or a function writing to a binary file) to ``path`` atomically."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as f:
            if isinstance(payload, bytes):
                f.write(payload)
            else:
                payload(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """JSON, atomically; non-finite floats become null (JSON has no NaN or infinity)."""
    atomic_write(path, json.dumps(_finite(data), indent=2).encode())


def write_model(path: str | os.PathLike[str], model: onnx.ModelProto) -> None:
    """An ONNX model, atomically, serialized deterministically."""
    atomic_write(path, model.SerializeToString(deterministic=True))
