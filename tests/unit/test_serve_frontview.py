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
