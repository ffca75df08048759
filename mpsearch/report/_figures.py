"""Figure builders of the HTML report: run-directory JSON in, plotly figure dicts out.

Every ``figure_*`` function is pure: it takes the parsed JSON of one run file (or the rows the
report's loader normalized from it) and returns a plain ``{"data": [...], "layout": {...}}``
dict that plotly.js draws as is. Nothing here imports plotly; tests check the dicts.
Text that plotly renders (tick labels, hover text, titles) goes through ``esc``, because
plotly interprets a small HTML subset and node names come from user models. The palette, the
base layout and axes, ``esc`` and the rounding come from :mod:`mpsearch.report._page`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mpsearch.report._page import CLASS_COLORS, esc, format_color, rebin, size_unit
from mpsearch.report._page import axis as _axis
from mpsearch.report._page import layout as _layout
from mpsearch.report._page import node_axis as _node_axis
from mpsearch.report._page import rounded as _r
from mpsearch.rundir import formats_text, latency_words

__all__ = ["figure_curve", "figure_distribution", "figure_flops", "figure_front",
           "figure_op_types", "figure_reverse", "figure_sensitivity"]

_PATTERNS = ("", "/", ".", "x")
_UNCLASSIFIED = "#9e9e9e"
_MAX_HOVER_NODES = 20

Figure = dict[str, Any]


# -- model summary ---------------------------------------------------------------------------
def figure_op_types(summary: Mapping[str, Any]) -> Figure:
    """Horizontal bars: how many nodes of each op type the model has."""
    items = sorted(summary.get("op_types", {}).items(), key=lambda kv: (kv[1], kv[0]))
    trace = {"type": "bar", "orientation": "h", "name": "nodes",
             "x": [n for _, n in items], "y": [esc(op) for op, _ in items],
             "marker": {"color": "#1f77b4"}, "hovertemplate": "%{y}: %{x} node(s)<extra></extra>"}
    height = max(260, 60 + 22 * len(items))
    return {"data": [trace], "layout": _layout(
        "Op types", height, showlegend=False, xaxis=_axis("nodes (count)"),
        yaxis=_axis("op type", type="category"))}


def figure_flops(summary: Mapping[str, Any]) -> Figure:
    """FLOPs per node in topological order, quantizable nodes in blue, the rest in grey."""
    nodes = list(summary.get("nodes", ()))
    scale, unit = size_unit(max((int(n.get("flops", 0)) for n in nodes), default=0), prefix=True)
    data = []
    for quantizable, name, color in ((True, "quantizable", "#1f77b4"),
                                     (False, "kept in float", "#7f7f7f")):
        rows = [n for n in nodes if bool(n.get("quantizable")) is quantizable]
        if not rows:
            continue
        data.append({
            "type": "bar", "name": name, "marker": {"color": color},
            "x": [esc(n["name"]) for n in rows],
            "y": [_r(int(n.get("flops", 0)) / scale) for n in rows],
            "customdata": [[esc(n.get("op_type", "")), f"{int(n.get('params', 0)):,}",
                            f"{int(n.get('macs', 0)):,}", esc(n.get("reason") or "-")]
                           for n in rows],
            "hovertemplate": f"<b>%{{x}}</b> (%{{customdata[0]}})<br>%{{y}} {unit}FLOPs<br>"
                             "params %{customdata[1]}<br>MACs %{customdata[2]}<br>"
                             "why float: %{customdata[3]}<extra></extra>",
        })
    return {"data": data, "layout": _layout(
        "FLOPs per node (topological order)", 420, barmode="overlay",
        xaxis=_node_axis([str(n["name"]) for n in nodes]),
        yaxis=_axis(f"{unit}FLOPs per inference" if unit else "FLOPs per inference"))}


# -- sensitivity -----------------------------------------------------------------------------
def _sqnr(row: Mapping[str, Any]) -> float | None:
    value = row.get("sqnr")
    return row.get("proxy_sqnr") if value is None else value


def figure_sensitivity(rows: Sequence[Mapping[str, Any]], order: Sequence[str],
                       formats: Sequence[str], metric: str) -> Figure:
    """Bars per node (``order``) and format: metric drop, colored by class low/medium/high.

    ``rows``: ``NodeSensitivity.to_dict()`` rows (``node, format, drop, sqnr, proxy_sqnr, cls,
    rank``); one bar group per format, told apart by a fill pattern. Buttons switch the bars
    between metric drop and SQNR; SQNR is shown first when no drop was measured (proxy mode).
    """
    data: list[dict[str, Any]] = []
    position = {name: i for i, name in enumerate(order)}
    for index, fmt in enumerate(formats):
        pattern = _PATTERNS[index % len(_PATTERNS)]
        for cls, color in CLASS_COLORS.items():
            picked = sorted((r for r in rows if r.get("format") == fmt and r.get("node") in
                             position and (r.get("cls") or r.get("class") or "low") == cls),
                            key=lambda r: position[r["node"]])
            if not picked:
                continue
            data.append({
                "type": "bar", "name": f"{esc(fmt).upper()} · {cls}", "offsetgroup": fmt,
                "legendgroup": fmt, "x": [esc(r["node"]) for r in picked],
                "marker": {"color": color, "pattern": {"shape": pattern},
                           "line": {"color": format_color(fmt), "width": 1}},
                "customdata": [[_r(r.get("drop")), _r(_sqnr(r), 4), r.get("rank")]
                               for r in picked],
                "hovertemplate": (f"<b>%{{x}}</b> {esc(fmt).upper()} ({cls})<br>"
                                  f"{esc(metric)} drop %{{customdata[0]}}<br>"
                                  "SQNR %{customdata[1]} dB<br>rank %{customdata[2]}"
                                  "<extra></extra>"),
            })
    views = {"metric drop": (0, f"{esc(metric)} drop vs FP32"),
             "SQNR (dB)": (1, "output SQNR (dB)")}
    return {"data": data, "layout": _layout(
        "Sensitivity per node: one node quantized at a time, the rest FP32", 480,
        barmode="group", bargap=0.25, margin={"l": 70, "r": 30, "t": 95, "b": 60},
        xaxis=_node_axis(order), **_switch_views(data, views))}


def _switch_views(data: Sequence[dict[str, Any]], views: Mapping[str, tuple[int, str]]
                  ) -> dict[str, Any]:
    """Buttons that switch every bar trace between ``views`` (label -> (customdata column,
    y-axis title)); the first view is shown unless it has no values, then the last. Sets each
    trace's ``y``; returns the layout's ``yaxis`` and ``updatemenus``."""
    names = list(views)
    if not any(c[views[names[0]][0]] is not None for t in data for c in t["customdata"]):
        names.reverse()
    for trace in data:
        trace["y"] = [c[views[names[0]][0]] for c in trace["customdata"]]
    buttons = [{"label": name, "method": "update",
                "args": [{"y": [[c[views[name][0]] for c in t["customdata"]] for t in data]},
                         {"yaxis.title.text": views[name][1]}]} for name in names]
    return {"yaxis": _axis(views[names[0]][1]),
            "updatemenus": [{"type": "buttons", "direction": "right", "buttons": buttons,
                             "x": 0.0, "xanchor": "left", "y": 1.02, "yanchor": "bottom",
                             "showactive": True}]}


def figure_reverse(rows: Sequence[Mapping[str, Any]], order: Sequence[str],
                   classes: Mapping[str, str], metric: str, base: float | None = None
                   ) -> Figure:
    """Bars per node (``order``): the gain when that node alone is restored to FP32.

    ``rows``: ``RestoreGain.to_dict()`` rows (``node, format, gain, sqnr_gain, rank``), gains
    over the model with every node in its lowest analyzed format (``base``: its metric).
    ``classes``: node -> its class in the sensitivity view, for the same colors (grey when
    unknown). Buttons switch the bars between metric gain and SQNR gain.
    """
    position = {name: i for i, name in enumerate(order)}
    data: list[dict[str, Any]] = []
    for cls, color in {**CLASS_COLORS, "unclassified": _UNCLASSIFIED}.items():
        picked = sorted((r for r in rows if r.get("node") in position
                         and classes.get(r["node"], "unclassified") == cls),
                        key=lambda r: position[r["node"]])
        if picked:
            data.append({
                "type": "bar", "name": cls, "x": [esc(r["node"]) for r in picked],
                "marker": {"color": color},
                "customdata": [[_r(r.get("gain")), _r(r.get("sqnr_gain"), 4), r.get("rank"),
                                esc(r.get("format", "?")).upper()] for r in picked],
                "hovertemplate": (f"<b>%{{x}}</b> ({cls}), FP32 instead of %{{customdata[3]}}"
                                  f"<br>{esc(metric)} gain %{{customdata[0]}}<br>SQNR gain "
                                  "%{customdata[1]} dB<br>rank %{customdata[2]}<extra></extra>"),
            })
    views = {"metric gain": (0, f"{esc(metric)} gain vs all quantized"),
             "SQNR gain (dB)": (1, "output SQNR gain (dB)")}
    shown = _r(base, 4)
    quantized = "" if shown is None else f" (all quantized: {esc(metric)} {shown})"
    return {"data": data, "layout": _layout(
        f"Gain when restored to FP32: one node FP32 at a time, the rest quantized{quantized}",
        420, barmode="overlay", margin={"l": 70, "r": 30, "t": 95, "b": 60},
        xaxis=_node_axis(order), **_switch_views(data, views))}


# -- distributions ---------------------------------------------------------------------------
def _positions(edges: Sequence[float]) -> dict[str, Any]:
    """Bin positions for a trace: ``x0``/``dx`` when the bins are uniform, else ``x``."""
    widths = [b - a for a, b in zip(edges[:-1], edges[1:], strict=True)]
    if max(widths) - min(widths) <= 1e-6 * max(abs(edges[0]), abs(edges[-1]), 1e-30):
        return {"x0": _r((edges[0] + edges[1]) / 2), "dx": _r(widths[0])}
    return {"x": [_r((a + b) / 2) for a, b in zip(edges[:-1], edges[1:], strict=True)]}


def _histogram_traces(hist: Mapping[str, Any], axis: str, seen: set[str]
                      ) -> list[dict[str, Any]]:
    """FP32 bars, then one step line per quantized format (the first shown, the rest in the
    legend only). ``seen`` holds the legend groups already in the legend."""
    edges, fp32 = rebin(hist["edges"], hist["fp32"])
    at = {**_positions(edges), "xaxis": f"x{axis}", "yaxis": f"y{axis}"}
    width = at.get("dx") or [_r(b - a) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    traces: list[dict[str, Any]] = [{
        "type": "bar", "name": "FP32", "legendgroup": "fp32", "y": fp32, "width": width, **at,
        "marker": {"color": "#1f77b4", "opacity": 0.55},
        "hovertemplate": "FP32 around %{x}: %{y} elements<extra></extra>"}]
    for index, (fmt, data) in enumerate(hist.get("formats", {}).items()):
        traces.append({
            "type": "scatter", "mode": "lines", "name": f"{esc(fmt).upper()} (dequantized)",
            "legendgroup": fmt, "visible": True if index == 0 else "legendonly",
            "line": {"shape": "hvh", "width": 1.5,
                     "color": "#d62728" if index == 0 else format_color(fmt)},
            "y": rebin(hist["edges"], data["quantized"])[1], **at,
            "hovertemplate": f"{esc(fmt).upper()} around %{{x}}: %{{y}} elements<extra></extra>"})
    for trace in traces:
        trace["showlegend"] = trace["legendgroup"] not in seen
        seen.add(trace["legendgroup"])
    return traces


def _clip_shapes(hist: Mapping[str, Any], axis: str) -> list[dict[str, Any]]:
    clip = hist.get("clip")
    if not clip or len(clip) != 2:
        return []
    return [{"type": "line", "xref": f"x{axis}", "yref": f"y{axis} domain", "x0": _r(v),
             "x1": _r(v), "y0": 0, "y1": 1, "line": {"color": "#000000", "dash": "dash",
                                                     "width": 1.5}} for v in clip]


def _stats_line(hist: Mapping[str, Any]) -> str:
    stats, fmt = hist.get("stats") or {}, str(hist.get("format") or "")
    parts = [f"{k} {stats[k]:.3g}" for k in ("min", "max", "std", "kurtosis")
             if isinstance(stats.get(k), int | float)]
    shown = (hist.get("formats") or {}).get(fmt) or {}
    if isinstance(shown.get("sqnr"), int | float):
        parts.append(f"SQNR {shown['sqnr']:.1f} dB ({esc(fmt).upper()})")
    if isinstance(stats.get("clipped"), int | float):
        parts.append(f"clipped {100 * stats['clipped']:.2f} %")
    return ", ".join(parts)


def figure_distribution(entry: Mapping[str, Any]) -> Figure:
    """Weights (left) and activations (right) of one node: FP32 bars, dequantized steps.

    ``entry``: ``{node, op_type, weight, activation, flags, codes}``; each histogram is
    ``{tensor, edges, fp32, format, clip, stats, formats: {name: {quantized, clip, sqnr}}}`` or
    None. Dashed lines mark the clipping range of the first format; the flags' short codes
    (else the flags) go under the title.
    """
    data: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    seen: set[str] = set()
    for axis, key, label, x0 in (("", "weight", "weights", 0.0), ("2", "activation",
                                                                   "output activations", 0.55)):
        hist = entry.get(key)
        name = f" {esc(hist.get('tensor'))}" if hist and hist.get("tensor") else ""
        annotations.append({"text": f"<b>{label}</b>{name}", "xref": "paper", "yref": "paper",
                            "x": x0, "y": 1.02, "xanchor": "left", "yanchor": "bottom",
                            "showarrow": False})
        if hist:
            data += _histogram_traces(hist, axis, seen)
            shapes += _clip_shapes(hist, axis)
            annotations.append({"text": _stats_line(hist), "xref": "paper", "yref": "paper",
                                "x": x0, "y": -0.28, "xanchor": "left", "yanchor": "top",
                                "showarrow": False, "font": {"size": 11, "color": "#555555"}})
        else:
            annotations.append({"text": f"no {label}", "xref": f"x{axis} domain",
                                "yref": f"y{axis} domain", "x": 0.5, "y": 0.5,
                                "showarrow": False, "font": {"color": "#7f7f7f"}})
    codes = [str(c) for c in entry.get("codes", ())] or [str(f) for f in entry.get("flags", ())]
    title = f"{esc(entry.get('node', '?'))} ({esc(entry.get('op_type', '?'))})"
    if codes:
        title += " <span style=\"color:#d62728\">⚠ " + esc(", ".join(codes)) + "</span>"
    log_buttons = [{"label": scale, "method": "relayout",
                    "args": [{"yaxis.type": scale, "yaxis2.type": scale}]}
                   for scale in ("linear", "log")]
    return {"data": data, "layout": _layout(
        title, 440, bargap=0, shapes=shapes, annotations=annotations,
        margin={"l": 70, "r": 30, "t": 80, "b": 90},
        xaxis=_axis("weight value", domain=[0.0, 0.45]),
        yaxis=_axis("count (elements)", anchor="x"),
        xaxis2=_axis("activation value", domain=[0.55, 1.0]),
        yaxis2=_axis("count (elements)", anchor="x2"),
        updatemenus=[{"type": "buttons", "direction": "right", "buttons": log_buttons,
                      "x": 1.0, "xanchor": "right", "y": 1.02, "yanchor": "bottom"}])}


# -- node-by-node curve ----------------------------------------------------------------------
def figure_curve(orders: Mapping[str, Sequence[Mapping[str, Any]]], metric: str,
                 fp32_metric: float | None = None) -> Figure:
    """Metric (top) and model size (bottom) as nodes are quantized one after another.

    ``orders``: order name (``topological``, ``sensitivity``) -> steps ``{step, node, metric,
    size, format}``; step 0 is the FP32 model.
    """
    metric = esc(metric)
    sizes = [s.get("size") or 0 for steps in orders.values() for s in steps]
    scale, unit = size_unit(max(sizes, default=0))
    colors = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")
    data = []
    for index, (name, steps) in enumerate(orders.items()):
        color = colors[index % len(colors)]
        nodes = [esc(s.get("node") or "FP32 model") for s in steps]
        common: dict[str, Any] = {
            "mode": "lines+markers", "legendgroup": esc(name), "x": [s.get("step") for s in steps],
            "line": {"color": color}, "marker": {"size": 5}, "customdata": nodes}
        data.append({**common, "type": "scatter", "name": f"{esc(name)} order",
                     "y": [_r(s.get("metric")) for s in steps], "xaxis": "x", "yaxis": "y",
                     "hovertemplate": f"step %{{x}}: +%{{customdata}}<br>{metric} %{{y}}"
                                      "<extra></extra>"})
        data.append({**common, "type": "scatter", "name": f"{esc(name)} order",
                     "showlegend": False,
                     "y": [_r((s.get("size") or 0) / scale) for s in steps], "xaxis": "x2",
                     "yaxis": "y2", "hovertemplate": f"step %{{x}}: +%{{customdata}}<br>"
                                                     f"%{{y}} {unit}<extra></extra>"})
    shapes = []
    if fp32_metric is not None:
        shapes.append({"type": "line", "xref": "x domain", "yref": "y", "x0": 0, "x1": 1,
                       "y0": _r(fp32_metric), "y1": _r(fp32_metric),
                       "line": {"color": "#7f7f7f", "dash": "dot"}})
    return {"data": data, "layout": _layout(
        "Node-by-node curve: nodes quantized cumulatively", 560, shapes=shapes,
        margin={"l": 70, "r": 30, "t": 80, "b": 60},
        legend={"orientation": "h", "x": 0.0, "y": 1.02, "yanchor": "bottom"},
        xaxis=_axis("", anchor="y", matches="x2", showticklabels=False),
        yaxis=_axis(f"{metric} (dotted = FP32)", domain=[0.55, 1.0]),
        xaxis2=_axis("nodes quantized (count)", anchor="y2"),
        yaxis2=_axis(f"model size ({unit})", domain=[0.0, 0.42]))}


# -- Pareto front ----------------------------------------------------------------------------
def _assignment_hover(point: Mapping[str, Any]) -> str:
    counts = esc(formats_text(point.get("counts", {})))
    assignment = point.get("assignment", {})
    differs = list(point.get("differs_from_int8", ()))
    lines = [f"<b>point {esc(point.get('index'))}</b> (trial {esc(point.get('trial'))})",
             counts]
    if differs:
        lines.append("not INT8:")
        lines += [f"  {esc(n)}: {esc(assignment.get(n, '?'))}"
                  for n in differs[:_MAX_HOVER_NODES]]
        if len(differs) > _MAX_HOVER_NODES:
            lines.append(f"  … and {len(differs) - _MAX_HOVER_NODES} more")
    else:
        lines.append("every quantizable node INT8")
    return "<br>".join(lines)


def latency_label(front: Mapping[str, Any]) -> str:
    """'latency' when the front's latencies were timed on this host, else 'est. latency'."""
    return "latency" if front.get("latency_source") == "measured" else "est. latency"


def _latency_marker(latencies: Sequence[float | None], label: str) -> dict[str, Any]:
    """Front markers colored by latency (with a color bar) when every point has one."""
    marker: dict[str, Any] = {"size": 11, "line": {"color": "#333333", "width": 1}}
    if latencies and all(v is not None for v in latencies):
        marker.update(color=[_r(v) for v in latencies], colorscale="Viridis", showscale=True,
                      colorbar={"title": {"text": f"{label}<br>(× FP32,<br>below 1: faster)"}})
    else:
        marker["color"] = "#1f77b4"
    return marker


def _interval_bars(points: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Asymmetric error bars of the held-out 95 % intervals (None when no point has one)."""
    intervals = [p.get("interval") for p in points]
    if not any(intervals):
        return None
    up = [_r(i[1] - p["metric"]) if i else 0 for p, i in zip(points, intervals, strict=True)]
    down = [_r(p["metric"] - i[0]) if i else 0 for p, i in zip(points, intervals, strict=True)]
    return {"type": "data", "symmetric": False, "array": up, "arrayminus": down,
            "color": "#555555", "thickness": 1, "width": 4}


def _interval_text(point: Mapping[str, Any]) -> str:
    interval = point.get("interval")
    return f"95 % interval [{_r(interval[0])}, {_r(interval[1])}]" if interval else ""


def figure_front(front: Mapping[str, Any], trials: Sequence[Mapping[str, Any]]) -> Figure:
    """Metric vs size of the shown Pareto front (color = latency), each point with its
    held-out 95 % interval as an error bar, and below it, on an axis of its own, every trial
    on the search split (not comparable with the held-out numbers above); the points a
    baseline or another point beats after the re-measure are left out (``shown`` false), the
    recommended one is a star.

    Trace 1 (``uid`` ``front``) carries the point index in ``customdata``; the report's script
    selects a point on click. The last trace (``uid`` ``selected``) rings the selected point.
    """
    metric = esc(front.get("metric", "metric"))
    points = [p for p in front.get("points", ())
              if p.get("metric") is not None and p.get("shown", True)]
    refs = {"FP32": front.get("fp32") or {}, **{k.upper(): v for k, v in
                                                (front.get("uniform") or {}).items()}}
    sizes = [p.get("size") or 0 for p in points] + [t.get("size") or 0 for t in trials]
    sizes += [r.get("size") or 0 for r in refs.values()]
    scale, unit = size_unit(max(sizes, default=0))
    done = [t for t in trials if t.get("metric") is not None and t.get("size") is not None]
    label = latency_label(front)
    marker = _latency_marker([p.get("latency") for p in points], label)
    marker["symbol"] = ["star" if p.get("index") == front.get("recommended") else "circle"
                        for p in points]
    known = "colorbar" in marker
    data: list[dict[str, Any]] = [
        {"type": "scatter", "mode": "markers", "name": "all trials (search split)",
         "uid": "trials", "yaxis": "y2",
         "x": [_r(t["size"] / scale) for t in done], "y": [_r(t["metric"]) for t in done],
         "marker": {"color": "#9e9e9e", "size": 5, "opacity": 0.35},
         "customdata": [[t.get("trial"), esc(t.get("source", "")), esc(t.get("state", ""))]
                        for t in done],
         "hovertemplate": "trial %{customdata[0]} (%{customdata[1]}, %{customdata[2]})<br>"
                          f"%{{x}} {unit}, {metric} %{{y}}<extra></extra>"},
        {"type": "scatter", "mode": "markers", "name": "Pareto front (held-out)", "uid": "front",
         "x": [_r(p["size"] / scale) for p in points], "y": [_r(p["metric"]) for p in points],
         "customdata": [[p.get("index"), latency_words(p, front.get("fp32") or {},
                                                      batch=front.get("latency_batch"),
                                                      source=front.get("latency_source")),
                         _interval_text(p)]
                        for p in points],
         "marker": marker,
         "hovertext": [_assignment_hover(p) for p in points],
         "hovertemplate": f"%{{hovertext}}<br>{metric} %{{y}}, %{{x}} {unit}"
                          + "<br>%{customdata[2]}"
                          + (f"<br>{label}: %{{customdata[1]}}" if known else "")
                          + "<br><i>click to select</i><extra></extra>"},
    ]
    bars = _interval_bars(points)
    if bars is not None:
        data[1]["error_y"] = bars
    ref_rows = [(name, r) for name, r in refs.items() if r.get("metric") is not None]
    if ref_rows:
        data.append({
            "type": "scatter", "mode": "markers+text", "name": "FP32 / uniform", "uid": "refs",
            "x": [_r((r.get("size") or 0) / scale) for _, r in ref_rows],
            "y": [_r(r["metric"]) for _, r in ref_rows], "text": _ref_labels(ref_rows, points),
            "textposition": "bottom center",
            "marker": {"symbol": "diamond", "size": 11, "color": "#ffffff",
                       "line": {"color": "#000000", "width": 1.5}},
            "hovertemplate": f"%{{text}}: {metric} %{{y}}, %{{x}} {unit}<extra></extra>"})
    data.append({"type": "scatter", "mode": "markers", "name": "selected", "uid": "selected",
                 "x": [], "y": [], "hoverinfo": "skip", "marker": {
                     "size": 22, "color": "rgba(0,0,0,0)",
                     "line": {"color": "#d62728", "width": 3}}})
    better = "higher" if front.get("higher_is_better", True) else "lower"
    return {"data": data, "layout": _layout(
        "Pareto front: held-out metric vs model size", 640, hoverlabel={"align": "left"},
        margin={"l": 70, "r": 30, "t": 80, "b": 60},
        legend={"orientation": "h", "x": 0.0, "y": 1.02, "yanchor": "bottom"},
        xaxis=_axis(f"model size ({unit})", anchor="y2"),
        yaxis=_axis(f"{metric} (held-out, {better} is better)", domain=[0.34, 1.0]),
        yaxis2=_axis(f"{metric}, every trial (search split)", domain=[0.0, 0.24],
                     anchor="x"))}


def _ref_labels(refs: Sequence[tuple[str, Mapping[str, Any]]],
                points: Sequence[Mapping[str, Any]]) -> list[str]:
    """The baselines' labels; baselines at (nearly) one place share one label ("INT8 /
    INT16") instead of printing over each other."""
    xs = [float(r.get("size") or 0) for _, r in refs] + [float(p["size"] or 0) for p in points]
    ys = [float(r["metric"]) for _, r in refs] + [float(p["metric"]) for p in points]
    x_span, y_span = max(max(xs) - min(xs), 1e-9), max(max(ys) - min(ys), 1e-9)
    texts = [esc(n) for n, _ in refs]
    for i, (_, r) in enumerate(refs):
        for j in range(i):
            other = refs[j][1]
            if texts[j] and abs(float(r.get("size") or 0) - float(other.get("size") or 0)) \
                    < 0.05 * x_span and abs(float(r["metric"]) - float(other["metric"])) \
                    < 0.05 * y_span:
                texts[j], texts[i] = f"{texts[j]} / {texts[i]}", ""
                break
    return texts
