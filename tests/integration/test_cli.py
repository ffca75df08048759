"""The command line end to end: quantize, eval, export errors, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from _paths import FIXTURES

from mpsearch.cli import main
from mpsearch.runtime import create_session

MODEL = str(FIXTURES / "mobilenetv2.onnx")
DATA = str(FIXTURES / "digits_eval.npz")


@pytest.mark.slow
def test_quantize_uniform_then_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "int8.onnx"
    code = main(["-q", "quantize", MODEL, "--profile", "x86_ort", "--data", DATA,
                 "--uniform", "int8", "--out", str(out), "--calibration-samples", "64"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "size" in printed and "accuracy" in printed and "latency" in printed
    onnx.checker.check_model(onnx.load(str(out)))
    create_session(out)
    assert main(["eval", str(out), "--data", DATA, "--reference", MODEL]) == 0
    lines = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines()[1:])
    assert 0.9 <= float(lines["agreement"]) <= 1.0


def test_quantize_from_an_assignment_file(tmp_path: Path) -> None:
    from mpsearch.graph import load_model

    graph = load_model(MODEL)
    conv = next(n.name for n in graph.quantizable_nodes() if n.op_type == "Conv")
    assignment = tmp_path / "a.json"
    assignment.write_text(json.dumps({conv: "int16"}))
    out = tmp_path / "mixed.onnx"
    assert main(["-q", "quantize", MODEL, "--profile", "x86_ort", "--data", DATA,
                 "--assignment", str(assignment), "--out", str(out),
                 "--calibration-samples", "32"]) == 0
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert "QuantizeLinear" in ops


@pytest.mark.parametrize(("argv", "message"), [
    (["quantize", MODEL, "--profile", "x86_ort", "--data", DATA, "--uniform", "int4",
      "--out", "x.onnx"], "no format 'int4'"),
    (["quantize", MODEL, "--profile", "no_such_target", "--data", DATA, "--uniform", "int8",
      "--out", "x.onnx"], "no_such_target"),
    (["quantize", MODEL, "--profile", "x86_ort", "--data", str(FIXTURES / "missing.npz"),
      "--uniform", "int8", "--out", "x.onnx"], "missing.npz"),
    (["export", "/nonexistent/run", "--point", "0", "--out", "x.onnx"], "not a finished search"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mpsearch: error: ") and message in err and "\n" not in err
    assert not (tmp_path / "x.onnx").exists()  # nothing half-written


def test_data_that_does_not_match_the_model(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    bad = tmp_path / "bad.npz"
    np.savez(bad, input=np.zeros((8, 3, 32, 32), np.float32))
    assert main(["quantize", MODEL, "--profile", "x86_ort", "--data", str(bad),
                 "--uniform", "int8", "--out", str(tmp_path / "x.onnx")]) == 2
    err = capsys.readouterr().err
    assert "bad.npz" in err and "'input'" in err


def test_latency_is_known_only_where_every_cost_is() -> None:
    from mpsearch.assignment import latency_unknown_reason
    from mpsearch.profiles import list_profiles, load_profile

    reasons = {name: latency_unknown_reason(load_profile(name)) for name in list_profiles()}
    # rk3588's costs come from its toolkit's cycle estimates (docs/targets.md)
    assert sorted(n for n, why in reasons.items() if why is None) == [
        "rk3588", "x86_ort", "x86_ort_avx2"]
    transformer = {n.op_type for n in onnx.load(FIXTURES / "transformer.onnx").graph.node}
    assert latency_unknown_reason(load_profile("x86_ort"), transformer) == (
        "profile 'x86_ort' has no known relative_cost for int8 on Div, int8 on "
        "LayerNormalization, so latency cannot be estimated; drop 'latency' from objectives, or "
        "set relative_cost (measured on the target) in a profile with 'extends: x86_ort'")
    mobilenet = {n.op_type for n in onnx.load(MODEL).graph.node}
    assert latency_unknown_reason(load_profile("x86_ort"), mobilenet) is None
    assert reasons["qnn_htp"] == (
        "profile 'qnn_htp' has no known relative_cost for int16, fp16, fp32, so latency cannot "
        "be estimated; drop 'latency' from objectives, or set relative_cost (measured on the "
        "target) in a profile with 'extends: qnn_htp'")


def test_latency_objective_with_unknown_cost_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {MODEL}\nprofile: qnn_htp\ndata: {{source: {DATA}}}\n"
                    "objectives: [metric, size, latency]\nbudget: {trials: 2}\n")
    out = tmp_path / "run"
    assert main(["search", str(spec), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"mpsearch: error: {spec}: objective 'latency': profile 'qnn_htp' has no "
                   "known relative_cost for int16, fp16, fp32, so latency cannot be estimated; "
                   "drop 'latency' from objectives, or set relative_cost (measured on the "
                   "target) in a profile with 'extends: qnn_htp'\n")
    assert not out.exists()


@pytest.mark.slow
def test_points_uniform_int8_beats_are_hidden_on_every_surface(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real case: on the ResNet fixture INT8 keeps every held-out sample's FP32 class
    (agreement 1.0, under the profile whose int8 is exact on this CPU: x86_ort saturates on
    one without VNNI), while the search, scoring by output SQNR, finds larger configurations with
    less noise. After the held-out re-measure uniform INT8 is as good as those and smaller: the
    CLI table, the report, the web page's results and front.json (``shown: false``,
    ``beaten_by: int8``) hide them and say so, and the recommendation is a shown point,
    preselected on the web page."""
    import re

    from mpsearch.pareto import SIZE_TIE, dominates
    from mpsearch.rundir import RunDir

    spec = tmp_path / "resnet.yaml"
    spec.write_text(f"model: {FIXTURES / 'resnet.onnx'}\nprofile: x86_ort_auto\n"
                    f"data: {{source: {DATA}, calibration: 64, held_out: 0.5}}\n"
                    "metric: agreement\nobjectives: [metric, size]\nbudget: {trials: 16}\n"
                    "evaluation: {sensitivity_samples: 96}\nseed: 0\n")
    out = tmp_path / "run"
    assert main(["-q", "search", str(spec), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    front = RunDir(out).read_front()
    int8 = front.uniform["int8"]
    assert int8.metric == 1.0  # the case this test builds
    beaten = [p for p in front.points if p.beaten_by == "int8"]
    assert beaten and all(not p.shown and p.dominated for p in beaten)
    for p in beaten:  # the rule, spelled out: as good a metric, smaller beyond the tie
        assert p.metric <= int8.metric and int8.size * (1 + SIZE_TIE) < p.size
    shown = front.shown
    assert shown and front.recommended in {p.index for p in shown}
    everything = [(b.metric, float(b.size), None) for b in (front.fp32, *front.uniform.values())]
    everything += [(p.metric, float(p.size), None) for p in shown]
    for p in shown:  # no baseline nor other shown point beats a shown one
        assert not any(dominates(q, (p.metric, float(p.size), None), higher_is_better=True)
                       for q in everything)
    data = json.loads((out / "front.json").read_text())  # the record keeps them, marked
    assert [(p["index"], p["shown"], p["beaten_by"]) for p in data["points"]] == [
        (p.index, p.shown, p.beaten_by) for p in front.points]
    assert data["recommended"] == front.recommended
    assert data["recommendation"].startswith(f"deploy point {front.recommended}: ")
    # the CLI: a table row for each shown point only, the reason for the others, the line
    rows = re.findall(r"^point (\d+) ", printed, flags=re.MULTILINE)
    assert rows == [str(p.index) for p in shown]
    assert (f"{len(front.points) - len(shown)} of {len(front.points)} searched points hidden: "
            "beaten on held-out agreement, size (") in printed
    assert all(f"point {p.index} by int8" in printed for p in beaten)
    assert f"\n{front.recommendation}\n" in printed
    assert "trial budget used" in front.recommendation or "stopped after" in front.recommendation
    # the report: the chart, the selector and the front table list shown points only
    page = (out / "report.html").read_text()
    payload = json.loads(re.search(r'<script type="application/json" id="mpsearch-data">(.*?)'
                                   r"</script>", page, flags=re.DOTALL)[1])
    assert [p["index"] for p in payload["front"]["points"]] == [p.index for p in shown]
    assert payload["front"]["default"] == front.recommended
    chart = payload["charts"]["chart-front"]["data"][1]
    assert [c[0] for c in chart["customdata"]] == [p.index for p in shown]
    options = re.findall(r'<option value="(\d+)">point \d+:', page)
    assert options == [str(p.index) for p in shown]
    visible, folded = page.split('<details id="hidden-points">')
    assert "front, recommended" in visible and "beaten by int8" not in visible
    assert all(f"point {p.index} by int8" in folded for p in beaten)
    # the web page (the results section mpsearch serve renders from the same front.json)
    from types import SimpleNamespace

    from mpsearch.serve._results import front_section

    html = front_section(SimpleNamespace(id="j1", trials=16), data, trials_done=16, files={},
                         fp32_file=None)
    table, hidden = html.split('<details id="hidden-points">')
    assert re.findall(r'<tr id="row-(\d+)"', table) == [str(p.index) for p in shown]
    assert re.findall(r'<tr id="row-(\d+)"', hidden) == [str(p.index) for p in front.points
                                                          if not p.shown]
    assert re.findall(r'id="point-(\d+)" checked', html) == [str(front.recommended)]
    assert front.recommendation.split(";")[0] in html.replace("&#x27;", "'")
