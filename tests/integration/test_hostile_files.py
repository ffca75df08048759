"""Hostile run-directory files and inputs through the real CLI (a child process that reports
its own peak memory): each file of a finished run replaced by a bomb, an endless file, a deeply
nested or memory-hungry document or non-finite numbers (generators in tests/hostile/run_files.py)
gives exit 2 with one line naming the file or, where the file is a cache, a rebuild with one
warning line; never exit 3, always under 1 GiB of peak RSS, and nothing outside the run
directory changes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _paths import FIXTURES, HOSTILE
from _peak import cli, read_peak

pytestmark = pytest.mark.slow  # a search, then one CLI run a case

_SPEC = importlib.util.spec_from_file_location("hostile_run_files", HOSTILE / "run_files.py")
assert _SPEC is not None and _SPEC.loader is not None
run_files = sys.modules["hostile_run_files"] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(run_files)
GEN = run_files.GENERATORS

RESNET = FIXTURES / "resnet.onnx"
DIGITS = FIXTURES / "digits_eval.npz"
PEAK_LIMIT_KB = 1 << 20  # 1 GiB


def _run(argv: list[str], cwd: Path) -> tuple[int, list[str], int]:
    """(exit code, the stderr lines, peak kB) of ``mpsearch -q argv`` run in ``cwd``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    peak = cwd / ".peak"
    done = subprocess.run(cli(peak, "-q", *argv), cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, check=False, timeout=600)
    lines = [s for s in done.stderr.decode(errors="replace").splitlines() if s.strip()]
    return done.returncode, lines, read_peak(peak)


def _snapshot(root: Path, skip: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` except those under ``skip`` (links not followed)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and skip not in (p, *p.parents)}


def _spec(tmp: Path, trials: int) -> Path:
    path = tmp / "spec.yaml"
    path.write_text(f"model: {RESNET}\nprofile: x86_ort_auto\n"
                    f"data: {{source: {DIGITS}, calibration: 32, held_out: 0.5, seed: 0}}\n"
                    f"metric: accuracy\nbudget: {{trials: {trials}, patience: 0}}\n"
                    "analysis: false\n")
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("finished")
    code, lines, _ = _run(["search", str(_spec(root, 4)), "--out", str(root / "run"),
                           "--no-report"], root)
    assert code == 0, lines
    return root / "run"


def _first_tensor_min(doc: Any) -> tuple[Any, Any]:
    return doc["tensors"][next(iter(doc["tensors"]))], "min"


def _point_metric(doc: Any) -> tuple[Any, Any]:
    return doc["points"][0], "metric"


def _brace(path: Path) -> None:
    path.write_bytes(b"{")


def _nonfinite(where: Callable[[Any], tuple[Any, Any]]) -> Callable[[Path], None]:
    return lambda path: run_files.nonfinite(path, where)


_EXPORT = ["export", "{run}", "--point", "0", "--out", "{run}/exported.onnx"]
_RESUME = ["search", "{spec}", "--out", "{run}", "--resume", "--no-report"]
_REPORT = ["report", "{run}"]

#: name: (file in the run, generator, command, message in the one error line)
REFUSED: dict[str, tuple[str, Callable[[Path], None], list[str], str]] = {
    "front_sparse": ("front.json", GEN["sparse"], _EXPORT,
                     "front.json: the file is larger than mpsearch reads (6.55e+04 MiB"),
    "front_endless": ("front.json", GEN["endless"], _EXPORT,
                      "front.json: is a symbolic link, which mpsearch does not follow"),
    "front_deep": ("front.json", GEN["deep"], _EXPORT,
                   "front.json: arrays and objects nest deeper than 64 levels"),
    "front_json_memory": ("front.json", GEN["json_memory"], _EXPORT,
                          "front.json: 40 MiB of JSON holding up to 27962029 values would "
                          "take about 2787 MiB to load (limit 384 MiB)"),
    "front_nan": ("front.json", _nonfinite(_point_metric), _EXPORT,
                  "front.json: field 'points[0].metric' is nan"),
    "report_summary_deep": ("summary.json", GEN["deep"], _REPORT,
                            "summary.json: arrays and objects nest deeper than 64 levels"),
    "spec_yaml_sparse": ("spec.yaml", GEN["sparse"], _EXPORT,
                         "spec.yaml: the file is larger than mpsearch reads"),
    "journal_sparse": ("study.journal", GEN["sparse"], _RESUME,
                       "study.journal: a 65536 MiB journal is larger than mpsearch loads"),
    "journal_endless": ("study.journal", GEN["endless"], _RESUME,
                        "study.journal: is a symbolic link, which mpsearch does not follow"),
    "journal_brace": ("study.journal", _brace, _RESUME,
                      "study.journal: not an Optuna journal (its first line is not a journal "
                      "record)"),
}


def _argv(command: list[str], run: Path, spec: Path) -> list[str]:
    return [a.format(run=run, spec=spec) for a in command]


def _copy(finished: Path, tmp_path: Path) -> tuple[Path, Path]:
    run = tmp_path / "run"
    shutil.copytree(finished, run, symlinks=True)
    return run, _spec(tmp_path, 6)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_damaged_run_file_exits_2_naming_it(case: str, finished_run: Path,
                                           tmp_path: Path) -> None:
    name, make, command, message = REFUSED[case]
    run, spec = _copy(finished_run, tmp_path)
    make(run / name)
    before = _snapshot(tmp_path, run)
    inside = sorted(p.name for p in run.iterdir())
    code, lines, peak = _run(_argv(command, run, spec), tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("mpsearch: error: ") and message in lines[0], lines[0]
    assert str(run / name) in lines[0]
    assert peak < PEAK_LIMIT_KB, f"peak {peak} kB"
    assert _snapshot(tmp_path, run) == before, "a file outside the run was touched"
    assert sorted(p.name for p in run.iterdir()) == inside  # nothing written into the run


#: name: (file in the run, generator, command, message in the one warning line)
REBUILT: dict[str, tuple[str, Callable[[Path], None], list[str], str]] = {
    "calibration_npz_bomb": ("calibration/calibration.npz", GEN["npz_bomb"], _EXPORT,
                             "member 'hists.npy' expands 1011x to 3072 MiB"),
    "calibration_npz_bomb_lying": ("calibration/calibration.npz", GEN["npz_bomb_lying"],
                                   _EXPORT, "declares 3221225472 bytes but holds 1048576"),
    "calibration_npz_endless": ("calibration/calibration.npz", GEN["endless"], _EXPORT,
                                "is a link or not a regular file"),
    "calibration_json_nan": ("calibration/calibration.json", _nonfinite(_first_tensor_min),
                             _EXPORT, "calibration.json: field 'tensors."),
    "calibration_json_deep": ("calibration/calibration.json", GEN["deep"], _EXPORT,
                              "calibration.json: arrays and objects nest deeper than 64"),
    "measurements_deep": ("cache/measurements.json", GEN["deep"], _RESUME,
                          "measurements.json: arrays and objects nest deeper than 64 levels"),
}


@pytest.mark.parametrize("case", sorted(REBUILT))
def test_damaged_cache_is_rebuilt_with_one_warning(case: str, finished_run: Path,
                                                   tmp_path: Path) -> None:
    name, make, command, message = REBUILT[case]
    run, spec = _copy(finished_run, tmp_path)
    make(run / name)
    before = _snapshot(tmp_path, run)
    code, lines, peak = _run(_argv(command, run, spec), tmp_path)
    assert code == 0, lines
    assert len(lines) == 1 and lines[0].startswith("WARNING ") and message in lines[0], lines
    assert peak < PEAK_LIMIT_KB, f"peak {peak} kB"
    assert _snapshot(tmp_path, run) == before, "a file outside the run was touched"
    rebuilt = run / name
    assert rebuilt.is_file() and not rebuilt.is_symlink() and rebuilt.stat().st_size < 1 << 20
    if name.endswith(".npz"):
        with np.load(rebuilt) as table:
            assert table["hists"].dtype == np.int64 and table["hists"].sum() > 0


# -- --assignment ------------------------------------------------------------------------------
def _deep_assignment(tmp: Path) -> Path:
    GEN["deep"](tmp / "deep.json")
    return tmp / "deep.json"


@pytest.mark.parametrize(("make", "message"), [
    (lambda tmp: Path("/dev/zero"),
     "/dev/zero: the file is larger than mpsearch reads (it reads on past the limit, limit 256 "
     "MiB)"),
    (_deep_assignment, "deep.json: arrays and objects nest deeper than 64 levels"),
], ids=["endless", "deep"])
def test_hostile_assignment_exits_2(make: Callable[[Path], Path], message: str,
                                    tmp_path: Path) -> None:
    assignment = make(tmp_path)
    out = tmp_path / "out" / "q.onnx"
    before = _snapshot(tmp_path, tmp_path / "out")
    code, lines, peak = _run(["quantize", str(RESNET), "--profile", "x86_ort_auto", "--data",
                              str(DIGITS), "--assignment", str(assignment), "--out", str(out)],
                             tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("mpsearch: error: ") and message in lines[0], lines[0]
    assert peak < PEAK_LIMIT_KB, f"peak {peak} kB"
    assert not out.parent.exists()
    assert _snapshot(tmp_path, tmp_path / "out") == before


# -- storage: ----------------------------------------------------------------------------------
def _storage_spec(tmp: Path, storage: str) -> tuple[Path, Path]:
    """A spec in ``tmp/specs`` naming ``storage``, and a working folder elsewhere."""
    folder, cwd = tmp / "specs", tmp / "work"
    folder.mkdir()
    cwd.mkdir()
    spec = _spec(folder, 3)
    spec.write_text(spec.read_text() + f"storage: {storage}\n")
    return spec, cwd


def test_another_programs_database_stays_byte_identical(tmp_path: Path) -> None:
    import sqlite3

    spec, cwd = _storage_spec(tmp_path, "sqlite:///app.db")
    with sqlite3.connect(spec.parent / "app.db") as db:
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        db.execute("INSERT INTO notes (text) VALUES ('mine')")
    db.close()
    before = _snapshot(tmp_path, tmp_path / "run")
    code, lines, peak = _run(["search", str(spec), "--out", str(tmp_path / "run")], cwd)
    assert code == 2 and len(lines) == 1, lines
    assert (f"mpsearch: error: sqlite:///{spec.parent.resolve() / 'app.db'}: the database "
            "holds another program's tables (notes) and not Optuna's") in lines[0]
    assert peak < PEAK_LIMIT_KB, f"peak {peak} kB"
    assert _snapshot(tmp_path, tmp_path / "run") == before
    assert not (tmp_path / "run").exists()


def test_a_relative_journal_lands_beside_the_spec(tmp_path: Path) -> None:
    spec, cwd = _storage_spec(tmp_path, "shared.journal")
    (tmp_path / "notes.txt").write_text("mine")
    code, lines, peak = _run(["search", str(spec), "--out", str(tmp_path / "run"),
                              "--no-report"], cwd)
    assert code == 0, lines
    assert (spec.parent / "shared.journal").read_bytes().startswith(b'{"op_code":')
    assert list(cwd.iterdir()) == []  # nothing in the working folder
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert peak < PEAK_LIMIT_KB, f"peak {peak} kB"
