"""What the results page reads out of front.json (mpsearch.serve._frontview), on small
front.json documents written as the search writes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mpsearch.serve._frontview import chart_data, export_index


def _front(**extra: Any) -> dict[str, Any]:
    point = {"metric": 0.98, "size": 1000, "latency_ms": 1.0}
    return {"metric": "accuracy", "higher_is_better": True,
            "fp32": {"metric": 0.99, "size": 4000, "latency_ms": 2.0},
            "uniform": {"int8": {"metric": 0.98, "size": 1000, "latency_ms": 1.0},
                        "int16": {"metric": 0.985, "size": 1000, "latency_ms": 3.0}},
            "points": [{**point, "index": 0, "shown": True},
                       {**point, "index": 1, "shown": False, "beaten_by": "point 0"},
                       {"metric": 0.99, "size": 2000, "index": 2, "shown": True}],
            **extra}


def test_hover_names_what_lies_under_a_marker() -> None:
    chart = chart_data(_front(), None)
    assert chart is not None
    hover = {p["index"]: p["hover"] for p in chart["points"]}
    assert hover[0].endswith("<br>also here: point 1 (hidden), uniform INT8")
    assert hover[1].endswith("<br>also here: point 0, uniform INT8")
    assert "also here" not in hover[2]
    marks = {m["label"]: m["hover"] for m in chart["marks"]}
    assert marks["uniform INT8"].endswith("<br>also here: point 0, point 1 (hidden)")
    assert "also here" not in marks["uniform INT16"] and "also here" not in marks["FP32"]


def test_the_export_command_names_the_recommended_point() -> None:
    assert export_index(_front(recommended=2)) == 2
    assert export_index(_front(recommended=None)) == 0  # none recommended: the first shown
    assert export_index(None) is None


def test_metric_auto_says_what_it_became(tmp_path: Path) -> None:
    from mpsearch.serve._summaries import metric_note

    (tmp_path / "spec.yaml").write_text("model: m.onnx\nprofile: x86_ort\nmetric: null\n")
    assert metric_note(tmp_path, "agreement") == (
        "metric auto became agreement: the data has no labels, so the quantized model is "
        "scored by how often its top-1 class matches FP32's")
    assert metric_note(tmp_path, "accuracy") == "metric auto became accuracy (the data has labels)"
    (tmp_path / "spec.yaml").write_text("model: m.onnx\nprofile: x86_ort\nmetric: agreement\n")
    assert metric_note(tmp_path, "agreement") is None  # the user named it


def test_the_settings_say_what_sensitivity_samples_auto_took(tmp_path: Path) -> None:
    from mpsearch.rundir import RunDir
    from mpsearch.serve._summaries import _sensitivity_samples

    run = RunDir(tmp_path)
    assert _sensitivity_samples(run, {}) == "auto"  # the analysis has not written its count
    (tmp_path / "sensitivity.json").write_text('{"samples": 22, "nodes": []}')
    assert _sensitivity_samples(run, {}) == "auto (22)"
    assert _sensitivity_samples(run, {"sensitivity_samples": "auto"}) == "auto (22)"
    assert _sensitivity_samples(run, {"sensitivity_samples": 32}) == "32"
    assert _sensitivity_samples(run, {"sensitivity_samples": None}) == "all"
    (tmp_path / "sensitivity.json").write_text("[1, 2]")  # damaged: the setting alone
    assert _sensitivity_samples(run, {}) == "auto"


def _failed(front: dict[str, Any], *indexes: int) -> dict[str, Any]:
    """``front`` with the given points verified on vela and rejected, the others verified
    and passed, as ``verify: front`` writes them."""
    for p in front["points"]:
        p["target_placement"] = {"toolchain": "vela", "nodes": 5, "on_accelerator": 5,
                                 "fallback": []}
        p["target_metric"] = p["metric"]
        if p["index"] in indexes:
            p.update(target_metric=None, target_failure=f"vela crashed on point {p['index']}")
    return front


def test_a_point_the_target_rejected_is_never_recommended() -> None:
    from mpsearch.serve._frontview import recommendation, recommended_index, unverified

    # the page's own rule (no "recommended" key) passes over point 2, the best, as failed
    assert recommended_index(_failed(_front(), 2)) == (0, False)
    # a front.json naming a rejected point is not followed
    assert recommended_index(_failed(_front(recommended=2), 2)) == (None, True)
    assert unverified(_failed(_front(), 2)) is None  # point 0 passed
    assert unverified(_front()) is None  # nothing verified
    every = _failed(_front(), 0, 2)  # point 1 is hidden: its verdict does not count
    line = ("no verified point: all 2 shown point(s) failed verification on vela (point 0: "
            "vela crashed on point 0; point 2: vela crashed on point 2)")
    assert unverified(every) == line
    assert recommended_index(every) == (None, False)
    assert recommendation(every) == line  # no "recommendation" in the file: the page says it
    chart = chart_data(every, None)
    assert chart is not None and chart["selected"] is None
    assert [p["hover"].split("<br>")[0] for p in chart["points"]] == [
        "point 0 = uniform INT8 (failed on the target)",
        "point 1 = uniform INT8 (hidden: beaten by point 0)",
        "point 2 (failed on the target)"]


def test_the_tables_mark_a_rejected_point_with_its_reason() -> None:
    from types import SimpleNamespace

    from mpsearch.serve._results import front_section

    front = _failed(_front(recommended=0), 2)
    html = front_section(SimpleNamespace(id="j1", trials=3), front, trials_done=3, files={},
                         fp32_file=None)
    rows = {k: html.split(f'<tr id="row-{k}"')[1].split("</tr>")[0] for k in (0, 2)}
    assert rows[0].startswith(' data-point="0" class="selected">')
    assert '<span class="tag recommended">recommended</span>' in rows[0]
    assert rows[2].startswith(' data-point="2" class="target-failed">')
    assert ('<span class="tag target-failed">failed on the target</span><small '
            'class="failure">vela crashed on point 2</small>') in rows[2]
    assert "recommended" not in rows[2]
    target = html.split('<table id="target-table">')[1].split("</table>")[0]
    assert '<tr data-point="0"><td>0</td>' in target
    assert target.split('<tr data-point="0">')[1].split("</tr>")[0].endswith(
        '<td class="verdict">ok</td>')
    assert ('<tr data-point="2" class="target-failed"><td>2</td>' in target
            and '<td class="verdict failed">failed: vela crashed on point 2</td></tr>' in target)
