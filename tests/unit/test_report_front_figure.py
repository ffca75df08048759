"""The report's front figure as data: the search split's trials on an axis of their own, and
baselines at one place under one label."""

from __future__ import annotations

from mpsearch.report import _figures as figs


def test_trials_apart_and_one_label_a_place() -> None:
    front = {"metric": "accuracy", "higher_is_better": True,
             "fp32": {"metric": 0.99, "size": 4000},
             "uniform": {"int8": {"metric": 0.97, "size": 1000},
                         "int16": {"metric": 0.97, "size": 1002},
                         "fp16w": {"metric": 0.99, "size": 2000}},
             "points": [{"index": 0, "metric": 0.97, "size": 1000, "shown": True},
                        {"index": 1, "metric": 0.80, "size": 3000, "shown": True}]}
    trials = [{"trial": 0, "metric": 0.5, "size": 1500}]
    fig = figs.figure_front(front, trials)
    done, shown, refs, _ = fig["data"]
    assert done["yaxis"] == "y2" and "search split" in done["name"]
    assert "yaxis" not in shown  # the held-out front keeps the first axis
    layout = fig["layout"]
    assert layout["yaxis"]["domain"][0] > layout["yaxis2"]["domain"][1]  # stacked, apart
    assert "search split" in layout["yaxis2"]["title"]["text"]
    assert "held-out" in layout["yaxis"]["title"]["text"]
    assert refs["text"] == ["FP32", "INT8 / INT16", "", "FP16W"]
