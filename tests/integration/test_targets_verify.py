"""``verify: front`` with a real toolchain: only shown points are verified, each one's record
is written to the run directory as it finishes, a run stopped during verification keeps
them and ``--resume`` does not verify them again; the verdict marks points the target rejects,
and a search whose every shown point is rejected exits 4 saying why.

The QNN tests use onnxruntime-qnn's HTP emulator (the ``qnn`` extra CI installs), the demo
model and a few trials.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _paths import FIXTURES

from mpsearch.demo import DEMO_DATA
from mpsearch.pipeline import search_run
from mpsearch.progress import Progress
from mpsearch.rundir import RunDir
from mpsearch.spec import load_spec
from mpsearch.targets._qnn import QnnToolchain

pytestmark = pytest.mark.slow  # whole searches through a toolchain

#: The demo without its outlier weights: the HTP's fixed-point requantization cannot cancel
#: the demo's weight x outlier products against the bias as ONNX Runtime's float does.
STREAM_DEMO = FIXTURES / "demo_stream.onnx"


def _spec(tmp_path: Path, profile: str, trials: int = 6) -> Path:
    spec = tmp_path / "demo_verify.yaml"
    spec.write_text(
        f"model: {STREAM_DEMO}\nprofile: {profile}\n"
        f"data: {{source: {DEMO_DATA}, calibration: 128, held_out: 0.5, seed: 0}}\n"
        "metric: accuracy\nobjectives: [metric, size]\nbudget: {trials: " + str(trials) + "}\n"
        "analysis: false\nseed: 0\nverify: front\n")
    return spec


class _Counted:
    """Counts the real QNN compiler's runs (each call goes to QnnToolchain.compile as is)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = QnnToolchain.compile

        def compile(tool: QnnToolchain, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(tool, *args, **kwargs)
        monkeypatch.setattr(QnnToolchain, "compile", compile)


class _StopAfterFirstPoint:
    """A progress reporter that presses Ctrl-C once the first point is verified."""

    def __init__(self) -> None:
        self.seen: list[Progress] = []

    def __call__(self, progress: Progress) -> None:
        self.seen.append(progress)
        if progress.stage == "verify" and progress.info.get("verified") == 1:
            raise KeyboardInterrupt


def test_a_stopped_verification_keeps_its_points_and_resume_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_spec(_spec(tmp_path, "qnn_htp"))
    out = tmp_path / "run"
    compiles = _Counted(monkeypatch)
    stop = _StopAfterFirstPoint()
    with pytest.raises(KeyboardInterrupt):
        search_run(spec, out, progress=stop)
    assert compiles.calls == 1
    run = RunDir(out)
    assert not run.front_json.exists()
    stored = json.loads(run.verify_json.read_text())
    assert len(stored["points"]) == 1
    (kept_name, kept), = stored["points"].items()
    assert kept["error"] is None and 0.0 <= kept["metric"] <= 1.0 and kept["seconds"] > 0
    verify = [p for p in stop.seen if p.stage == "verify"]
    assert (verify[0].done, verify[0].unit) == (0, "sample")
    first_total = verify[0].total
    assert first_total is not None and 0 < verify[-1].done < first_total

    compiles.calls = 0
    resumed: list[Progress] = []
    front = search_run(spec, out, resume=True, progress=resumed.append).front
    shown = front.shown
    assert len(shown) >= 2, "the demo's front should show two points or more"
    assert compiles.calls == len(shown) - 1  # the kept point is not compiled again
    finished = json.loads(run.verify_json.read_text())["points"]
    assert len(finished) == len(shown) and finished[kept_name] == kept  # not measured again
    assert sorted(r["metric"] for r in finished.values()) == sorted(
        p.target_metric for p in shown)
    # the stage's total is every sample of the points still to verify, for its estimate
    samples = first_total // len(shown)
    assert first_total == samples * len(shown)
    again = [p for p in resumed if p.stage == "verify"]
    assert again[0].total == samples * (len(shown) - 1) and again[-1].done == again[0].total
    for point in front.points:
        if not point.shown:  # hidden points are not verified
            assert point.target_placement is None and point.target_metric is None
            continue
        assert point.target_metric is not None and point.target_placement is not None
        within = abs(point.target_metric - point.metric) <= 0.01 + 1e-9
        assert (point.target_failure is None) == within, point.target_failure


def test_every_shown_point_rejected_exits_4_saying_why(tmp_path: Path) -> None:
    """A profile whose toolchain settings Vela refuses: every shown point fails to compile,
    is marked in front.json, the CLI's tables and the report, and the search exits 4."""
    import subprocess
    import sys

    from mpsearch.errors import EXIT_NO_VERIFIED_POINT
    from mpsearch.profiles import load_profile

    text = Path(load_profile("ethos_u55").path).read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("toolchain:"))
    profile = tmp_path / "u55_bad.yaml"
    profile.write_text(text.replace(line, "toolchain: {name: vela, accelerator_config: "
                                          "ethos-u55-128, system_config: Nope}"))
    spec = _spec(tmp_path, str(profile), trials=3)
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "mpsearch", "-q", "search", str(spec),
                           "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == EXIT_NO_VERIFIED_POINT == 4, done.stdout + done.stderr
    front = json.loads((out / "front.json").read_text())
    shown = [p for p in front["points"] if p["shown"]]
    assert shown
    for point in shown:
        assert point["target_metric"] is None
        assert point["target_failure"].startswith("vela could not compile it: ")
        assert "Nope" in point["target_failure"]
        assert f"point {point['index']} (target failed)" in done.stdout
    assert f"no verified point: all {len(shown)} shown point(s) failed verification on vela" \
        in done.stdout
    assert done.stdout.count("FAILED") == len(shown)
    report = (out / "report.html").read_text()
    section = report[report.index('<section id="target">'):]
    assert f"<b>{len(shown)} of {len(shown)} verified point(s) failed on the target</b>" \
        in section
    assert section.count("<td>FAILED: vela could not compile it: ") == len(shown)


def test_auto_target_samples_cap_a_slow_emulator_and_keep_a_fast_one_whole(
        tmp_path: Path) -> None:
    """``target_samples: auto``: magika (a 1-D CNN on 2048 bytes) takes seconds a sample on
    the HTP emulator, so of 128 held-out samples each point runs only those that fit a
    minute (at least the floor); the demo takes milliseconds and runs every sample."""
    from mpsearch.assignment import uniform_assignment
    from mpsearch.calibration import calibrate
    from mpsearch.data import load_data
    from mpsearch.graph import load_model
    from mpsearch.profiles import load_profile
    from mpsearch.quantize import Quantizer
    from mpsearch.targets._verify import AUTO_FLOOR, AUTO_SECONDS, TargetVerifier
    from mpsearch.testing import corpus

    def affordable(model: Path, source: Path, where: str) -> tuple[int, float | None, int]:
        graph, data = load_model(model), load_data(source)
        held = data.take(128)
        quantizer = Quantizer(graph, calibrate(graph, data.take(8)), load_profile("qnn_htp"))
        verifier = TargetVerifier(quantizer, tmp_path / where, next(iter(held.batches(1))))
        int16 = uniform_assignment(graph, quantizer.profile, "int16")
        return (*verifier.affordable([int16], held), len(held))

    magika = load_spec(corpus.write_search("magika", tmp_path / "magika", 1))
    limit, each, held = affordable(Path(magika.model), Path(magika.data.source), "m")
    assert each is not None and each * held > AUTO_SECONDS, each  # all would not fit
    assert AUTO_FLOOR <= limit < held
    assert limit == max(AUTO_FLOOR, int(AUTO_SECONDS / each))
    limit, each, held = affordable(STREAM_DEMO, DEMO_DATA, "d")
    assert each is not None and each * held <= AUTO_SECONDS and limit == held == 128
