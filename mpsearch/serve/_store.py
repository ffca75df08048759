"""Uploads of ``mpsearch serve``: models, data and hardware profiles under the work directory.

Consumes uploaded byte streams (or a bundled file) and their client-side names; produces
:class:`Upload` records stored as ``WORKDIR/uploads/{kind}/{id}/`` with a generated id and a
fixed file name (``model.onnx``, ``data.npz``, ``images/``, ``profile.yaml``), so no client
name ever reaches the file system. Every upload is checked with the same API the CLI uses
(:func:`~mpsearch.graph.load_model`, :func:`~mpsearch.data.load_data` and
:func:`~mpsearch.data.check_signature`, :func:`~mpsearch.profiles.validate_profile_file`);
one that fails is deleted and raises :class:`UploadError` (one line, the stored path replaced
by the client's file name, plus the offending source line of a profile).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import shutil
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from mpsearch.errors import MpsearchError
from mpsearch.rundir import write_json

__all__ = ["KINDS", "Store", "Upload", "UploadError", "copy_limited", "new_id", "valid_id"]

logger = logging.getLogger(__name__)

KINDS = ("models", "data", "profiles")
_ID = re.compile(r"^[0-9a-f]{16}$")
_CHUNK = 1 << 20
_MAX_ZIP_MEMBERS = 100_000
_SAFE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._+-]{0,120}$")


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
        doc = json.loads(meta.read_text(encoding="utf-8"))
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
        from mpsearch import load_model, summarize

        shown = display_name(name, "model.onnx")
        upload_id, folder = self._new_dir("models")
        path = folder / "model.onnx"
        with _removed_on_failure(folder, shown):
            copy_limited(src, path, self.max_upload_bytes)
            summary = summarize(load_model(path)).to_dict()
            write_json(folder / "summary.json", summary)
        info = {"params": summary["params"], "flops": summary["flops"],
                "nodes": len(summary["nodes"]), "graph": summary["model"],
                "weight_bytes": summary["weight_bytes"], "file_bytes": path.stat().st_size}
        if bundled:
            info["bundled"] = bundled
        return self._commit("models", upload_id, shown, "model.onnx", info)

    def summary(self, model: Upload) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((model.path.parent / "summary.json").read_text())
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
        shown = display_name(name, "data.npz")
        upload_id, folder = self._new_dir("data")
        suffix = shown.lower().rpartition(".")[2]
        raw = folder / {"zip": "images.zip", "npy": "data.npy"}.get(suffix, "data.npz")
        target = folder / "data.npz"
        with _removed_on_failure(folder, shown):
            copy_limited(src, raw, self.max_upload_bytes)
            if suffix == "zip":
                _decode_zip(raw, folder / "images", target, dict(images or {}),
                            self.max_upload_bytes * 4)
            elif suffix == "npy":
                _npy_to_npz(raw, target, [str(i[0]) for i in self.summary(model)["inputs"]])
            info = _check_data(target, model)
        info["model"] = model.id
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


def _read_data(path: Path) -> Any:
    """:func:`mpsearch.load_data` (a damaged archive is already a one-line DataError there)."""
    from mpsearch import load_data

    return load_data(path)


def _npy_to_npz(raw: Path, target: Path, inputs: list[str]) -> None:
    """One ``.npy`` array as the ``.npz`` of a one-input model (keyed by the input's name)."""
    import numpy as np

    if len(inputs) != 1:
        raise UploadError(f"{raw}: a .npy file holds one array and the model has "
                          f"{len(inputs)} inputs ({', '.join(inputs)[:80]}); upload an .npz "
                          "with one array per input")
    dataset = _read_data(raw)
    (array,) = dataset.inputs.values()
    with target.open("wb") as f:
        np.savez(f, **{inputs[0]: array})
    raw.unlink()


def _check_data(path: Path, model: Upload) -> dict[str, Any]:
    from mpsearch import check_signature, load_model

    dataset = _read_data(path)
    check_signature(dataset, load_model(model.path))
    if len(dataset) < 2:
        raise UploadError(f"{path}: {len(dataset)} sample(s); need at least 2 to calibrate "
                          "and validate")
    return {"samples": len(dataset), "labels": _has_labels(dataset)}


def _has_labels(dataset: Any) -> bool:
    return getattr(dataset, "labels", None) is not None


def _decode_zip(archive: Path, folder: Path, target: Path, options: dict[str, Any],
                max_bytes: int) -> None:
    """Unpack ``archive`` into ``folder``, decode it as an image folder with ``options`` and
    save the arrays (and the labels of class sub-folders) as the ``.npz`` ``target``."""
    import numpy as np

    from mpsearch import ImageOptions, load_data

    _unzip_images(archive, folder, max_bytes)
    archive.unlink()
    root = folder
    while len(children := list(root.iterdir())) == 1 and children[0].is_dir():
        root = children[0]  # a zip of one top folder holding the images or class folders
    dataset = load_data(root, images=ImageOptions.from_dict(options))
    arrays: dict[str, Any] = dict(dataset.inputs)
    if dataset.labels is not None:
        arrays["labels"] = dataset.labels
    with target.open("wb") as f:
        np.savez(f, **arrays)
    shutil.rmtree(folder)


def _unzip_images(archive: Path, dest: Path, max_bytes: int) -> None:
    """Unpack image files only, keeping safe relative folders (class names); no traversal."""
    from mpsearch import IMAGE_SUFFIXES

    suffixes = tuple(sorted(IMAGE_SUFFIXES))
    try:
        with zipfile.ZipFile(archive) as zf:
            members = [m for m in zf.infolist() if not m.is_dir()]
            if len(members) > _MAX_ZIP_MEMBERS:
                raise UploadError(f"{archive}: {len(members)} files; at most "
                                  f"{_MAX_ZIP_MEMBERS} images per zip")
            if sum(m.file_size for m in members) > max_bytes:
                raise UploadError(f"{archive}: unpacks to more than {max_bytes / 1e6:.0f} MB; "
                                  "upload fewer or smaller images")
            count = 0
            for member in members:
                parts = PurePosixPath(member.filename.replace("\\", "/")).parts
                if not parts or parts[-1].startswith(".") or "__MACOSX" in parts:
                    continue
                if not parts[-1].lower().endswith(suffixes):
                    continue
                if any(not _SAFE_PART.match(p) for p in parts):
                    raise UploadError(f"{archive}: unsafe path '{member.filename}' in the zip; "
                                      "use plain folder and file names")
                out = dest.joinpath(*parts)
                out.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(member) as f, out.open("wb") as o:
                    shutil.copyfileobj(f, o, _CHUNK)
                count += 1
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise UploadError(f"{archive}: not a readable zip file ({e}); upload a .zip of images "
                          "or an .npz") from e
    if count == 0:
        raise UploadError(f"{archive}: no images ({', '.join(suffixes)}) in the zip")


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
