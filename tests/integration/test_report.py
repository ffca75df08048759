"""The HTML report: figure data, the page, the CLI, and the page drawn in headless Chromium."""

from __future__ import annotations

import argparse
import csv
import html
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import pytest
from _paths import ROOT
from plotly.offline import get_plotlyjs

from mpsearch.cli._report import add_report_parser
from mpsearch.errors import MpsearchError
from mpsearch.graph import load_model
from mpsearch.profiles import load_profile
from mpsearch.report import (
    CLASS_COLORS,
    MAX_BINS,
    MAX_DISTRIBUTION_NODES,
    load_run,
    rebin,
    render_report,
    write_report,
)
from mpsearch.report import _figures as figs
from mpsearch.report._page import _front_table
from mpsearch.summary import summarize

DEMO = ROOT / "mpsearch" / "demo" / "demo.onnx"
HOSTILE = "</script><script>window.pwned=1</script><b>x"


# -- a small run directory, every file the report reads ------------------------------------
def _histogram(rng: np.random.Generator, scale: float, tensor: str, role: str,
               bins: int = 64) -> dict[str, Any]:
    """A ``TensorDistribution.to_dict()`` (mpsearch.analysis) of a normal sample."""
    values = rng.normal(0.0, scale, 4000)
    edges = np.linspace(values.min(), values.max(), bins + 1)
    formats = {}
    for fmt, levels in (("int8", 40), ("int16", 4000)):
        step = (edges[-1] - edges[0]) / levels
        clip = [float(edges[2]), float(edges[-3])]
        fake = np.clip(np.round(values / step) * step, *clip)
        formats[fmt] = {"quantized": np.histogram(fake, edges)[0].tolist(), "clip": clip,
                        "sqnr": 30.0 if fmt == "int8" else 70.0, "clipped": 0.002}
    stats = {"count": 4000.0, "min": float(values.min()), "max": float(values.max()),
             "mean": 0.0, "std": scale, "skew": 0.0, "kurtosis": 0.1, "outlier_ratio": 0.0,
             "clipped": 0.002, "channel_range_ratio": None, "levels_used": 200.0,
             "sqnr_symmetric": 30.0, "sqnr_asymmetric": 31.0}
    return {"tensor": tensor, "role": role, "format": "int8", "edges": edges.tolist(),
            "fp32": np.histogram(values, edges)[0].tolist(),
            "quantized": formats["int8"]["quantized"], "clip": formats["int8"]["clip"],
            "stats": stats, "formats": formats, "channels": None}


def _sensitivity(nodes: list[dict[str, Any]], metric: str, rng: np.random.Generator
                 ) -> dict[str, Any]:
    """A ``sensitivity.json`` (``Analysis.to_dict()``): both views, every quantizable node."""
    rows = []
    for fmt, scale in (("int8", 1.0), ("int16", 0.05)):
        for i, node in enumerate(nodes):
            drop = float(scale * rng.uniform(0, 0.03))
            rows.append({"node": node["name"], "op_type": node["op_type"], "format": fmt,
                         "index": i, "metric": 0.9 - drop, "drop": drop,
                         "sqnr": float(40 - 600 * drop), "mse": None, "cosine": None,
                         "kl": None, "proxy_sqnr": None,
                         "cls": "high" if drop > 0.02 else "medium" if drop > 0.005 else "low",
                         "rank": 0, "seconds": 0.1})
    gains = [{"node": node["name"], "op_type": node["op_type"], "format": "int8", "index": i,
              "metric": 0.84 + gain, "gain": gain, "sqnr": 20.0 + 100 * gain,
              "sqnr_gain": None if i == 1 else 100 * gain, "mse": None, "kl": None,
              "rank": 0, "seconds": 0.1}
             for i, node in enumerate(nodes) for gain in [float(rng.uniform(-0.005, 0.04))]]
    base = {"formats": {n["name"]: "int8" for n in nodes}, "metric": 0.84, "sqnr": 20.0,
            "metrics": {"accuracy": 0.84}, "kl": None}
    return {"schema": 1, "metric": metric, "higher_is_better": True, "fp32": {"accuracy": 0.9},
            "mode": "end_to_end", "formats": ["int8", "int16"], "nodes": rows,
            "reverse": {"base": base, "rows": gains}}


def _make_run(root: Path, hostile: bool = False) -> Path:
    rng = np.random.default_rng(0)
    metric = "acc<script>" if hostile else "accuracy"
    summary = summarize(load_model(DEMO)).to_dict()
    if hostile:
        summary["nodes"][3]["name"] = HOSTILE
    nodes = [n for n in summary["nodes"] if n["quantizable"]]
    profile = load_profile("x86_ort").to_dict()
    names = [n["name"] for n in nodes]
    sensitivity = _sensitivity(nodes, metric, rng)
    curve = {"schema": 1, "metric": metric, "fp32_metric": 0.9, "fp32_size": 310_000,
             "orders": {order: [{"order": order, "step": s, "node": None if s == 0 else
                                 names[s - 1], "op_type": None, "format": "int8",
                                 "metric": 0.9 - rate * s * s, "drop": rate * s * s,
                                 "sqnr": None,
                                 "size": 310_000 - 9000 * s, "size_ratio": 1.0}
                                for s in range(len(names) + 1)]
                        for order, rate in (("topological", 1e-4), ("sensitivity", 5e-5))}}
    distributions = {"schema": 1, "nodes": [
        {"node": n["name"], "op_type": n["op_type"], "index": i,
         "weight": _histogram(rng, 0.1, f"w{i}", "weight") if n["params"] else None,
         "activation": _histogram(rng, 1.0, f"a{i}", "output"), "inputs": [],
         "flags": ["a0: heavy tails; try INT16"] if i == 0 else [],
         "codes": ["heavy_tails"] if i == 0 else []}
        for i, n in enumerate(nodes)]}
    points, trials = [], []
    for k in range(5):
        assignment = {name: ("int16" if j < k else "int8") for j, name in enumerate(names)}
        counts = {f: list(assignment.values()).count(f) for f in ("int8", "int16")}
        points.append({"index": k, "trial": 3 * k, "metric": 0.85 + 0.01 * k,
                       "search_metric": 0.86 + 0.01 * k, "size": 80_000 + 4000 * k,
                       "latency": 0.4 + 0.2 * k, "assignment": assignment, "counts": counts,
                       "differs_from_int8": names[:k]})
    for t in range(20):
        trials.append([t, "PRUNED" if t % 7 == 6 else "COMPLETE",
                       "" if t % 7 == 6 else 0.8 + 0.005 * t, 80_000 + 3000 * (t % 9),
                       0.5 + 0.1 * (t % 5), "sensitivity seed" if t < 3 else "TPESampler"])
    front = {"metric": metric, "higher_is_better": True,
             "objectives": ["metric", "size", "latency"],
             "fp32": {"metric": 0.9, "size": 310_000, "latency": 1.0},
             "uniform": {"int8": {"metric": 0.84, "size": 80_000, "latency": 0.35},
                         "int16": {"metric": 0.9, "size": 150_000, "latency": 2.0}},
             "points": points}
    run = {"model": str(DEMO), "profile": "x86_ort", "data": "demo_data.npz",
           "command": "mpsearch search demo.yaml", "created": "2024-01-01T00:00:00+00:00",
           "mpsearch": "0.1.0", "onnxruntime": "1.20"}
    root.mkdir(parents=True, exist_ok=True)
    for name, doc in (("summary.json", summary), ("profile.json", profile),
                      ("sensitivity.json", sensitivity), ("curve.json", curve),
                      ("distributions.json", distributions), ("front.json", front),
                      ("run.json", run)):
        (root / name).write_text(json.dumps(doc))
    with (root / "trials.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["trial", "state", "metric", "size", "latency", "source"])
        writer.writerows(trials)
    return root


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_run(tmp_path_factory.mktemp("report") / "run")


def _payload(page: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="mpsearch-data">(.*?)</script>',
                      page, re.S)
    assert match is not None
    return json.loads(match.group(1))  # type: ignore[no-any-return]


# -- figures, through their data -----------------------------------------------------------
def test_every_figure_is_valid_plotly(run_dir: Path) -> None:
    payload = _payload(render_report(run_dir))
    charts = payload["charts"]
    assert set(charts) == {"chart-op-types", "chart-flops", "chart-sensitivity",
                           "chart-reverse", "chart-curve", "chart-front"}
    for fig in [*charts.values(), *payload["distributions"]]:
        go.Figure(fig)  # raises on any property plotly does not know
        layout = fig["layout"]
        assert layout["title"]["text"]
        assert "width" not in layout, "fixed widths break laptop-width layouts"
        for axis in ("xaxis", "yaxis"):
            assert layout[axis]["title"]["text"] or layout[axis].get("showticklabels") is False


def test_sensitivity_bars_in_topological_order_colored_by_class(run_dir: Path) -> None:
    files = load_run(run_dir)
    rows = files["sensitivity.json"]["nodes"]
    order = [n["name"] for n in files["summary.json"]["nodes"]]
    fig = figs.figure_sensitivity(rows, order, ["int8", "int16"], "accuracy")
    assert fig["layout"]["xaxis"]["categoryarray"] == order
    assert {t["offsetgroup"] for t in fig["data"]} == {"int8", "int16"}
    for trace in fig["data"]:
        fmt, cls = trace["offsetgroup"], trace["name"].split(" · ")[1]
        assert trace["marker"]["color"] == CLASS_COLORS[cls]
        expected = [r for r in rows if r["format"] == fmt and r["cls"] == cls]
        assert trace["x"] == [r["node"] for r in expected]  # topological, as the rows are
        assert trace["y"] == pytest.approx([r["drop"] for r in expected], rel=1e-4)
    assert fig["layout"]["yaxis"]["title"]["text"] == "accuracy drop vs FP32"


def test_sensitivity_proxy_mode_shows_sqnr_first() -> None:
    rows = [{"node": "a", "format": "int8", "drop": None, "sqnr": None, "proxy_sqnr": 31.5,
             "cls": "low", "rank": 1}]
    fig = figs.figure_sensitivity(rows, ["a"], ["int8"], "accuracy")
    assert fig["data"][0]["y"] == [31.5]
    assert "SQNR" in fig["layout"]["yaxis"]["title"]["text"]
    assert fig["layout"]["updatemenus"][0]["buttons"][0]["label"] == "SQNR (dB)"


def test_reverse_view_one_bar_per_node_with_the_json_gains(run_dir: Path,
                                                           tmp_path: Path) -> None:
    sensitivity = json.loads((run_dir / "sensitivity.json").read_text())
    gains = sensitivity["reverse"]["rows"]
    fig = _payload(render_report(run_dir))["charts"]["chart-reverse"]
    bars = {x: (y, c, t["name"]) for t in fig["data"]
            for x, y, c in zip(t["x"], t["y"], t["customdata"], strict=True)}
    assert sum(len(t["x"]) for t in fig["data"]) == len(bars) == len(gains)  # one per node
    assert {n: y for n, (y, _, _) in bars.items()} == pytest.approx(
        {g["node"]: g["gain"] for g in gains}, rel=1e-4)
    nan = float("nan")  # the SQNR button's values; a missing SQNR gain stays missing
    assert {n: nan if c[1] is None else c[1] for n, (_, c, _) in bars.items()} == pytest.approx(
        {g["node"]: nan if g["sqnr_gain"] is None else g["sqnr_gain"] for g in gains},
        rel=1e-3, nan_ok=True)
    cls = {r["node"]: r["cls"] for r in sensitivity["nodes"] if r["format"] == "int8"}
    assert {n: name for n, (_, _, name) in bars.items()} == cls
    for trace in fig["data"]:  # colored as in the sensitivity view, topological order
        assert trace["marker"]["color"] == CLASS_COLORS[trace["name"]]
        order = [r["node"] for r in sensitivity["nodes"]]
        assert trace["x"] == sorted(trace["x"], key=order.index)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert fig["layout"]["xaxis"]["categoryarray"] == [n["name"] for n in summary["nodes"]]
    assert fig["layout"]["yaxis"]["title"]["text"] == "accuracy gain vs all quantized"
    assert "all quantized: accuracy 0.84" in fig["layout"]["title"]["text"]
    unclassified = figs.figure_reverse(gains[:1], [gains[0]["node"]], {}, "accuracy")
    assert unclassified["data"][0]["name"] == "unclassified"

    run = shutil.copytree(run_dir, tmp_path / "no_reverse")  # `analyze --no-reverse`
    sensitivity["reverse"] = {"base": None, "rows": []}
    (run / "sensitivity.json").write_text(json.dumps(sensitivity))
    page = render_report(run)
    assert "chart-reverse" not in _payload(page)["charts"]
    assert "Reverse view: not run" in page and page.count("not run") == 1


def test_rebin_keeps_counts_and_range() -> None:
    edges, counts = list(np.linspace(-1, 1, 257)), list(range(256))
    new_edges, new_counts = rebin(edges, counts, 64)
    assert len(new_counts) == 64 and len(new_edges) == 65
    assert sum(new_counts) == sum(counts)
    assert (new_edges[0], new_edges[-1]) == (-1.0, 1.0)
    assert rebin(edges[:11], counts[:10], 64) == (edges[:11], [float(c) for c in counts[:10]])
    with pytest.raises(ValueError, match="edges"):
        rebin(edges, counts[:10])


def test_distribution_marks_clipping_range_and_flags() -> None:
    weight = _histogram(np.random.default_rng(1), 0.1, "conv.w", "weight", bins=200)
    fig = figs.figure_distribution({"node": "conv<1>", "op_type": "Conv", "weight": weight,
                                    "activation": None, "flags": ["clipped 3% of values"]})
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert len(bars) == 1 and len(bars[0]["y"]) == 50  # 200 bins merged 4 by 4
    assert sum(bars[0]["y"]) == sum(weight["fp32"])
    width = 4 * (weight["edges"][1] - weight["edges"][0])
    assert bars[0]["dx"] == pytest.approx(width, rel=1e-4)  # uniform bins: x0 + k * dx
    assert bars[0]["x0"] == pytest.approx(weight["edges"][0] + width / 2, rel=1e-4)
    steps = [t for t in fig["data"] if t["type"] == "scatter"]
    assert [(t["name"], t["visible"]) for t in steps] == [
        ("INT8 (dequantized)", True), ("INT16 (dequantized)", "legendonly")]
    assert sum(steps[0]["y"]) == sum(weight["formats"]["int8"]["quantized"])
    lines = [s["x0"] for s in fig["layout"]["shapes"]]
    assert lines == pytest.approx(weight["clip"], rel=1e-4)
    notes = " ".join(a["text"] for a in fig["layout"]["annotations"])
    assert "no output activations" in notes and "SQNR 30.0 dB (INT8)" in notes
    title = fig["layout"]["title"]["text"]
    assert title.startswith("conv&lt;1&gt; (Conv)") and "clipped 3% of values" in title
    coded = figs.figure_distribution({"node": "n", "op_type": "Relu", "weight": None,
                                      "activation": weight, "flags": ["a: long sentence"],
                                      "codes": ["heavy_tails"]})
    assert "⚠ heavy_tails" in coded["layout"]["title"]["text"]
    uneven = {**weight, "edges": [e ** 3 for e in weight["edges"]]}
    bars = figs.figure_distribution({"node": "n", "weight": uneven})["data"][0]
    assert len(bars["x"]) == len(bars["width"]) == 50 and "dx" not in bars
    assert "long sentence" not in coded["layout"]["title"]["text"]


def test_curve_has_metric_and_size_per_order(run_dir: Path) -> None:
    curve = load_run(run_dir)["curve.json"]
    fig = figs.figure_curve(curve["orders"], "accuracy", 0.9)
    assert [t["name"] for t in fig["data"]] == ["topological order"] * 2 + \
        ["sensitivity order"] * 2
    steps = curve["orders"]["topological"]
    assert fig["data"][0]["y"] == pytest.approx([s["metric"] for s in steps])
    assert fig["data"][1]["y"] == pytest.approx([s["size"] / 1e3 for s in steps])
    assert fig["layout"]["yaxis2"]["title"]["text"] == "model size (kB)"


def test_front_colors_by_latency_and_hover_shows_assignment(run_dir: Path) -> None:
    files = load_run(run_dir)
    fig = figs.figure_front(files["front.json"], files["trials.csv"])
    trials, front, refs, selected = fig["data"]
    assert len(trials["x"]) == sum(1 for t in files["trials.csv"] if t["metric"] is not None)
    assert trials["marker"]["opacity"] < 0.5
    points = files["front.json"]["points"]
    assert [c[0] for c in front["customdata"]] == [p["index"] for p in points]
    assert front["marker"]["color"] == pytest.approx([p["latency"] for p in points])
    assert "latency" in front["marker"]["colorbar"]["title"]["text"]
    assert points[3]["differs_from_int8"][2] in front["hovertext"][3]
    assert "int16" in front["hovertext"][3]
    assert refs["text"] == ["FP32", "INT8", "INT16"]
    assert selected["uid"] == "selected" and selected["x"] == []
    unknown = {**files["front.json"], "points": [{**p, "latency": None} for p in points]}
    assert "colorbar" not in figs.figure_front(unknown, [])["data"][1]["marker"]


# -- the page -----------------------------------------------------------------------------
def test_report_is_self_contained_and_small(run_dir: Path, tmp_path: Path) -> None:
    path = write_report(run_dir, tmp_path / "out" / "r.html")
    page = path.read_text()
    assert path.stat().st_size < 10_000_000
    assert page.count(get_plotlyjs()) == 1
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page)
    for section in ("summary", "profile", "sensitivity", "distributions", "curve", "front"):
        assert f'<section id="{section}">' in page
    assert "not run" not in page
    assert "mpsearch export " in page  # the command the script completes
    assert write_report(run_dir) == run_dir / "report.html"


def test_thousands_of_nodes_stay_small(tmp_path: Path) -> None:
    names = [f"/layer{i}/Conv" for i in range(1000)]
    hist = _histogram(np.random.default_rng(2), 1.0, "t", "output", bins=128)
    flagged = {names[999], names[500]}
    files = {
        "summary.json": {"model": "big", "nodes": [
            {"name": n, "op_type": "Conv", "flops": 10, "quantizable": True} for n in names]},
        "sensitivity.json": {"metric": "accuracy", "formats": ["int8"], "nodes": [
            {"node": n, "format": "int8", "index": i, "drop": 0.001 * (i % 7), "cls": "low",
             "rank": i + 1} for i, n in enumerate(names)]},
        "distributions.json": {"nodes": [
            {"node": n, "op_type": "Conv", "weight": None, "activation": hist,
             "flags": ["x"] if n in flagged else []} for n in names]},
    }
    run = tmp_path / "big"
    run.mkdir()
    for name, doc in files.items():
        (run / name).write_text(json.dumps(doc))
    path = write_report(run)
    assert path.stat().st_size < 10_000_000
    payload = _payload(path.read_text())
    shown = [f["layout"]["title"]["text"].split(" ")[0] for f in payload["distributions"]]
    assert len(shown) == MAX_DISTRIBUTION_NODES and flagged <= set(shown)
    assert shown == sorted(shown, key=names.index)  # still in topological order
    assert all(len(t["y"]) <= MAX_BINS for f in payload["distributions"] for t in f["data"])
    axis = payload["charts"]["chart-sensitivity"]["layout"]["xaxis"]
    assert axis["showticklabels"] is False and "hover" in axis["title"]["text"]


def test_missing_files_say_not_run(tmp_path: Path) -> None:
    run = tmp_path / "analysis_only"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(summarize(load_model(DEMO)).to_dict()))
    page = render_report(run)
    for what in ("Hardware profile", "Sensitivity analysis", "Distributions",
                 "Node-by-node curve", "Search"):
        assert f"{what}: not run" in page
    assert set(_payload(page)["charts"]) == {"chart-op-types", "chart-flops"}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_node_and_metric_names_are_escaped(tmp_path: Path) -> None:
    page = render_report(_make_run(tmp_path / "hostile", hostile=True))
    assert HOSTILE not in page and "<script>window.pwned" not in page
    assert "acc<script>" not in page
    payload = _payload(page)  # plotly renders an HTML subset: every figure string is escaped
    figures = [*payload["charts"].values(), *payload["distributions"]]
    assert not [t for t in _strings(figures) if "<script" in t or "</script" in t]
    assert any("&lt;/script&gt;" in t for t in _strings(figures))
    assert HOSTILE in [n[0] for n in payload["front"]["nodes"]]  # shown with textContent


def test_bad_run_directories_are_errors(tmp_path: Path) -> None:
    with pytest.raises(MpsearchError, match="no such run directory"):
        write_report(tmp_path / "missing")
    with pytest.raises(MpsearchError, match="is it a run directory"):
        write_report(tmp_path)
    (tmp_path / "front.json").write_text("{not json")
    with pytest.raises(MpsearchError, match="front.json"):
        write_report(tmp_path)


def test_cli_writes_the_report(run_dir: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_report_parser(parser.add_subparsers())
    out = tmp_path / "cli.html"
    args = parser.parse_args(["report", str(run_dir), "--out", str(out)])
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.stat().st_size > 1_000_000


@pytest.mark.slow
def test_report_of_a_real_demo_analysis(tmp_path: Path) -> None:
    """The files `mpsearch analyze` writes for the bundled demo feed every analysis chart."""
    from mpsearch.pipeline import analyze_prepared, prepare_inputs

    run = tmp_path / "demo"
    prepared = prepare_inputs(DEMO, "x86_ort", DEMO.with_name("demo_data.npz"),
                       calibration_samples=8, cache_dir=run / "calibration")
    analyze_prepared(prepared, run, samples=4)
    path = write_report(run)
    assert path.stat().st_size < 10_000_000
    page = path.read_text()
    payload = _payload(page)
    assert set(payload["charts"]) == {"chart-op-types", "chart-flops", "chart-sensitivity",
                                      "chart-reverse", "chart-curve"}
    assert "Search: not run" in page and page.count("not run") == 1
    sensitivity = json.loads((run / "sensitivity.json").read_text())
    bars = payload["charts"]["chart-sensitivity"]["data"]
    assert sum(len(t["x"]) for t in bars) == len(sensitivity["nodes"])
    assert {t["offsetgroup"] for t in bars} == set(sensitivity["formats"])
    gains = payload["charts"]["chart-reverse"]["data"]  # the file analyze wrote, as drawn
    assert {x: y for t in gains for x, y in zip(t["x"], t["y"], strict=True)} == pytest.approx(
        {html.escape(g["node"]): g["gain"] for g in sensitivity["reverse"]["rows"]}, abs=1e-6)
    curve = payload["charts"]["chart-curve"]["data"]
    assert {t["name"] for t in curve} == {"topological order", "sensitivity order"}
    distributions = json.loads((run / "distributions.json").read_text())["nodes"]
    assert len(payload["distributions"]) == len(distributions) > 0
    for fig, entry in zip(payload["distributions"], distributions, strict=True):
        assert fig["layout"]["title"]["text"].startswith(html.escape(entry["node"]))
        assert len(fig["layout"]["shapes"]) == 2 * sum(
            1 for t in (entry["weight"], entry["activation"]) if t and t["clip"])
    for fig in [*payload["charts"].values(), *payload["distributions"]]:
        go.Figure(fig)


# -- the page in a real browser -----------------------------------------------------------
CHARTS = {"chart-op-types", "chart-flops", "chart-sensitivity", "chart-reverse",
          "chart-distribution", "chart-curve", "chart-front"}


class Page:
    """A report page in the ``chromium`` fixture's browser, with what it logged: uncaught
    exceptions, console errors (failed loads among them) and every URL it requested."""

    def __init__(self, chromium: Any) -> None:
        self.page = chromium.new_page()
        self.page.set_viewport_size({"width": 1366, "height": 800})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text)
                     if m.type in ("error", "assert") else None)
        self.page.on("request", lambda r: self.requests.append(r.url))

    def open(self, report: Path) -> str:
        """Load ``report``; wait until its script has drawn every chart (or failed); no errors."""
        self.page.goto(report.as_uri())
        drawn = self.wait_for("document.body && (document.body.getAttribute('data-drawn') || "
                              "(window.mpsearchErrors || []).length && 'failed')")
        assert self.errors == []
        assert self.page.evaluate("window.mpsearchErrors") == []
        return str(drawn)

    def evaluate(self, expression: str) -> Any:
        return self.page.evaluate(expression)

    def wait_for(self, expression: str) -> Any:
        """The first truthy value of ``expression``, polled until the default timeout."""
        return self.page.wait_for_function(expression).json_value()


_CHARTS_JS = """Array.from(document.querySelectorAll('.chart')).map(el => ({
  id: el.id, plotly: el.classList.contains('js-plotly-plot'),
  svg: el.querySelectorAll('.main-svg').length, traces: (el._fullData || []).length,
  marks: el.querySelectorAll('.cartesianlayer .trace').length,
  width: el.getBoundingClientRect().width, height: el.getBoundingClientRect().height}))"""

_FRONT_POINT_JS = """(() => {
  const gd = document.getElementById('chart-front');
  gd.scrollIntoView({block: 'center'});
  const fl = gd._fullLayout, t = gd.data.find(d => d.uid === 'front');
  const j = t.customdata.findIndex(c => c[0] === %d), box = gd.getBoundingClientRect();
  return {x: box.left + fl.xaxis._offset + fl.xaxis.l2p(t.x[j]),
          y: box.top + fl.yaxis._offset + fl.yaxis.l2p(t.y[j])};
})()"""


def _save_artifact(png: bytes, tmp_path: Path) -> Path:
    """The screenshot, in ``tmp_path`` and, when ``$MPSEARCH_TEST_ARTIFACTS`` names a folder
    (CI sets one), there too, which outlives pytest's rotation of its temp dirs."""
    (tmp_path / "report.png").write_bytes(png)
    if not os.environ.get("MPSEARCH_TEST_ARTIFACTS"):
        return tmp_path / "report.png"
    folder = Path(os.environ["MPSEARCH_TEST_ARTIFACTS"])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "report-chromium.png"
    path.write_bytes(png)
    return path


@pytest.mark.slow
def test_report_in_headless_chromium(run_dir: Path, tmp_path: Path, chromium: Any) -> None:
    browser = Page(chromium)
    page = write_report(run_dir, tmp_path / "report.html")
    drawn = browser.open(page)
    charts = {c["id"]: c for c in browser.evaluate(_CHARTS_JS)}
    assert set(charts) == CHARTS and int(drawn) == len(CHARTS)
    for chart in charts.values():  # every chart drawn, with marks, within a laptop's width
        assert chart["plotly"] and chart["svg"] >= 1 and chart["traces"] >= 1, chart
        assert chart["marks"] >= 1 and 300 < chart["width"] <= 1366 and chart["height"] > 200
    assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth")

    # hovering a front point shows its assignment; clicking selects it
    points = json.loads((run_dir / "front.json").read_text())["points"]
    target = points[1]
    xy = browser.evaluate(_FRONT_POINT_JS % target["index"])
    browser.page.mouse.move(xy["x"], xy["y"])
    hover = browser.wait_for("(document.querySelector('#chart-front .hoverlayer .hovertext')"
                             " || {}).textContent")
    assert f"point {target['index']}" in hover and target["differs_from_int8"][0] in hover
    browser.page.mouse.down()
    browser.page.mouse.up()
    command = browser.wait_for(f"(t => t.includes('--point {target['index']} ') && t)"
                               "(document.getElementById('point-command').textContent)")
    assert command == f"mpsearch export {run_dir} --point {target['index']} --out model.onnx"
    cells = browser.evaluate("Array.from(document.querySelectorAll('#point-rows tr'))"
                             ".map(r => [r.cells[1].textContent, r.cells[3].textContent])")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [c[0] for c in cells] == [n["name"] for n in summary["nodes"]]
    assert {n: f for n, f in cells if f != "-"} == target["assignment"]
    assert browser.evaluate("document.getElementById('chart-front').data"
                            ".find(d => d.uid === 'selected').x.length") == 1

    # the node selector swaps the distribution shown, with the node's flags listed
    flags = json.loads((run_dir / "distributions.json").read_text())["nodes"][0]["flags"]
    assert browser.evaluate("Array.from(document.querySelectorAll('#dist-flags li'))"
                            ".map(li => li.textContent)") == flags != []
    last = browser.evaluate("(s => { s.selectedIndex = s.options.length - 1; s.dispatchEvent("
                            "new Event('change')); return s.options[s.selectedIndex].textContent"
                            " })(document.getElementById('dist-select'))")
    title = browser.evaluate("document.getElementById('chart-distribution').layout.title.text")
    assert title.startswith(last)

    assert [u for u in browser.requests if not u.startswith(("file:", "data:", "blob:"))] == []
    browser.evaluate("window.scrollTo(0, 0); new Promise(r => setTimeout(r, 500))")
    png = browser.page.screenshot(type="png", full_page=True)
    shot = _save_artifact(png, tmp_path)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000

    # hostile node and metric names are shown, never run
    hostile = browser.open(write_report(_make_run(tmp_path / "hostile", hostile=True)))
    assert int(hostile) == len(CHARTS)
    assert browser.evaluate("typeof window.pwned") == "undefined"
    assert HOSTILE in browser.evaluate("document.getElementById('point-rows').textContent")


def test_front_shows_intervals_as_error_bars_and_hides_beaten_points() -> None:
    points = [{"index": 0, "metric": 0.9, "size": 100, "latency": 0.8,
               "interval": [0.7864, 0.9565], "dominated": False, "counts": {}},
              {"index": 1, "metric": 0.86, "size": 120, "latency": 1.3,
               "interval": [0.7381, 0.9305], "dominated": True, "shown": False,
               "beaten_by": "point 0", "counts": {}},
              {"index": 2, "metric": 0.95, "size": 300, "latency": 2.5, "counts": {}}]
    front = {"metric": "agreement", "higher_is_better": True, "points": points,
             "fp32": {}, "uniform": {}, "objectives": ["metric", "size", "latency"],
             "recommended": 0, "recommendation": "deploy point 0: ..."}
    trace = figs.figure_front(front, [])["data"][1]
    assert [c[0] for c in trace["customdata"]] == [0, 2]  # point 1 is not drawn
    assert trace["marker"]["symbol"] == ["star", "circle"]  # the recommended one a star
    assert [c[1] for c in trace["customdata"]] == ["1.25x faster than FP32",
                                                   "2.50x slower than FP32"]
    assert trace["error_y"]["array"] == pytest.approx([0.0565, 0.0])
    assert trace["error_y"]["arrayminus"] == pytest.approx([0.1136, 0.0])
    assert trace["customdata"][0][2] == "95 % interval [0.7864, 0.9565]"
    table = _front_table(front)
    assert '<p id="recommendation"><b>deploy point 0: ...</b></p>' in table
    shown, hidden = table.split('<details id="hidden-points">')
    rows = re.findall(r"<tr><td>(\d)</td><td>([^<]*)</td><td>([^<]*)</td><td>[^<]*</td>"
                      r"<td>([^<]*)</td><td>([^<]*)</td></tr>", shown)
    assert rows == [("0", "0.9", "[0.7864, 0.9565]", "1.25x faster than FP32",
                     "front, recommended"),
                    ("2", "0.95", "n/a", "2.50x slower than FP32", "front")]
    assert ("1 of 3 searched points hidden: beaten on held-out agreement, size and latency "
            "(point 1 by point 0)") in hidden
    assert re.findall(r"<tr><td>(\d)</td>.*?<td>([^<]*)</td></tr>", hidden) == [
        ("1", "beaten by point 0")]
    assert "error_y" not in figs.figure_front(
        {**front, "points": [{**p, "interval": None} for p in points]}, [])["data"][1]
