"""The verdict on a verified point: a crash, a refused compile or a target metric outside the
profile's tolerance of the ONNX Runtime metric rejects it; the tolerance comes from the
profile's ``toolchain.tolerance``, else one point for proportion metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpsearch.errors import ProfileError, TargetError
from mpsearch.profiles import load_profile
from mpsearch.rundir import FrontPoint
from mpsearch.targets._base import ToolchainCrash, log_tail
from mpsearch.targets._verdict import Verified, failure_of, target_tolerance


def _point(metric: float) -> FrontPoint:
    return FrontPoint(index=3, trial=7, metric=metric, search_metric=None, size=100,
                      latency=None, metrics={"accuracy": metric}, assignment={}, counts={},
                      differs_from_int8=(), source="sampler")


def _measured(metric: float) -> Verified:
    return Verified(metric=metric, placement={"toolchain": "qnn"}, cost={"cycles": 10.0})


def test_a_target_metric_within_the_tolerance_passes_either_way() -> None:
    assert failure_of(_point(0.9689), _measured(0.9752), "accuracy", 0.01) is None
    assert failure_of(_point(0.9689), _measured(0.9589), "accuracy", 0.01) is None


def test_a_target_metric_outside_the_tolerance_is_a_failure_that_says_both_figures() -> None:
    said = failure_of(_point(0.96), _measured(0.0), "accuracy", 0.01)
    assert said == ("accuracy 0.0000 on the target vs 0.9600 in ONNX Runtime (-0.9600): "
                    "outside the profile's target tolerance 0.01")
    assert failure_of(_point(0.90), _measured(0.95), "accuracy", 0.01) is not None
    assert failure_of(_point(0.90), _measured(float("nan")), "accuracy", None) == (
        "accuracy on the target is nan, not a number")


def test_without_a_tolerance_only_errors_reject() -> None:
    assert failure_of(_point(0.5), _measured(0.1), "sqnr", None) is None


def test_a_crash_keeps_its_status_and_last_lines() -> None:
    log = "I loading\n\nI building\nW layer 12\nE fatal: bad alloc\n"
    crash = ToolchainCrash("RKNN compile of m.onnx: RKNN-Toolkit2 crashed (exit status -4)",
                           status=-4, tail=log_tail(log, lines=2))
    record = Verified.failed("rknn", "2.5.0", "compile", crash, 1.5)
    assert crash.status == -4
    assert record.error == ("rknn crashed while compiling it: RKNN compile of m.onnx: "
                            "RKNN-Toolkit2 crashed (exit status -4); its last lines: "
                            "W layer 12 | E fatal: bad alloc")
    assert record.placement is not None and record.placement["error"] == record.error
    assert failure_of(_point(0.9), record, "accuracy", 0.01) == record.error
    refused = Verified.failed("vela", "5.2.0", "run", TargetError("no int16 kernel"), 0.1)
    assert refused.error == "vela could not run it: no int16 kernel"
    assert Verified.from_dict(record.to_dict()) == record


def test_log_tail_keeps_the_end_of_a_long_line() -> None:
    tail = log_tail("x" * 1000 + "END", width=50)
    assert tail.endswith("END") and len(tail) == 53


def test_tolerance_defaults_to_one_point_for_proportions() -> None:
    profile = load_profile("qnn_htp")
    assert profile.toolchain is not None and profile.toolchain.tolerance is None
    assert target_tolerance(profile, "accuracy") == 0.01
    assert target_tolerance(profile, "agreement") == 0.01
    assert target_tolerance(profile, "mse") is None


def _profile_with(tmp_path: Path, toolchain: str) -> Path:
    text = Path(load_profile("qnn_htp").path).read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("toolchain:"))
    path = tmp_path / "qnn_tol.yaml"
    path.write_text(text.replace(line, f"toolchain: {toolchain}"))
    return path


def test_the_profile_sets_the_tolerance(tmp_path: Path) -> None:
    path = _profile_with(tmp_path, "{name: qnn, htp_arch: 73, soc_model: 43, tolerance: 0.02}")
    profile = load_profile(path)
    assert profile.toolchain is not None and profile.toolchain.tolerance == 0.02
    assert dict(profile.toolchain.settings) == {"htp_arch": 73, "soc_model": 43}
    assert target_tolerance(profile, "mse") == 0.02
    assert profile.to_dict()["toolchain"]["tolerance"] == 0.02


@pytest.mark.parametrize("bad", ["-0.1", "high", "true"])
def test_a_bad_tolerance_names_the_file_and_line(tmp_path: Path, bad: str) -> None:
    path = _profile_with(tmp_path, f"{{name: qnn, tolerance: {bad}}}")
    with pytest.raises(ProfileError, match=r"qnn_tol\.yaml:\d+: .*toolchain\.tolerance must be "
                                           r"a number >= 0"):
        load_profile(path)


def test_target_samples_is_checked_and_leaves_the_study_fingerprint_alone(
        tmp_path: Path) -> None:
    from mpsearch.demo import DEMO_DATA, DEMO_MODEL
    from mpsearch.errors import SpecError
    from mpsearch.pipeline._search import _spec_fingerprint
    from mpsearch.spec import load_spec

    def spec(evaluation: str) -> Path:
        path = tmp_path / "s.yaml"
        path.write_text(f"model: {DEMO_MODEL}\nprofile: qnn_htp\ndata: {{source: {DEMO_DATA}}}"
                        f"\nverify: front\n{evaluation}")
        return path

    plain = load_spec(spec(""))
    capped = load_spec(spec("evaluation: {target_samples: 16}\n"))
    every = load_spec(spec("evaluation: {target_samples: all}\n"))
    assert [s.evaluation.target_samples for s in (plain, capped, every)] == ["auto", 16, None]
    assert _spec_fingerprint(plain) == _spec_fingerprint(capped)  # --resume still goes on
    for text in (plain, capped, every):  # to_yaml reads back to the same setting
        again = tmp_path / "again.yaml"
        again.write_text(text.to_yaml())
        assert load_spec(again).evaluation.target_samples == text.evaluation.target_samples
    for bad, words in (("0", "must be >= 1"), ("some", "must be auto, all or a number")):
        with pytest.raises(SpecError, match=rf"s\.yaml:\d+: evaluation\.target_samples {words}"):
            load_spec(spec(f"evaluation: {{target_samples: {bad}}}\n"))


def test_the_target_sample_count_follows_the_setting_and_a_stopped_run(
        tmp_path: Path) -> None:
    """A count is capped at the held-out split and ``all`` runs every sample; with ``auto``
    a stopped run's records (their ``samples``) decide, so a resumed run compares its new
    points on the same samples as the kept ones, without timing the target again."""
    import dataclasses

    from mpsearch.data import load_data
    from mpsearch.demo import DEMO_DATA, DEMO_MODEL
    from mpsearch.pipeline._search import _target_samples
    from mpsearch.spec import load_spec

    path = tmp_path / "s.yaml"
    path.write_text(f"model: {DEMO_MODEL}\nprofile: qnn_htp\ndata: {{source: {DEMO_DATA}}}\n"
                    "verify: front\n")
    spec = load_spec(path)
    held = load_data(DEMO_DATA).take(100)

    def count(setting: int | str | None, known: dict[str, Verified]) -> int:
        evaluation = dataclasses.replace(spec.evaluation, target_samples=setting)
        return _target_samples(dataclasses.replace(spec, evaluation=evaluation),
                               None, None, held, known)  # type: ignore[arg-type]

    kept = Verified(metric=0.9, placement={}, cost={}, samples=32, ort_metric=0.9)
    failed = Verified.failed("qnn", "v", "compile", TargetError("no"), 1.0)
    assert [count(16, {}), count(500, {}), count(None, {})] == [16, 100, 100]
    assert count("auto", {"a": kept, "b": failed}) == 32
    assert count(16, {"a": kept}) == 16  # a number the user wrote wins


def test_on_fewer_samples_the_verdict_compares_with_ort_on_the_same_samples() -> None:
    subset = Verified(metric=0.90625, placement={}, cost={}, samples=32, ort_metric=0.9375)
    assert failure_of(_point(0.9062), subset, "agreement", 0.01) == (
        "agreement 0.9062 on the target vs 0.9375 in ONNX Runtime on the same 32 samples "
        "(-0.0312): outside the profile's target tolerance 0.01")
    same = Verified(metric=0.9375, placement={}, cost={}, samples=32, ort_metric=0.9375)
    assert failure_of(_point(0.80), same, "agreement", 0.01) is None
