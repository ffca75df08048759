"""Search specs: strict loading, one-line errors, and every shipped spec validates and dry-runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpsearch.cli import main
from mpsearch.errors import SpecError
from mpsearch.pipeline import dry_run
from mpsearch.spec import load_spec

ROOT = Path(__file__).parent.parent
SPECS = sorted((ROOT / "searches").glob("*.yaml"))

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
    assert (spec.cle, spec.bias_correction, spec.gptq, spec.smoothquant) == (None,) * 4
    assert spec.smoothquant_alpha == 0.5
    on = load_spec(_write(tmp_path, GOOD + "recovery: {cle: true, bias_correction: true, "
                          "gptq: true, smoothquant: true, smoothquant_alpha: 0.75}\n"))
    assert (on.cle, on.bias_correction, on.gptq, on.smoothquant) == (True,) * 4
    assert on.smoothquant_alpha == 0.75
    cases = {"": (None,) * 4, "recovery: auto\n": (None,) * 4, "recovery: off\n": (False,) * 4,
             "recovery: 'off'\n": (False,) * 4, "recovery: {}\n": (None,) * 4,
             "recovery: {gptq: true, cle: false, bias_correction: auto}\n":
                 (False, None, True, None)}
    again = tmp_path / "again.yaml"
    for text, expected in cases.items():
        loaded = load_spec(_write(tmp_path, GOOD + text))
        assert (loaded.cle, loaded.bias_correction, loaded.gptq, loaded.smoothquant) == expected
        again.write_text(loaded.to_yaml())
        assert load_spec(again).to_dict() | {"path": None} == loaded.to_dict() | {"path": None}
    assert "recovery:\n  cle: auto\n  bias_correction: auto\n" in spec.to_yaml()
    again.write_text(on.to_yaml())
    assert load_spec(again).to_dict() | {"path": None} == on.to_dict() | {"path": None}
    assert spec.search_score == "auto"
    scored = load_spec(_write(tmp_path, GOOD + "evaluation: {search_score: sqnr}\n"))
    again.write_text(scored.to_yaml())
    assert load_spec(again).search_score == "sqnr"


def test_paths_resolve_relative_to_the_spec() -> None:
    spec = load_spec(ROOT / "searches" / "demo.yaml")
    assert Path(spec.model).is_file() and Path(spec.data).is_file()
    assert spec.objectives[0] == "metric" and spec.trials > 0


def test_cli_bad_spec_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, BAD[0][0])
    assert main(["search", str(path), "--out", str(tmp_path / "run")]) == 2
    assert "did you mean 'model'" in capsys.readouterr().err


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_shipped_specs_validate_and_dry_run(path: Path, tmp_path: Path) -> None:
    spec = load_spec(path)
    plan = dry_run(spec, tmp_path / "run")
    assert plan.dimensions > 0
    assert plan.seeds >= 2  # at least uniform low precision and uniform float
    assert plan.fp32_size > plan.smallest_size
