"""Uploads of ``mpsearch serve``: models, data and hardware profiles under the work directory.

Consumes uploaded byte streams (or a bundled file) and their client-side names; produces
:class:`Upload` records stored as ``WORKDIR/uploads/{kind}/{id}/`` with a generated id and a
fixed file name (``model.onnx``, ``data.npz``, ``images/``, ``profile.yaml``), so no client
name ever reaches the file system. Every upload is checked with the same API the CLI uses
(:func:`~mpsearch.graph.load_model`, :func:`~mpsearch.data.load_data` and
:func:`~mpsearch.data.check_signature`, :func:`~mpsearch.profiles.validate_profile_file`);
models and data are loaded in a worker process with a memory limit (:func:`_elsewhere`), so
what an upload expands to never grows the server;
one that fails is deleted and raises :class:`UploadError` (one line, the stored path replaced
by the client's file name, plus the offending source line of a profile).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from mpsearch.errors import MpsearchError
from mpsearch.rundir import load_json, write_json

__all__ = ["KINDS", "Store", "Upload", "UploadError", "copy_limited", "new_id", "valid_id"]

logger = logging.getLogger(__name__)

KINDS = ("models", "data", "profiles")
_ID = re.compile(r"^[0-9a-f]{16}$")
_CHUNK = 1 << 20
_DECODE_TIMEOUT_S = 600.0
#: Address space of the process that decodes one data upload: the data memory budget
#: (:data:`mpsearch._data_limits.LIMITS`) plus what Python, NumPy, Pillow and ONNX map on
#: their own.
UPLOAD_MEMORY = (2 << 30) + (1536 << 20)
#: Uploads decoded at once (each in its own worker process); the rest wait.
MAX_DECODERS = 2
_DECODERS = threading.BoundedSemaphore(MAX_DECODERS)


class UploadError(MpsearchError):
    """An upload was rejected; ``source_line`` is the offending line of a profile, if known."""

    def __init__(self, message: str, *, line: int | None = None,
                 source_line: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.line = line
        self.source_line = source_line
        self.status = status


@dataclass(frozen=True, slots=True, kw_only=True)
class Upload:
    """One stored upload: ``path`` is the file (or image folder) the pipeline reads."""

    id: str
    kind: str
    name: str
    path: Path
    created: str
    info: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "name": self.name, "created": self.created,
                "info": dict(self.info)}


@contextmanager
def _removed_on_failure(folder: Path, shown: str, source: Path | None = None
                        ) -> Iterator[None]:
    """Delete an upload's folder if storing or checking it fails (nothing left behind); user
    errors name the client's file instead of the stored path (quoting ``source``'s line)."""
    try:
        yield
    except MpsearchError as e:
        error = _renamed(e, folder, shown, source=source)  # reads source before it is deleted
        shutil.rmtree(folder, ignore_errors=True)
        raise error from e
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def new_id() -> str:
    """A fresh random id (16 hex digits): the only name an upload or job gets on disk."""
    return secrets.token_hex(8)


def valid_id(value: str) -> bool:
    return bool(_ID.match(value))


def display_name(name: str | None, default: str) -> str:
    """The client's file name for display only: last path part, printable, at most 120 chars."""
    base = PurePosixPath((name or "").replace("\\", "/")).name
    clean = "".join(c for c in base if c.isprintable()).strip()
    return clean[:120] or default


def copy_limited(src: BinaryIO, dest: Path, limit: int) -> int:
    """Copy ``src`` to ``dest`` in chunks; :class:`UploadError` (413) past ``limit`` bytes."""
    total = 0
    with dest.open("wb") as out:
        while chunk := src.read(_CHUNK):
            total += len(chunk)
            if total > limit:
                raise UploadError(f"upload too large: more than {limit / 1e6:.1f} MB; restart "
                                  "`mpsearch serve` with a larger --max-upload-mb", status=413)
            out.write(chunk)
    if total == 0:
        raise UploadError("the uploaded file is empty; choose a file")
    return total


class Store:
    """The uploads folder of one work directory (thread-safe: every upload has its own dir)."""

    def __init__(self, workdir: Path, *, max_upload_bytes: int) -> None:
        self.root = workdir / "uploads"
        self.max_upload_bytes = max_upload_bytes
        for kind in KINDS:
            (self.root / kind).mkdir(parents=True, exist_ok=True)

    # -- records -------------------------------------------------------------------------
    def get(self, kind: str, upload_id: str) -> Upload:
        """The upload ``upload_id`` of ``kind``; :class:`UploadError` (404) if there is none."""
        meta = self.root / kind / upload_id / "meta.json" if valid_id(upload_id) else None
        if kind not in KINDS or meta is None or not meta.is_file():
            raise UploadError(f"no {kind[:-1] if kind != 'data' else 'data'} upload "
                              f"'{upload_id}' in this work directory", status=404)
        doc = load_json(meta, UploadError, links=False, limit=1 << 20)
        return Upload(id=upload_id, kind=kind, name=doc["name"], created=doc["created"],
                      path=meta.parent / doc["file"], info=doc.get("info", {}))

    def list(self, kind: str) -> tuple[Upload, ...]:
        """Uploads of ``kind``, newest first."""
        found = [self.get(kind, p.name) for p in (self.root / kind).iterdir()
                 if valid_id(p.name) and (p / "meta.json").is_file()]
        return tuple(sorted(found, key=lambda u: u.created, reverse=True))

    def _commit(self, kind: str, upload_id: str, name: str, file: str,
                info: Mapping[str, Any]) -> Upload:
        created = datetime.now(timezone.utc).isoformat(timespec="microseconds")
        write_json(self.root / kind / upload_id / "meta.json",
                   {"name": name, "file": file, "created": created, "info": dict(info)})
        return self.get(kind, upload_id)

    def _same(self, kind: str, name: str, digest: str,
              also: Callable[[Upload], bool]) -> Upload | None:
        """An earlier upload of ``kind`` with the same name and bytes (and ``also``)."""
        return next((u for u in self.list(kind) if u.name == name
                     and u.info.get("sha256") == digest and also(u)), None)

    def _new_dir(self, kind: str) -> tuple[str, Path]:
        upload_id = new_id()
        folder = self.root / kind / upload_id
        folder.mkdir(parents=True)
        return upload_id, folder

    # -- models --------------------------------------------------------------------------
    def add_model(self, src: BinaryIO, name: str | None, bundled: str | None = None
                  ) -> Upload:
        """Store and load an ONNX model; its summary is saved beside it (``bundled``: which
        kind of bundled model it is, "demo" or "test fixture")."""
        shown = display_name(name, "model.onnx")
        upload_id, folder = self._new_dir("models")
        path = folder / "model.onnx"
        with _removed_on_failure(folder, shown):
            copy_limited(src, path, self.max_upload_bytes)
            digest = _sha256(path)
            same = self._same("models", shown, digest, lambda u: True)
            if same is not None:  # the same file under the same name: one entry
                shutil.rmtree(folder, ignore_errors=True)
                return same
            info = _elsewhere("model", {"path": str(path),
                                        "summary": str(folder / "summary.json")})
        info["file_bytes"] = path.stat().st_size
        info["sha256"] = digest
        if bundled:
            info["bundled"] = bundled
        return self._commit("models", upload_id, shown, "model.onnx", info)

    def summary(self, model: Upload) -> dict[str, Any]:
        doc: dict[str, Any] = load_json(model.path.parent / "summary.json", UploadError,
                                        links=False)
        return doc

    # -- profiles ------------------------------------------------------------------------
    def add_profile(self, src: BinaryIO, name: str | None) -> Upload:
        """Store and validate a hardware profile YAML (it may extend a shipped profile)."""
        from mpsearch import validate_profile_file

        shown = display_name(name, "profile.yaml")
        upload_id, folder = self._new_dir("profiles")
        path = folder / "profile.yaml"
        with _removed_on_failure(folder, shown, source=path):
            copy_limited(src, path, min(self.max_upload_bytes, 1 << 20))
            profile = validate_profile_file(path)
        return self._commit("profiles", upload_id, shown, "profile.yaml",
                            {"profile": profile.name, "formats": list(profile.formats)})

    # -- data ----------------------------------------------------------------------------
    def add_data(self, src: BinaryIO, name: str | None, model: Upload,
                 images: Mapping[str, Any] | None = None, bundled: bool = False) -> Upload:
        """Store ``.npz`` data (or one ``.npy`` array for a one-input model), or decode a zip
        of images with ``images`` (the fields of :class:`~mpsearch.data.ImageOptions`) into
        one, and check it against ``model``."""
        from mpsearch import ImageOptions

        shown = display_name(name, "data.npz")
        upload_id, folder = self._new_dir("data")
        suffix = shown.lower().rpartition(".")[2]
        kind = suffix if suffix in ("zip", "npy") else "npz"
        raw = folder / {"zip": "images.zip", "npy": "data.npy"}.get(kind, "data.npz")
        target = folder / "data.npz"
        with _removed_on_failure(folder, shown):
            if kind == "zip":
                ImageOptions.from_dict(images or {})  # a bad option is refused before upload
            copy_limited(src, raw, self.max_upload_bytes)
            digest = _sha256(raw)
            same = self._same("data", shown, digest, lambda u: u.info.get("model") == model.id
                              and u.info.get("images", {}) == dict(images or {}
                                                                   if kind == "zip" else {}))
            if same is not None:  # the same file for the same model: one entry
                shutil.rmtree(folder, ignore_errors=True)
                return same
            info = _elsewhere("data", {"raw": str(raw), "target": str(target), "kind": kind,
                                       "images": dict(images or {}),
                                       "model": str(model.path)})
            if raw != target:
                raw.unlink()
        info["model"] = model.id
        info["sha256"] = digest
        if bundled:
            info["bundled"] = shown
        if suffix == "zip":
            info["images"] = dict(images or {})
        return self._commit("data", upload_id, shown, target.name, info)

    def add_bundled(self, kind: str, source: Path, name: str,
                    model: Upload | None = None, label: str = "bundled") -> Upload:
        """Copy a bundled model or data file in as if uploaded (checked the same way); bundled
        data already copied for ``model`` is reused."""
        if kind == "data" and model is not None:
            for upload in self.list("data"):
                if upload.info.get("model") == model.id and upload.info.get("bundled") == name:
                    return upload
        with source.open("rb") as f:
            if kind == "models":
                return self.add_model(f, name, bundled=label)
            if model is None:
                raise UploadError("choose a model before its data")
            return self.add_data(f, name, model, bundled=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _elsewhere(mode: str, request: dict[str, Any]) -> dict[str, Any]:
    """Decode an upload in a worker process under :data:`UPLOAD_MEMORY` bytes of address
    space (:func:`mpsearch.serve._worker.decode_upload` for ``data``,
    :func:`~mpsearch.serve._worker.summarize_upload` for ``model``): however the upload
    expands, only that process grows, and it ends with the request. At most
    :data:`MAX_DECODERS` run at once; other uploads wait their turn."""
    from mpsearch.serve._worker import worker_command

    request = {**request, "memory": UPLOAD_MEMORY}
    raw = request.get("raw", request.get("path"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    try:
        with _DECODERS:
            done = subprocess.run(worker_command(mode, json.dumps(request)),
                                  capture_output=True, timeout=_DECODE_TIMEOUT_S, env=env,
                                  check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise UploadError(f"{raw}: decoding took over {_DECODE_TIMEOUT_S:.0f} s; upload less "
                          "data or smaller images", status=413) from e
    errors = [line.removeprefix("mpsearch: error: ") for line in
              done.stderr.decode(errors="replace").splitlines()
              if line.startswith("mpsearch: error: ")]
    if done.returncode == 0:
        info: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
        return info
    if errors:
        status = 413 if "an upload may use" in errors[-1] else 400
        raise UploadError(errors[-1], status=status)
    logger.warning("data decoder stopped with status %s: %s", done.returncode,
                   done.stderr.decode(errors="replace")[-2000:])
    raise UploadError(f"{raw}: decoding it stopped the decoder (status {done.returncode}); the "
                      "file is damaged or needs more memory than an upload may use", status=413)


def _renamed(error: MpsearchError, folder: Path, shown: str,
             source: Path | None = None) -> UploadError:
    """``error`` with every stored path under ``folder`` replaced by the client's file name;
    for a profile, the offending line of ``source`` attached."""
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    for form in dict.fromkeys((str(folder.resolve()), str(folder))):
        message = re.sub(re.escape(form) + r"(/[^\s:'\"]*)?", lambda _: shown, message)
    status = error.status if isinstance(error, UploadError) else 400
    line = source_line = None
    match = re.match(rf"^{re.escape(shown)}:(\d+):", message)
    if source is not None and match:
        line = int(match.group(1))
        try:
            lines = source.read_text(encoding="utf-8", errors="replace").splitlines()
            source_line = lines[line - 1] if 0 < line <= len(lines) else None
        except OSError:
            source_line = None
    return UploadError(message, line=line, source_line=source_line, status=status)
