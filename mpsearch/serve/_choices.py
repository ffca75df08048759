"""What the pages of ``mpsearch serve`` offer to choose, and what a choice means.

Consumes the upload store and the bundled files; produces the choices of the model page (the
hardware profiles, the data: the demo's first, nothing foreign preselected), their resolution
into what the pipeline loads (a profile name or path, a data upload), the confirmation of an
upload, and a finished or stopped search's results (the front, or the partial front of its
study journal, with the sizes of the files exported so far).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mpsearch.rundir import RunDir, read_json
from mpsearch.serve._jobs import ACTIVE, FINISHED, Job
from mpsearch.serve._progress import pareto, read_journal
from mpsearch.serve._store import Store, Upload, UploadError

__all__ = ["Choices", "bundled_files", "demo_names"]

DEMO = Path(__file__).parent.parent / "demo"


def demo_names() -> tuple[str, ...]:
    """The bundled demo's files (the rest of :func:`bundled_files` are test fixtures)."""
    return tuple(sorted(p.name for p in DEMO.glob("*.onnx")) +
                 sorted(p.name for p in DEMO.glob("*.npz")))


def bundled_files() -> tuple[dict[str, Path], dict[str, Path]]:
    """(models, data) shipped with mpsearch: the demo, and the test fixtures of a checkout."""
    demo = DEMO
    fixtures = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
    models = {p.name: p for p in sorted(demo.glob("*.onnx"))}
    data = {p.name: p for p in sorted(demo.glob("*.npz"))}
    if fixtures.is_dir():
        models |= {p.name: p for p in sorted(fixtures.glob("*.onnx")) if p.name not in models}
        data |= {p.name: p for p in sorted(fixtures.glob("*.npz")) if p.name not in data}
    return models, data


class Choices:
    """The choices of one work directory's uploads (see the module doc)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def profiles(self) -> list[tuple[str, str]]:
        from mpsearch import list_profiles

        shipped = [(f"shipped:{n}", n) for n in list_profiles()]
        uploaded = [(f"upload:{u.id}", f"{u.info.get('profile')} (uploaded {u.name})")
                    for u in self.store.list("profiles")]
        return shipped + uploaded

    def resolve_profile(self, ref: str) -> tuple[str, str]:
        """A profile choice -> (what load_profile takes, a label)."""
        from mpsearch import list_profiles

        kind, _, name = ref.partition(":")
        if not ref:
            raise UploadError("choose a hardware profile")
        if kind == "shipped" and name in list_profiles():
            return name, name
        if kind == "upload":
            upload = self.store.get("profiles", name)
            return str(upload.path), str(upload.info.get("profile", upload.name))
        raise UploadError(f"profile '{ref[:60]}' is neither a shipped profile nor an upload; "
                          "pick one from the list")

    def data(self, model: Upload) -> list[tuple[str, str]]:
        """The data the job form offers for ``model``: its own uploads, then the data bundled
        with it (the demo's for the demo, the test fixtures' for a test fixture, none for
        a model of the user's); nothing is preselected that was not made for the model."""
        own = [(u.id, f"{u.name} ({u.info.get('samples')} samples"
                f"{', labels' if u.info.get('labels') else ''})")
               for u in self.store.list("data") if u.info.get("model") == model.id]
        kind = model.info.get("bundled")
        demo = set(demo_names())
        if kind == "demo":
            bundled = [(f"bundled:{n}", f"bundled {n} (the demo's data)")
                       for n in sorted(bundled_files()[1]) if n in demo]
        elif kind == "test fixture":
            bundled = [(f"bundled:{n}", f"bundled {n} (test fixture)")
                       for n in sorted(bundled_files()[1]) if n not in demo]
        else:
            bundled = []
        if own or kind == "demo":
            return own + bundled
        return [("", "upload data in step 3 first"), *bundled]

    def opened(self, source: Path, label: str) -> Upload | None:
        """The copy of the bundled model ``source`` already opened, if any (same name, kind
        and file size): opening it again reuses it."""
        size = source.stat().st_size
        return next((m for m in self.store.list("models")
                     if m.info.get("bundled") == label and m.name == source.name
                     and m.info.get("file_bytes") == size), None)

    def resolve_data(self, ref: str, model: Upload) -> Upload:
        if not ref:
            raise UploadError("choose the data in step 3: upload an .npz, a .npy or a .zip of "
                              "images the model reads")
        if ref.startswith("bundled:"):
            source = bundled_files()[1].get(ref.removeprefix("bundled:"))
            if source is None:
                raise UploadError(f"no bundled data '{ref[8:60]}'")
            return self.store.add_bundled("data", source, source.name, model)
        upload = self.store.get("data", ref)
        if upload.info.get("model") != model.id:
            raise UploadError("that data was checked against another model; upload it again "
                              "for this one")
        return upload

    def notice(self, kind: str, query: Mapping[str, str]) -> str | None:
        """The confirmation of an upload that just happened (``?uploaded=data|profile``)."""
        try:
            if kind == "data":
                data = self.store.get("data", query.get("data", ""))
                labels = ", with labels" if data.info.get("labels") else ", no labels"
                return (f"Uploaded {data.name}: {data.info.get('samples')} samples{labels}, "
                        "checked against the model; it is selected in step 4.")
            if kind == "profile":
                ref = query.get("profile", "")
                profile = self.store.get("profiles", ref.removeprefix("upload:"))
                return (f"Uploaded the profile {profile.info.get('profile')} "
                        f"({profile.name}); it is selected.")
        except UploadError:
            return None
        return None

    def results(self, job: Job, run_dir: Path) -> dict[str, Any]:
        """A stopped search's front (finished) or partial front (cancelled, failed,
        interrupted: the journal's trials), its trial count and the files' sizes."""
        out: dict[str, Any] = {"front": None, "partial": None, "trials_done": 0, "files": {},
                               "fp32_file": None}
        if job.kind != "search" or job.state in ACTIVE:
            return out
        run = RunDir(run_dir)
        points, finished = read_journal(run.journal)
        out["trials_done"] = finished
        front = read_json(run.front_json) if job.state in FINISHED else None
        if isinstance(front, dict):
            out["front"] = front
            out["files"] = {int(m.group(1)): p.stat().st_size
                            for p in (run.path / "exports").glob("point-*.onnx")
                            if (m := re.fullmatch(r"point-([0-9]{1,6})\.onnx", p.name))}
        elif finished:
            out["partial"] = {"trials_done": finished, "points": [list(p) for p in points],
                              "front": [list(p) for p in pareto(points, job.higher_is_better)]}
        with contextlib.suppress(UploadError, OSError):
            out["fp32_file"] = self.store.get("models", job.model).path.stat().st_size
        return out
