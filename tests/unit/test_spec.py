"""Search specs: strict loading, one-line errors, and every shipped spec validates and dry-runs."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from _paths import ROOT

from mpsearch.cli import main
from mpsearch.errors import SpecError
from mpsearch.pipeline import dry_run
from mpsearch.spec import (
    Budget,
    CalibrationSpec,
    Constraints,
    DataSpec,
    EvaluationSpec,
    Recovery,
    SearchSpec,
    load_spec,
)

SPECS = sorted(p for p in (ROOT / "searches").glob("*.yaml")
              if "task: language-model" not in p.read_text())

GOOD = """\
model: ../tests/fixtures/resnet.onnx
profile: x86_ort
data: {source: ../tests/fixtures/digits_eval.npz, calibration: 64}
budget: {trials: 5}
"""

BAD = [
    ("modle: x.onnx\nprofile: x86_ort\ndata: {source: d.npz}\n",
     r"spec\.yaml:1: unknown key 'modle' at top level; did you mean 'model'\?"),
    ("model: m.onnx\nprofile: x86_ort\n", r"spec\.yaml:1: missing key 'data'"),
    ("model: m.onnx\nprofile: x86_ort\ndata: {source: d.npz, held_out: 1.5}\n",
     r"data\.held_out must be below 1, got 1\.5"),
    (GOOD + "sampler: cmaes\n",
     r"spec\.yaml:5: sampler must be one of auto, tpe, nsga2, random, got 'cmaes'"),
    (GOOD.replace("trials: 5", "trials: many"),
     r"spec\.yaml:4: budget\.trials must be an integer, got 'many'"),
    (GOOD + "objectives: [size]\n", r"objectives must include 'metric'"),
    (GOOD.replace("trials: 5", "trials: 5, patience: -1"),
     r"spec\.yaml:4: budget\.patience must be >= 0, got -1"),
    (GOOD.replace("trials: 5", "trials: 5, patients: 10"),
     r"spec\.yaml:4: unknown key 'patients' in budget; did you mean 'patience'\?"),
    (GOOD + "constraints: {max_metric_dorp: 0.01}\n",
     r"unknown key 'max_metric_dorp' in constraints; did you mean 'max_metric_drop'\?"),
    (GOOD + "calibration: {method: kl}\n", r"calibration\.method must be one of minmax"),
    (GOOD + "recovery: {cle: true, bias_corection: true}\n",
     r"spec\.yaml:5: unknown key 'bias_corection' in recovery; did you mean "
     r"'bias_correction'\?"),
    (GOOD + "recovery: {cle: yes please}\n",
     r"recovery\.cle must be true, false or auto, got 'yes please'"),
    (GOOD + "recovery: {smoothquant: 1}\n", r"spec\.yaml:5: recovery\.smoothquant must be "
     r"true, false or auto, got 1"),
    (GOOD + "recovery: maybe\n", r"spec\.yaml:5: recovery must be auto, off or a mapping of "
     r"cle, bias_correction, gptq, smoothquant to true / false / auto, got 'maybe'"),
    (GOOD + "recovery: true\n", r"spec\.yaml:5: recovery must be auto, off or a mapping"),
    (GOOD + "recovery: {smoothquant: true, smoothquant_alpha: 1.5}\n",
     r"spec\.yaml:5: recovery\.smoothquant_alpha must be in \(0, 1\], got 1\.5"),
    (GOOD + "recovery: {smoothquant_alpha: 0}\n",
     r"recovery\.smoothquant_alpha must be greater than 0, got 0"),
    (GOOD + "recovery: {smoothquant_alpha: half}\n",
     r"recovery\.smoothquant_alpha must be a number, got 'half'"),
    (GOOD + "recovery: {smooth_quant: true}\n",
     r"unknown key 'smooth_quant' in recovery; did you mean 'smoothquant'\?"),
    (GOOD + "evaluation: {search_score: kl}\n",
     r"spec\.yaml:5: evaluation\.search_score must be one of auto, metric, sqnr, got 'kl'"),
    (GOOD + "evaluation: {sensitivity_samples: half}\n",
     r"spec\.yaml:5: evaluation\.sensitivity_samples must be auto, null \(all\) or a number "
     r"of samples, got 'half'; fix the value"),
    (GOOD + "evaluation: {sensitivity_samples: 0}\n",
     r"spec\.yaml:5: evaluation\.sensitivity_samples must be >= 1, got 0"),
]


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "sub").mkdir(exist_ok=True)
    path = tmp_path / "sub" / "spec.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "message"), BAD)
def test_malformed_specs(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        load_spec(_write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_recovery_defaults_to_auto_and_round_trips(tmp_path: Path) -> None:
    """auto (None) by default and as ``recovery: auto``; ``off`` (YAML's false) turns every
    method off; a mapping fixes the methods it names and leaves the others auto; each spec
    reads back equal from its own to_yaml()."""
    spec = load_spec(_write(tmp_path, GOOD))
    assert spec.recovery == Recovery(cle=None, bias_correction=None, gptq=None,
                                     smoothquant=None, smoothquant_alpha=0.5)
    on = load_spec(_write(tmp_path, GOOD + "recovery: {cle: true, bias_correction: true, "
                          "gptq: true, smoothquant: true, smoothquant_alpha: 0.75}\n"))
    assert on.recovery == Recovery(cle=True, bias_correction=True, gptq=True, smoothquant=True,
                                   smoothquant_alpha=0.75)
    cases = {"": (None,) * 4, "recovery: auto\n": (None,) * 4, "recovery: off\n": (False,) * 4,
             "recovery: 'off'\n": (False,) * 4, "recovery: {}\n": (None,) * 4,
             "recovery: {gptq: true, cle: false, bias_correction: auto}\n":
                 (False, None, True, None)}
    again = tmp_path / "again.yaml"
    for text, expected in cases.items():
        loaded = load_spec(_write(tmp_path, GOOD + text))
        methods = loaded.recovery
        assert (methods.cle, methods.bias_correction, methods.gptq,
                methods.smoothquant) == expected
        again.write_text(loaded.to_yaml())
        assert load_spec(again).to_dict() | {"path": None} == loaded.to_dict() | {"path": None}
    assert "recovery:\n  cle: auto\n  bias_correction: auto\n" in spec.to_yaml()
    again.write_text(on.to_yaml())
    assert load_spec(again).to_dict() | {"path": None} == on.to_dict() | {"path": None}
    assert spec.evaluation.search_score == "auto"
    scored = load_spec(_write(tmp_path, GOOD + "evaluation: {search_score: sqnr}\n"))
    again.write_text(scored.to_yaml())
    assert load_spec(again).evaluation.search_score == "sqnr"


def test_sensitivity_samples_auto_is_half_the_split_within_bounds(tmp_path: Path) -> None:
    """``auto`` (the default) measures half the split, at least 16 and at most 32 samples
    (all of a smaller split); a count is taken as written, null is every sample; each reads
    back from its own to_yaml()."""
    auto = load_spec(_write(tmp_path, GOOD)).evaluation
    assert auto.sensitivity_samples == "auto"
    assert [auto.sensitivity_count(n) for n in (1, 10, 16, 20, 43, 63, 64, 65, 450)] == [
        1, 10, 16, 16, 22, 32, 32, 32, 32]
    again = tmp_path / "again.yaml"
    for text, count in (("auto", 22), ("7", 7), ("null", None)):
        spec = load_spec(_write(tmp_path, GOOD + f"evaluation: {{sensitivity_samples: {text}}}\n"))
        assert spec.evaluation.sensitivity_count(43) == count
        again.write_text(spec.to_yaml())
        assert load_spec(again).evaluation == spec.evaluation


def test_paths_resolve_relative_to_the_spec() -> None:
    spec = load_spec(ROOT / "searches" / "demo.yaml")
    assert Path(spec.model).is_file() and Path(spec.data.source).is_file()
    assert spec.objectives[0] == "metric" and spec.budget.trials > 0


EVERY = """\
model: ../tests/fixtures/resnet.onnx
profile: x86_ort
data: {source: ../tests/fixtures/digits_eval.npz, calibration: 64, held_out: 0.25, seed: 7}
metric: agreement
objectives: [metric, size]
constraints: {min_metric: 0.5, max_metric_drop: 0.02, max_size_bytes: 100000,
              memory_budget: false}
budget: {trials: 9, timeout_s: 30, patience: 3}
sampler: nsga2
seed: 11
storage: sqlite:///study.db
study: shared
heartbeat: 30
calibration: {method: percentile}
evaluation: {batch_size: 16, threads: 1, chunks: 2, sensitivity_samples: 8, search_score: sqnr}
formats: [int8, fp32]
analysis: false
seeding: false
explore: 0.25
name: my model
recovery: {cle: true, bias_correction: false, smoothquant_alpha: 0.75}
verify: front
"""


def test_sections_mirror_the_yaml_and_round_trip(tmp_path: Path) -> None:
    """Each YAML section is a dataclass whose fields are its keys; a spec with every setting
    away from its default reads back equal from its own to_yaml(), path and all."""
    spec = load_spec(_write(tmp_path, EVERY))
    fixtures = tmp_path.resolve() / "tests" / "fixtures"  # relative to the spec file
    assert spec.data == DataSpec(source=str(fixtures / "digits_eval.npz"), calibration=64,
                                 held_out=0.25, seed=7)
    assert spec.constraints == Constraints(min_metric=0.5, max_metric_drop=0.02,
                                           max_size_bytes=100_000, memory_budget=False)
    assert spec.budget == Budget(trials=9, timeout_s=30.0, patience=3)
    assert spec.calibration == CalibrationSpec(method="percentile")
    assert spec.evaluation == EvaluationSpec(batch_size=16, threads=1, chunks=2,
                                             sensitivity_samples=8, search_score="sqnr")
    assert spec.recovery == Recovery(cle=True, bias_correction=False, smoothquant_alpha=0.75)
    assert (spec.seed, spec.heartbeat_s, spec.verify, spec.name) == (11, 30.0, "front",
                                                                    "my model")
    copy = tmp_path / "sub" / "copy.yaml"
    copy.write_text(spec.to_yaml())
    assert load_spec(copy) == dataclasses.replace(spec, path=str(copy))
    default = load_spec(_write(tmp_path, GOOD))  # defaults (objectives decided later) too
    copy.write_text(default.to_yaml())
    assert load_spec(copy) == dataclasses.replace(default, path=str(copy))
    tree = spec.to_dict()  # what spec.json holds: the file's shape
    assert tree["budget"] == {"trials": 9, "timeout_s": 30.0, "patience": 3}
    assert tree["evaluation"]["sensitivity_samples"] == 8 and tree["recovery"]["gptq"] is None
    assert json.loads(json.dumps(tree))["formats"] == ["int8", "fp32"]


def test_python_specs_and_overrides_are_checked_as_files_are(tmp_path: Path) -> None:
    """A section refuses what load_spec refuses; ``with_overrides`` (CLI flags) names the spec
    file and the flag; a flat setting name goes to its section."""
    with pytest.raises(SpecError, match=r"^budget\.trials \(--trials\) must be at least 1, "
                       r"got 0; fix the value$"):
        Budget(trials=0)
    with pytest.raises(SpecError, match=r"data\.calibration \(--calibration-samples\) must be "
                       r"at least 1, got 0"):
        DataSpec(source="d.npz", calibration=0)
    with pytest.raises(SpecError, match=r"held_out must be between 0 and 1, got 1\.5"):
        DataSpec(source="d.npz", held_out=1.5)
    with pytest.raises(SpecError, match=r"evaluation\.threads \(--threads\) must be at most "
                       r"1024, got 5000"):
        EvaluationSpec(threads=5000)
    with pytest.raises(SpecError, match=r"calibration\.method must be one of minmax"):
        CalibrationSpec(method="kl")
    with pytest.raises(SpecError, match=r"recovery\.gptq must be true, false or auto, got 1"):
        Recovery(gptq=1)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"budget\.timeout_s must be a positive number"):
        Budget(timeout_s=0)
    with pytest.raises(TypeError, match="SearchSpec.data must be a DataSpec"):
        SearchSpec(model="m.onnx", profile="x86_ort", data="d.npz")  # type: ignore[arg-type]
    assert EvaluationSpec(threads=400).threads == min(400, os.cpu_count() or 1)
    path = _write(tmp_path, GOOD)
    spec = load_spec(path)
    with pytest.raises(SpecError, match=rf"^{path}: budget\.trials \(--trials\) must be at "
                       r"least 1, got -5; fix the value$"):
        spec.with_overrides(trials=-5)
    with pytest.raises(SpecError, match=rf"^{path}: seed \(--seed\) must be at least 0"):
        spec.with_overrides(seed=-3)
    with pytest.raises(SpecError, match=r"unknown spec setting\(s\) data\.sed, trails"):
        spec.with_overrides(trails=3, data={"sed": 1})
    with pytest.raises(SpecError, match=r"^calibration: a section takes a mapping of its "
                       r"settings \(method\), got 5$"):
        spec.with_overrides(calibration=5)
    changed = spec.with_overrides(trials=7, threads=1, cle=False, seed=5, storage=None,
                                  data={"seed": 3})
    assert (changed.budget.trials, changed.evaluation.threads, changed.recovery.cle) == (
        7, 1, False)
    assert (changed.seed, changed.data.seed, changed.storage) == (5, 3, None)
    assert changed.budget.patience == spec.budget.patience  # the rest of a section is kept
    assert spec.with_overrides() == spec


def test_cli_bad_spec_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, BAD[0][0])
    assert main(["search", str(path), "--out", str(tmp_path / "run")]) == 2
    assert "did you mean 'model'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_shipped_specs_validate_and_dry_run(path: Path, tmp_path: Path) -> None:
    spec = load_spec(path)
    plan = dry_run(spec, tmp_path / "run")
    assert plan.dimensions > 0
    assert plan.seeds >= 2  # at least uniform low precision and uniform float
    assert plan.fp32_size > plan.smallest_size
