"""``storage:`` touches only what the run owns: a new journal file, an existing Optuna journal
(every complete line a record) or a database; never any other file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import optuna
import pytest

from mpsearch.errors import SearchError
from mpsearch.search._storage import _storage


def _journal_with_a_trial(path: Path) -> None:
    storage = _storage(str(path), path.parent / "run")
    study = optuna.create_study(study_name="s", storage=storage)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_new_journal_file_outside_the_run_is_created(tmp_path: Path) -> None:
    path = tmp_path / "shared.journal"
    _journal_with_a_trial(path)
    trials = optuna.load_study(study_name="s", storage=_storage(str(path), tmp_path)).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2


def test_an_existing_journal_is_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "shared.journal"
    _journal_with_a_trial(path)
    study = optuna.load_study(study_name="s", storage=_storage(str(path), tmp_path))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert len(optuna.load_study(study_name="s", storage=_storage(str(path), tmp_path)
                                 ).trials) == 3


def test_a_journal_holding_infinite_attributes_is_appended_to(tmp_path: Path) -> None:
    """Optuna writes a non-finite attribute as JSON's Infinity (a search's SQNR of a
    configuration identical to FP32): still one of its records, not a foreign line."""
    path = tmp_path / "shared.journal"
    study = optuna.create_study(study_name="s", storage=_storage(str(path), tmp_path / "run"))

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("sqnr", float("inf"))
        return trial.suggest_float("x", 0, 1)

    study.optimize(objective, n_trials=2)
    assert b"Infinity" in path.read_bytes()
    again = optuna.load_study(study_name="s", storage=_storage(str(path), tmp_path / "run"))
    again.optimize(objective, n_trials=1)
    assert [t.user_attrs["sqnr"] for t in again.trials] == [float("inf")] * 3


@pytest.mark.parametrize("content", [b"my notes\nline two", b"{\"a\": 1}\n", b"\x00" * 64,
                                     b"#!/bin/sh\necho hi\n"])
def test_a_file_that_is_not_a_journal_is_refused_untouched(content: bytes,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(SearchError, match="not an Optuna journal \\(its first line is not a "
                                          "journal record\\)"):
        _storage(str(path), tmp_path / "run")
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no lock file either


def test_a_junk_line_inside_a_journal_is_named(tmp_path: Path) -> None:
    path = tmp_path / "shared.journal"
    _journal_with_a_trial(path)
    lines = path.read_bytes().split(b"\n")
    lines.insert(3, b"junk")
    path.write_bytes(b"\n".join(lines))
    before = _digest(path)
    with pytest.raises(SearchError, match=f"{path.name}:4: not an Optuna journal record"):
        _storage(str(path), tmp_path)
    assert _digest(path) == before


def test_a_torn_last_record_is_dropped_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "shared.journal"
    _journal_with_a_trial(path)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"op_code":4,"worker_id":"w","tri')
    study = optuna.load_study(study_name="s", storage=_storage(str(path), tmp_path))
    assert len(study.trials) == 2
    assert path.read_bytes() == whole


def test_a_directory_or_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SearchError, match="not a regular file"):
        _storage(str(tmp_path), tmp_path / "run")
    with pytest.raises(SearchError, match="not a regular file"):
        _storage("/dev/null", tmp_path / "run")


def test_a_journal_in_a_missing_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SearchError, match="the folder .* does not exist"):
        _storage(str(tmp_path / "nowhere" / "x.journal"), tmp_path / "run")
    assert not (tmp_path / "nowhere").exists()


def test_an_empty_file_becomes_a_journal(tmp_path: Path) -> None:
    path = tmp_path / "empty.journal"
    path.write_bytes(b"")
    _journal_with_a_trial(path)
    assert path.read_bytes().startswith(b'{"op_code":')


@pytest.mark.parametrize("content", [b"{", b'{"op_code":', b'{"op_code": 0, "worker_id": "w"}'])
def test_a_prefix_of_a_record_is_not_a_journal(content: bytes, tmp_path: Path) -> None:
    """A file holding only the start of a record (or a record with no line end) was not written
    by Optuna: refused, byte-identical, whether named by storage: or in the run directory."""
    path = tmp_path / "x.journal"
    path.write_bytes(content)
    with pytest.raises(SearchError, match="its first line is not a journal record"):
        _storage(str(path), tmp_path / "run")
    own = tmp_path / "run" / "study.journal"
    own.parent.mkdir()
    own.write_bytes(content)
    with pytest.raises(SearchError, match="its first line is not a journal record"):
        _storage(None, own)
    assert path.read_bytes() == content and own.read_bytes() == content


def test_a_link_as_the_run_journal_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.journal"
    _journal_with_a_trial(elsewhere)
    before = _digest(elsewhere)
    own = tmp_path / "run" / "study.journal"
    own.parent.mkdir()
    own.symlink_to(elsewhere)
    with pytest.raises(SearchError, match="study.journal: is a symbolic link, which mpsearch "
                                          "does not follow inside a run directory"):
        _storage(None, own)
    assert _digest(elsewhere) == before


def _sqlite_with(path: Path, sql: str) -> None:
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute(sql)
    db.close()


def test_another_programs_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    _sqlite_with(path, "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    before = _digest(path)
    with pytest.raises(SearchError, match=r"app\.db: the database holds another program's "
                                          r"tables \(notes\) and not Optuna's"):
        _storage(f"sqlite:///{path}", tmp_path / "run")
    assert _digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def test_an_empty_or_optuna_database_is_used(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=_storage(url, tmp_path))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    again = optuna.load_study(study_name="s", storage=_storage(url, tmp_path))  # Optuna's
    assert len(again.trials) == 1


def test_a_relative_storage_path_resolves_beside_the_spec(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    from mpsearch.spec import load_spec

    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "a.yaml").write_text("model: m.onnx\nprofile: x86_ort\ndata: {source: d.npz}\n"
                                   "storage: shared.journal\n")
    (folder / "b.yaml").write_text("model: m.onnx\nprofile: x86_ort\ndata: {source: d.npz}\n"
                                   "storage: sqlite:///study.db\n")
    monkeypatch.chdir(tmp_path)
    assert load_spec(folder / "a.yaml").storage == str(folder.resolve() / "shared.journal")
    assert load_spec(folder / "b.yaml").storage == f"sqlite:///{folder.resolve() / 'study.db'}"


def test_a_foreign_storage_file_fails_before_calibration(tmp_path: Path) -> None:
    """The journal check is cheap: it runs before the first stage, so a spec naming the wrong
    file fails at once instead of after calibration and recovery."""
    from _paths import ROOT

    from mpsearch.pipeline import search_run
    from mpsearch.progress import Progress
    from mpsearch.spec import load_spec

    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    spec = load_spec(ROOT / "searches" / "demo.yaml").with_overrides(storage=str(notes))
    stages: list[str] = []

    def report(progress: Progress) -> None:
        stages.append(progress.stage)

    with pytest.raises(SearchError, match="not an Optuna journal"):
        search_run(spec, tmp_path / "run", progress=report)
    assert stages == [] and notes.read_text() == "mine"
