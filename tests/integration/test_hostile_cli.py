"""Hostile inputs and faults through the real CLI (``python -m mpsearch`` in a child process):
each case asserts the documented exit code (docs/exit-codes.md), exactly one line on stderr,
nothing left at ``--out``, no file outside the run touched, and the child's peak memory.

Ctrl-C cases send SIGINT while the named stage's progress bar is on stderr. Disk-full and
read-only cases run the child in a user and mount namespace (``unshare``) over a small or
read-only tmpfs: real ENOSPC and EROFS, as any user.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from _paths import FIXTURES
from _peak import cli, read_peak
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.slow  # whole searches, servers, browsers, toolchains

RESNET = FIXTURES / "resnet.onnx"
DIGITS = FIXTURES / "digits_eval.npz"
PEAK_LIMIT_KB = 1 << 20  # 1 GiB


# -- running the CLI -------------------------------------------------------------------------
def _visible_lines(err: str) -> list[str]:
    """The stderr lines a terminal shows: progress bars redraw with \\r and erase themselves."""
    return [seg.split("\r")[-1] for seg in err.split("\n") if seg.split("\r")[-1].strip()]


def _wait(process: subprocess.Popen[bytes], peak: Path) -> tuple[int, int]:
    """(exit code, the child's own peak RSS in kB)."""
    return process.wait(), read_peak(peak)


def _command(argv: list[str], peak: Path, *, quiet: bool = True,
             mount: tuple[str, Path] | None = None, listing: Path | None = None) -> list[str]:
    """``python -m mpsearch argv``; with ``mount`` (tmpfs options, folder), run in a private
    user and mount namespace over a tmpfs there, and list what is left in it to ``listing``."""
    command = cli(peak, *(["-q"] if quiet else []), *argv)
    if mount is None:
        return command
    options, folder = mount
    script = (f'mount -t tmpfs -o {options} tmpfs "{folder}" || exit 99; "$@"; code=$?; '
              f'ls -A "{folder}" > "{listing}"; exit $code')
    return ["unshare", "--map-root-user", "--mount", "sh", "-c", script, "sh", *command]


def _run(argv: list[str], cwd: Path, *, mount: tuple[str, Path] | None = None
         ) -> tuple[int, str, int]:
    """(exit code, stderr, peak kB) of ``mpsearch -q argv`` run in ``cwd``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(cwd / ".stderr", "wb") as err:
        process = subprocess.Popen(_command(argv, cwd / ".peak", mount=mount,
                                            listing=cwd / ".listing"),
                                   cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        code, peak = _wait(process, cwd / ".peak")
    text = (cwd / ".stderr").read_text(errors="replace")
    (cwd / ".stderr").unlink()
    return code, text, peak


def _interrupt(argv: list[str], cwd: Path, stage: str) -> tuple[int, str, int]:
    """Run ``mpsearch argv`` with progress bars, send SIGINT once the ``stage`` bar shows
    progress; (exit code, stderr, peak kB)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # As from a terminal: SIGINT at its default in the child, whatever an earlier test left
    # this process with (a child inherits an ignored SIGINT, and Python then never raises
    # KeyboardInterrupt).
    process = subprocess.Popen(_command(argv, cwd / ".peak", quiet=False), cwd=cwd, env=env,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None
    os.set_blocking(process.stderr.fileno(), False)
    seen, deadline, sent = b"", time.time() + 300, False
    while time.time() < deadline and process.poll() is None:
        if select.select([process.stderr], [], [], 0.05)[0]:
            seen += process.stderr.read() or b""
        bars = seen.rsplit(b"\r", 1)[-1]
        if f"{stage}:".encode() in bars and b"%|" in bars:
            process.send_signal(signal.SIGINT)
            sent = True
            break
    os.set_blocking(process.stderr.fileno(), True)
    rest = process.stderr.read()
    code, peak = _wait(process, cwd / ".peak")
    text = (seen + rest).decode(errors="replace")
    assert sent, f"stage '{stage}' never showed: {text[-1500:]!r}"
    return code, text, peak


def _snapshot(root: Path, skip: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` except those under ``skip``."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and skip not in (p, *p.parents)}


def _check_failure(tmp_path: Path, argv: list[str], out: Path, code: int, message: str,
                   *, mount: tuple[str, Path] | None = None) -> str:
    """Run a case that must fail; assert everything the corpus promises; the line."""
    before = _snapshot(tmp_path, out)
    got, err, peak = _run(argv, tmp_path, mount=mount)
    if mount is not None:  # the tmpfs is gone with the namespace: what was left in it
        listing = tmp_path / ".listing"
        left = listing.read_text().split()
        listing.unlink()
        assert left == [], f"left in {mount[1]}: {left}"
    lines = _visible_lines(err)
    assert got == code, err
    assert len(lines) == 1, err
    prefix = "mpsearch: interrupted" if code == 130 else "mpsearch: error: "
    assert lines[0].startswith(prefix) and message in lines[0], lines[0]
    assert not out.exists(), sorted(p.name for p in out.parent.iterdir())
    assert _snapshot(tmp_path, out) == before, "a file outside the run was touched"
    assert peak < PEAK_LIMIT_KB, f"peak {peak} kB"
    return lines[0]


# -- inputs ----------------------------------------------------------------------------------
def _matmul_model(path: Path, *, nodes: list[onnx.NodeProto] | None = None,
                  initializers: list[onnx.TensorProto] | None = None) -> Path:
    weight = numpy_helper.from_array(
        np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32), "W")
    graph = helper.make_graph(
        nodes or [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        initializer=[weight] if initializers is None else initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _matmul_data(path: Path, n: int = 40) -> Path:
    rng = np.random.default_rng(1)
    np.savez(path, x=rng.normal(size=(n, 4)).astype(np.float32),
             labels=rng.integers(0, 3, n))
    return path


def _quantize(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["quantize", str(model), "--profile", "x86_ort_auto", "--data", str(data), "--uniform",
            "int8", "--out", str(out), "--calibration-samples", "8", *extra]


def _short_raw_data(tmp: Path) -> Path:
    path = _matmul_model(tmp / "short.onnx")
    model = onnx.load(path)
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:10]
    onnx.save(model, path)
    return path


def _non_utf8_name(tmp: Path) -> Path:
    path = _matmul_model(tmp / "named.onnx")
    data = path.read_bytes()
    assert data.count(b"\x1a\x02mm") == 1  # NodeProto.name (field 3), 2 bytes
    path.write_bytes(data.replace(b"\x1a\x02mm", b"\x1a\x02m\xff"))
    return path


def _endless_loop(tmp: Path) -> Path:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])],
        initializer=[numpy_helper.from_array(np.ones(1, np.float32), "one")])
    nodes = [helper.make_node("Loop", ["M", "cond", "v0"], ["v"], name="loop", body=body),
             helper.make_node("MatMul", ["x", "W"], ["y0"], name="mm"),
             helper.make_node("Add", ["y0", "v"], ["y"], name="add")]
    inits = [numpy_helper.from_array(np.array(10**12, np.int64), "M"),
             numpy_helper.from_array(np.array(True), "cond"),
             numpy_helper.from_array(np.zeros(1, np.float32), "v0"),
             numpy_helper.from_array(np.ones((4, 3), np.float32), "W")]
    return _matmul_model(tmp / "loop.onnx", nodes=nodes, initializers=inits)


def _no_weights(tmp: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Sigmoid", ["r"], ["y"], name="sigmoid")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    path = tmp / "noweights.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _two_writers(tmp: Path) -> Path:
    return _matmul_model(tmp / "twowriters.onnx", nodes=[
        helper.make_node("MatMul", ["x", "W"], ["y"], name="a"),
        helper.make_node("MatMul", ["x", "W"], ["y"], name="b")])


def _inf_in_validation(tmp: Path) -> tuple[Path, int]:
    """Data whose one Inf sits in a sample the calibration split does not take; its index in
    the file."""
    from mpsearch.data import load_data
    from mpsearch.pipeline import split_data

    path = _matmul_data(tmp / "inf.npz")
    arrays = dict(np.load(path))
    n = len(arrays["x"])
    arrays["index"] = np.arange(n, dtype=np.float32)[:, None].repeat(4, axis=1)
    probe = tmp / "probe.npz"
    np.savez(probe, x=arrays["index"], labels=arrays["labels"])
    calibration, validation = split_data(load_data(str(probe)), 8, 0)
    probe.unlink()
    taken = set(calibration.inputs["x"][:, 0].astype(int).tolist())
    sample = sorted(set(range(n)) - taken)[2]
    arrays["x"][sample, 1] = np.inf
    np.savez(path, x=arrays["x"], labels=arrays["labels"])
    return path, sample


MODEL_CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "short_raw_data": (_short_raw_data, "initializer 'W' holds 10 bytes but its dims [4, 3] "
                                        "need 48"),
    "non_utf8_node_name": (_non_utf8_name, "its name b'm\\xff' is not UTF-8"),
    "loop_trip_count": (_endless_loop, "node 'loop' (Loop) runs 1000000000000 iterations "
                                       "(limit 1000000)"),
    "no_weights": (_no_weights, "the model has no weights"),
    "two_writers": (_two_writers, "tensor 'y' is written by both node 'a' and node 'b'"),
}


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_hostile_model_exits_2(case: str, tmp_path: Path) -> None:
    build, message = MODEL_CASES[case]
    out = tmp_path / "out" / "q.onnx"
    argv = _quantize(build(tmp_path), _matmul_data(tmp_path / "d.npz"), out)
    _check_failure(tmp_path, argv, tmp_path / "out", 2, message)


def test_inf_only_in_validation_split_names_the_file_sample(tmp_path: Path) -> None:
    data, sample = _inf_in_validation(tmp_path)
    model = _matmul_model(tmp_path / "mm.onnx")
    line = _check_failure(tmp_path, _quantize(model, data, tmp_path / "out.onnx"),
                          tmp_path / "out.onnx", 2, f"(sample {sample}); clean or drop")
    assert f"{data}: input 'x' holds Inf" in line  # the file, not a split of it


# -- spec values and CLI overrides -------------------------------------------------------------
def _spec(tmp: Path, extra: str = "", name: str = "spec.yaml", trials: int = 3) -> Path:
    path = tmp / name
    path.write_text(f"model: {RESNET}\nprofile: x86_ort_auto\n"
                    f"data: {{source: {DIGITS}, calibration: 32, held_out: 0.5, seed: 0}}\n"
                    f"metric: accuracy\nbudget: {{trials: {trials}, patience: 0}}\n"
                    f"analysis: false\n{extra}")
    return path


SPEC_CASES: dict[str, tuple[str, list[str], str]] = {
    # name: (spec lines, extra flags, message)
    "seed_negative": ("seed: -1\n", [], "spec.yaml:7: seed (--seed) must be at least 0, got -1"),
    "deep_yaml": ("formats: " + "[" * 5000 + "]" * 5000 + "\n", [],
                  "spec.yaml:7: mappings and lists nest deeper than 64 levels"),
    "threads_5000": ("evaluation: {threads: 5000}\n", [],
                     "evaluation.threads (--threads) must be at most 1024, got 5000"),
    "trials_0": ("", ["--trials", "0"], "budget.trials (--trials) must be at least 1, got 0"),
    "trials_negative": ("", ["--trials", "-5"],
                        "budget.trials (--trials) must be at least 1, got -5"),
    "seed_flag_negative": ("", ["--seed", "-3"], "seed (--seed) must be at least 0, got -3"),
    "trials_not_a_number": ("", ["--trials", "many"],
                            "mpsearch search: argument --trials: invalid int value: 'many'"),
    "storage_foreign_file": ("storage: notes.txt\n", [], "notes.txt: not an Optuna journal "
                             "(its first line is not a journal record)"),
}


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_hostile_spec_exits_2(case: str, tmp_path: Path) -> None:
    lines, flags, message = SPEC_CASES[case]
    (tmp_path / "notes.txt").write_text("my notes\nnot finished")  # must stay as it is
    spec = _spec(tmp_path, lines)
    out = tmp_path / "run"
    _check_failure(tmp_path, ["search", str(spec), "--out", str(out), *flags], out, 2, message)
    assert (tmp_path / "notes.txt").read_text() == "my notes\nnot finished"


@pytest.mark.parametrize("value", ["0", "-7"])
def test_calibration_samples_flag_is_checked(value: str, tmp_path: Path) -> None:
    out = tmp_path / "q.onnx"
    argv = ["quantize", str(RESNET), "--profile", "x86_ort_auto", "--data", str(DIGITS),
            "--uniform", "int8", "--out", str(out), "--calibration-samples", value]
    _check_failure(tmp_path, argv, out, 2, f"data.calibration (--calibration-samples) must be "
                   f"at least 1, got {value}")


@pytest.mark.parametrize(("bins", "message"), [
    ("2e9", "argument --bins: invalid int value: '2e9'"),
    ("2000000000", "histogram bins 2000000000 must be an even number from 2 to 65536"),
])
def test_calibrate_bins_are_bounded(bins: str, message: str, tmp_path: Path) -> None:
    out = tmp_path / "table"
    argv = ["calibrate", str(RESNET), "--data", str(DIGITS), "--out", str(out), "--bins", bins]
    _check_failure(tmp_path, argv, out, 2, message)


def test_threads_beyond_the_machine_are_capped(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "evaluation: {threads: 400}\n", trials=2)
    out = tmp_path / "run"
    code, err, peak = _run(["search", str(spec), "--out", str(out), "--no-report"], tmp_path)
    assert code == 0, err
    assert err == ""
    written = json.loads((out / "spec.json").read_text())
    assert written["evaluation"]["threads"] == min(400, os.cpu_count() or 1)
    assert peak < PEAK_LIMIT_KB


# -- run directories ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("finished")
    spec = _spec(root, trials=4)
    code, err, _ = _run(["search", str(spec), "--out", str(root / "run"), "--no-report"], root)
    assert code == 0, err
    return root


def _copy_run(finished: Path, tmp_path: Path) -> tuple[Path, Path]:
    shutil.copytree(finished / "run", tmp_path / "run")
    spec = _spec(tmp_path, trials=6)
    return spec, tmp_path / "run"


def _corrupt_journal(run: Path, line: bytes) -> int:
    journal = run / "study.journal"
    lines = journal.read_bytes().split(b"\n")
    assert len(lines) > 8
    lines.insert(5, line)
    journal.write_bytes(b"\n".join(lines))
    return 6


@pytest.mark.parametrize("line", [b'{"op_code": 4, "worker_id": "w", "trial_id": 1, "par',
                                  b"#!junk line"])
def test_resume_with_a_torn_or_junk_journal_line_exits_2(line: bytes, finished_run: Path,
                                                         tmp_path: Path) -> None:
    spec, run = _copy_run(finished_run, tmp_path)
    number = _corrupt_journal(run, line)
    before = _snapshot(tmp_path, tmp_path / ".none")
    code, err, _ = _run(["search", str(spec), "--out", str(run), "--resume", "--no-report"],
                        tmp_path)
    lines = _visible_lines(err)
    assert code == 2 and len(lines) == 1, err
    assert f"study.journal:{number}: not an Optuna journal record" in lines[0]
    assert _snapshot(tmp_path, tmp_path / ".none") == before  # the run is kept as it was


@pytest.mark.parametrize(("change", "message"), [
    (lambda e: e.update(metrics={"accuracy": "high"}), "has 'metrics' that are not numbers"),
    (lambda e: e.update(primary=7), "has no 'primary' metric name"),
    (lambda e: e.update(samples="many"), "has a 'samples' that is not a number"),
])
def test_resume_with_wrong_typed_measurements_exits_2(
        change: Callable[[dict[str, object]], None], message: str, finished_run: Path,
        tmp_path: Path) -> None:
    spec, run = _copy_run(finished_run, tmp_path)
    cache = run / "cache" / "measurements.json"
    stored = json.loads(cache.read_text())
    entries = stored["splits"]["search"]["entries"]
    change(entries[next(iter(entries))])
    cache.write_text(json.dumps(stored))
    before = _snapshot(tmp_path, tmp_path / ".none")
    code, err, _ = _run(["search", str(spec), "--out", str(run), "--resume", "--no-report"],
                        tmp_path)
    lines = _visible_lines(err)
    assert code == 2 and len(lines) == 1, err
    assert "measurements.json: search entry" in lines[0] and message in lines[0]
    assert _snapshot(tmp_path, tmp_path / ".none") == before


# -- where the output goes ---------------------------------------------------------------------
def test_out_naming_a_file_exits_2_at_the_start(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("mine")
    spec = _spec(tmp_path)
    start = time.perf_counter()
    code, err, _ = _run(["search", str(spec), "--out", str(taken)], tmp_path)
    assert code == 2 and _visible_lines(err) == [
        f"mpsearch: error: --out {taken}: is a file, not a directory; give a directory for "
        "the results"]
    assert time.perf_counter() - start < 30  # refused before any work (no calibration)
    assert taken.read_text() == "mine"
    out = taken / "q.onnx"
    _check_failure(tmp_path, _quantize(RESNET, DIGITS, out), out, 2,
                   f"--out {out}: {taken} is a file, not a directory")
    _check_failure(tmp_path, _quantize(RESNET, DIGITS, tmp_path), tmp_path / "none", 2,
                   f"--out {tmp_path}: is a directory; name the file to write")


def _namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--map-root-user", "--mount", "true"],
                           capture_output=True, check=False)
    return probe.returncode == 0


needs_namespaces = pytest.mark.skipif(not _namespaces(), reason="no user/mount namespaces "
                                      "(unshare --map-root-user --mount) for a private tmpfs")


@needs_namespaces
def test_read_only_out_exits_2_at_the_start(tmp_path: Path) -> None:
    mount = tmp_path / "ro"
    mount.mkdir()
    out = mount / "run"
    line = _check_failure(tmp_path, ["search", str(_spec(tmp_path)), "--out", str(out)], out,
                          2, f"--out {out}: cannot write in {mount} (read-only or no "
                          "permission)", mount=("ro,size=1m", mount))
    assert line.endswith("choose another --out")


@needs_namespaces
@pytest.mark.parametrize("command", ["quantize", "search"])
def test_disk_full_exits_2_and_leaves_nothing(command: str, tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    if command == "quantize":
        out = mount / "q.onnx"
        argv = _quantize(RESNET, DIGITS, out)
    else:
        out = mount / "run"
        argv = ["search", str(_spec(tmp_path)), "--out", str(out), "--no-report"]
    _check_failure(tmp_path, argv, out, 2, "(No space left on device); free space or choose "
                   "another --out", mount=("size=16k", mount))


# -- Ctrl-C ------------------------------------------------------------------------------------
def _big_data(tmp: Path, n: int = 3000) -> Path:
    rng = np.random.default_rng(0)
    path = tmp / "big.npz"
    np.savez(path, input=rng.normal(size=(n, 1, 16, 16)).astype(np.float32),
             labels=rng.integers(0, 10, n))
    return path


def _check_interrupted(code: int, err: str, peak: int, out: Path) -> str:
    lines = _visible_lines(err)
    assert code == 130, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("mpsearch: interrupted"), lines
    assert peak < PEAK_LIMIT_KB
    return lines[0]


def test_ctrl_c_in_calibrate_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "table"
    argv = ["calibrate", str(RESNET), "--data", str(_big_data(tmp_path)), "--out", str(out),
            "--batch-size", "1"]
    line = _check_interrupted(*_interrupt(argv, tmp_path, "calibrate"), out)
    assert line == "mpsearch: interrupted" and not out.exists()


def test_ctrl_c_in_quantize_calibration_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "out" / "q.onnx"
    argv = ["quantize", str(RESNET), "--profile", "x86_ort_auto", "--data",
            str(_big_data(tmp_path, 6000)), "--uniform", "int8", "--out", str(out),
            "--calibration-samples", "3000"]
    _check_interrupted(*_interrupt(argv, tmp_path, "calibrate"), out)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("stage", "analysis"), [("calibrate", False), ("sensitivity", True)])
def test_ctrl_c_before_the_search_leaves_no_run(stage: str, analysis: bool,
                                                tmp_path: Path) -> None:
    data = _big_data(tmp_path, 6000)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {RESNET}\nprofile: x86_ort_auto\n"
                    f"data: {{source: {data}, calibration: 3000, held_out: 0.5, seed: 0}}\n"
                    f"metric: accuracy\nbudget: {{trials: 50}}\n"
                    f"analysis: {str(analysis).lower()}\n")
    out = tmp_path / "run"
    argv = ["search", str(spec), "--out", str(out), "--no-report"]
    line = _check_interrupted(*_interrupt(argv, tmp_path, stage), out)
    assert line == "mpsearch: interrupted" and not out.exists()


def test_ctrl_c_in_the_search_keeps_a_resumable_run(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "seeding: false\n", trials=400)
    out = tmp_path / "run"
    argv = ["search", str(spec), "--out", str(out), "--no-report"]
    line = _check_interrupted(*_interrupt(argv, tmp_path, "search"), out)
    assert line == f"mpsearch: interrupted; the run in {out} is kept: continue it with --resume"
    code, err, _ = _run(["search", str(spec), "--out", str(out), "--resume", "--trials", "3",
                         "--no-report"], tmp_path)
    assert code == 0, err


# -- library-level promises ---------------------------------------------------------------
def test_atomic_write_never_changes_the_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    from mpsearch import _io

    def forbidden(mask: int) -> int:
        raise AssertionError("os.umask changed the process-wide umask")

    monkeypatch.setattr(os, "umask", forbidden)
    _io.atomic_write(tmp_path / "a.bin", b"x")
    _io.write_json(tmp_path / "b.json", {"v": 1})
    mode = (tmp_path / "a.bin").stat().st_mode & 0o777
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    assert mode == plain.stat().st_mode & 0o777  # what open() gives under the same umask


def test_csv_cells_that_spreadsheets_would_run_are_neutralised(tmp_path: Path) -> None:
    from mpsearch.rundir import _csv

    path = tmp_path / "t.csv"
    _csv(path, ["node", "value"], [['=HYPERLINK("http://x","y")', -1.5], ["+1+2", "-1.5"],
                                   ["@SUM(A1)", 2], ["-cmd", "conv1"], [["=a", "b"], 0.25]])
    assert path.read_text().splitlines() == [
        "node,value", "\"'=HYPERLINK(\"\"http://x\"\",\"\"y\"\")\",-1.5", "'+1+2,-1.5",
        "'@SUM(A1),2", "'-cmd,conv1", "'=a; b,0.25"]


def test_node_named_like_a_formula_is_quoted_in_the_run_csv(tmp_path: Path) -> None:
    model = _matmul_model(tmp_path / "formula.onnx", nodes=[
        helper.make_node("MatMul", ["x", "W"], ["h"], name='=HYPERLINK("http://evil")'),
        helper.make_node("Relu", ["h"], ["y"], name="@relu")])
    out = tmp_path / "run"
    code, err, _ = _run(["analyze", str(model), "--profile", "x86_ort_auto", "--data",
                         str(_matmul_data(tmp_path / "d.npz")), "--out", str(out),
                         "--calibration-samples", "8", "--no-report"], tmp_path)
    assert code == 0, err
    cells = [c for p in out.glob("*.csv") for row in p.read_text().splitlines()
             for c in row.split(",")]
    named = [c for c in cells if "HYPERLINK" in c]
    assert named and all(c.lstrip('"').startswith("'=") for c in named), named
    assert not [c for c in cells if c.lstrip('"')[:1] in ("=", "+", "@")]


_KERNEL_INTERRUPT = """
import os, signal, sys, threading
import numpy as np
from mpsearch import kernels
from mpsearch.kernels import _kernels

x = np.random.default_rng(0).normal(size=1 << 22).astype(np.float32)
lo, scale = _kernels._hist_scale(-1.0, 1.0, 2048)
raw = lambda: _kernels._tensor_stats_kernel(x, x.view(np.int32), lo, scale, 2048, 8)
wrapped = lambda: kernels.tensor_stats(x, -1.0, 1.0, 2048)
for name, kernel in (("raw", raw), ("wrapped", wrapped)):
    kernel()  # compiled before the clock starts
    for _ in range(3):
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            while True:
                kernel()
        except BaseException as e:
            print(name, type(e).__name__)
"""


def test_ctrl_c_inside_a_numba_kernel_is_a_keyboard_interrupt(tmp_path: Path) -> None:
    """numba turns a Ctrl-C inside compiled code into a SystemError (the control, calling the
    compiled kernel directly); the public kernels raise KeyboardInterrupt instead."""
    result = subprocess.run([sys.executable, "-c", _KERNEL_INTERRUPT], capture_output=True,
                            text=True, cwd=tmp_path, check=True, timeout=300,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = [tuple(line.split()) for line in result.stdout.splitlines()]
    assert ("raw", "SystemError") in seen, seen  # the interrupt did land inside numba
    assert [s for s in seen if s[0] == "wrapped"] == [("wrapped", "KeyboardInterrupt")] * 3
