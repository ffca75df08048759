"""The bundled demo keeps a trade-off under the default settings: `searches/demo.yaml` as
shipped (`recovery: auto`), on this machine's CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _paths import ROOT

from mpsearch import host_int8_isa
from mpsearch.pipeline import search_run
from mpsearch.spec import load_spec

pytestmark = pytest.mark.slow  # one demo search with recovery decided (~20 s on 2 cores)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = load_spec(ROOT / "searches" / "demo.yaml")
    return search_run(spec, tmp_path_factory.mktemp("demo") / "run").run_dir


def test_demo_int8_loses_after_recovery_and_a_point_wins_it_back(demo_run: Path) -> None:
    front = json.loads((demo_run / "front.json").read_text())
    recovery = json.loads((demo_run / "recovery.json").read_text())
    assert set(recovery["decision"]["asked"].values()) == {"auto"}  # the default: decided
    fp32, int8 = front["fp32"], front["uniform"]["int8"]
    # the stream outliers survive every recovery method: >= 5 points lost on held-out data
    assert fp32["metric"] - int8["metric"] >= 0.05, (fp32["metric"], int8["metric"])
    # and a per-layer choice wins them back at (about) INT8's size
    near = [p for p in front["points"]
            if p["size"] <= 1.25 * int8["size"] and p["metric"] >= fp32["metric"] - 0.01]
    assert near, [(p["metric"], p["size"]) for p in front["points"]]


@pytest.mark.xfail(not host_int8_isa().exact_int8, strict=True, reason=(
    "x86_ort_avx2's 7-bit weights: recovery leaves uniform INT8 at 0.07, the search finds "
    "two accuracy levels (0.963 at 38.0 kB, 0.988 at 43.6 kB) and nothing between them"))
def test_demo_shows_three_points_of_trade_off(demo_run: Path) -> None:
    front = json.loads((demo_run / "front.json").read_text())
    # three or more searched points survive on held-out data
    shown = [(p["metric"], p["size"]) for p in front["points"] if p["shown"]]
    assert len(shown) >= 3, shown


def test_the_clock_times_the_baselines_and_the_shown_points(demo_run: Path) -> None:
    """Latency is not one of the demo's objectives, so which points are shown needs no
    timing: the clock times FP32, the uniform baselines and the shown points; a hidden point
    keeps the estimate alone, or a timed configuration's very figures when it is one."""
    front = json.loads((demo_run / "front.json").read_text())
    assert front["latency_source"] == "measured" and "latency" not in front["objectives"]
    baselines = [front["fp32"], *front["uniform"].values()]
    shown = [p for p in front["points"] if p["shown"]]
    hidden = [p for p in front["points"] if not p["shown"]]
    for entry in (*baselines, *shown):
        assert entry["latency_ms"] > 0 and entry["batch_latency_ms"] > 0, entry
    figures = {entry["latency_ms"] for entry in (*baselines, *shown)}
    untimed = [p for p in hidden if p["latency_ms"] is None]
    assert untimed, [(p["index"], p["latency_ms"]) for p in hidden]
    for p in hidden:
        assert p["latency_ms"] is None or p["latency_ms"] in figures, p["index"]
        assert (p["latency"] is None) == (p["latency_ms"] is None)
