"""The page of the HTML report and the look it shares with its figures.

Consumes the parsed run files and the payload :mod:`mpsearch.report` built (figure dicts from
:mod:`mpsearch.report._figures`, the Pareto front's table data); produces the HTML document:
the CSS, the script that draws the charts, swaps the node shown in the distribution view and
fills the selected Pareto point's table, and the HTML of each section. A section whose file is
missing says "not run". Every text from the run (node names come from user models) is escaped.

It also holds what the figures share with the page: the palette, the plotly layout and axes
every figure starts from, text escaping, size units, and the re-binning that keeps the embedded
histograms small. Nothing here imports plotly.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from mpsearch._io import json_finite
from mpsearch.report._target import target_html
from mpsearch.rundir import latency_words, versus_fp32

__all__ = ["CLASS_COLORS", "MAX_BINS", "axis", "esc", "format_color", "layout", "node_axis",
           "rebin", "render_page", "rounded", "size_unit"]

MAX_BINS = 64
CLASS_COLORS = {"low": "#2ca02c", "medium": "#ff7f0e", "high": "#d62728"}
_FORMAT_COLORS = {"int8": "#1f77b4", "int16": "#9467bd", "fp16": "#17becf", "fp32": "#7f7f7f"}
_OTHER_COLORS = ("#8c564b", "#e377c2", "#bcbd22", "#17becf")
_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}
_MAX_LABELED_NODES = 150
_LABEL_CHARS = 28


# -- the look, shared with the figures ------------------------------------------------------
def esc(text: object) -> str:
    """``text`` escaped for plotly's HTML-subset labels (and for HTML)."""
    return html.escape(str(text), quote=True)


def format_color(name: str) -> str:
    """A stable color for a format name (int8 blue, int16 purple, fp32 grey)."""
    return _FORMAT_COLORS.get(name, _OTHER_COLORS[sum(map(ord, name)) % len(_OTHER_COLORS)])


def rounded(value: float | None, digits: int = 5) -> float | None:
    """``value`` rounded to ``digits`` significant digits (keeps the embedded JSON small)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def _count(value: float) -> float:
    """A histogram count for the page: integral counts as ints, others to 5 digits."""
    return int(value) if float(value).is_integer() else (rounded(float(value)) or 0.0)


def size_unit(max_bytes: float, prefix: bool = False) -> tuple[float, str]:
    """(divisor, label) for values up to ``max_bytes``: B, kB, MB or GB (decimal); with
    ``prefix`` only the SI prefix ("", k, M, G)."""
    scale, label = next(((s, u) for s, u in ((1e9, "G"), (1e6, "M"), (1e3, "k"))
                         if max_bytes >= s), (1.0, ""))
    return scale, label if prefix else f"{label}B"


def rebin(edges: Sequence[float], counts: Sequence[float], max_bins: int = MAX_BINS
          ) -> tuple[list[float], list[float]]:
    """Merge adjacent bins until at most ``max_bins`` remain (counts are summed)."""
    n = len(counts)
    if len(edges) != n + 1:
        raise ValueError(f"histogram has {len(edges)} edges for {n} counts; need counts + 1")
    step = max(1, math.ceil(n / max_bins))
    merged = [_count(sum(counts[i:i + step])) for i in range(0, n, step)]
    new_edges = [float(edges[i]) for i in range(0, n, step)] + [float(edges[n])]
    return new_edges, merged


def layout(title: str, height: int, **extra: Any) -> dict[str, Any]:
    """A figure layout: title top left, system font, white background; ``extra`` on top."""
    result: dict[str, Any] = {
        "title": {"text": title, "x": 0.01, "xanchor": "left", "y": 0.985,
                  "yanchor": "top"},
        "height": height, "autosize": True, "font": _FONT, "hovermode": "closest",
        "margin": {"l": 70, "r": 30, "t": 60, "b": 60},
        "plot_bgcolor": "#ffffff", "paper_bgcolor": "#ffffff",
    }
    result.update(extra)
    return result


def axis(title: str, **extra: Any) -> dict[str, Any]:
    """An axis titled ``title`` with light grid lines; ``extra`` on top."""
    result: dict[str, Any] = {"title": {"text": title}, "automargin": True,
                              "gridcolor": "#e5e5e5", "zerolinecolor": "#bbbbbb"}
    result.update(extra)
    return result


def node_axis(order: Sequence[str]) -> dict[str, Any]:
    """A categorical x axis of node names in ``order``: short tick labels, full names on hover.

    With more than ``_MAX_LABELED_NODES`` nodes the labels are hidden (hover still names them).
    """
    names = [esc(n) for n in order]
    if len(names) > _MAX_LABELED_NODES:
        return axis("node (topological order; hover for names)", type="category",
                    categoryorder="array", categoryarray=names, showticklabels=False)
    short = [esc(n if len(n) <= _LABEL_CHARS else "…" + n[-_LABEL_CHARS + 1:]) for n in order]
    return axis("node (topological order)", type="category", categoryorder="array",
                categoryarray=names, tickmode="array", tickvals=names, ticktext=short,
                tickangle=-45, automargin="height+left+right")


# -- the page --------------------------------------------------------------------------------
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222}
header,main{max-width:1240px;margin:0 auto;padding:0 16px}
header{padding-top:12px}h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:0 0 8px}
nav{position:sticky;top:0;background:#f6f8fa;border-bottom:1px solid #ddd;padding:6px 16px;
z-index:10}nav a{margin-right:14px;color:#0b5cad;text-decoration:none}
section{border-top:1px solid #e3e3e3;padding:14px 0}.muted{color:#666}
.chart{width:100%;min-height:260px}.grid{display:grid;grid-template-columns:minmax(0,1fr)
minmax(0,2fr);gap:12px}@media (max-width:900px){.grid{grid-template-columns:minmax(0,1fr)}}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #eee;
padding:3px 8px;text-align:left;vertical-align:top}th{background:#f6f8fa;position:sticky;top:0}
.scroll{max-height:420px;overflow:auto;border:1px solid #e3e3e3;margin:8px 0}
.notrun{background:#fff8e1;border:1px solid #f0d58c;padding:8px 12px}
.fmt{display:inline-block;padding:0 6px;border-radius:3px;color:#fff}
.flags{color:#c62828}code{background:#f3f3f3;padding:2px 6px;border-radius:3px}
#mpsearch-errors{background:#fdecea;color:#b71c1c;padding:8px 16px;display:none}
"""
_ERRORS_JS = ("window.mpsearchErrors=[];addEventListener('error',function(e){"
              "mpsearchErrors.push(String(e.message))});addEventListener('unhandledrejection',"
              "function(e){mpsearchErrors.push(String(e.reason))});")
_SCRIPT = """(function () { "use strict";
function $(id) { return document.getElementById(id); }
var D = JSON.parse($("mpsearch-data").textContent), drawn = [],
    CFG = {responsive: true, displaylogo: false};
function plot(id, f) {
  try { Plotly.newPlot($(id), f.data, f.layout, CFG); drawn.push(id); }
  catch (e) { mpsearchErrors.push(id + ": " + e); $(id).textContent = "chart failed: " + e; }
}
Object.keys(D.charts).forEach(function (id) { plot(id, D.charts[id]); });
// distributions: the selector swaps the figure and lists the node's flags
var ds = $("dist-select");
function flags() {
  $("dist-flags").replaceChildren.apply($("dist-flags"), D.flags[+ds.value].map(function (t) {
    var li = document.createElement("li"); li.textContent = t; return li; }));
}
if (ds && D.distributions.length) {
  plot("chart-distribution", D.distributions[0]); flags();
  ds.addEventListener("change", function () {
    var f = D.distributions[+ds.value];
    Plotly.react("chart-distribution", f.data, f.layout, CFG); flags(); });
}
// Pareto front: clicking a point (or the selector) fills the table and the export command
var F = D.front, gd = $("chart-front");
function num(v, d) { return v === null || v === undefined ? "n/a" : (+v).toFixed(d); }
function size(b) {
  var u = [[1e9, "GB"], [1e6, "MB"], [1e3, "kB"], [1, "B"]].filter(function (u) {
    return b >= u[0]; })[0] || [1, "B"];
  return (b / u[0]).toFixed(2) + " " + u[1];
}
function cell(tr, text) {
  var td = document.createElement("td"); td.textContent = text; tr.appendChild(td); return td;
}
function select(k) {
  var p = F.points.filter(function (q) { return q.index === k; })[0];
  if (!p) return;
  var uids = gd.data.map(function (t) { return t.uid; }), t = gd.data[uids.indexOf("front")];
  var j = t.customdata.map(function (c) { return c[0]; }).indexOf(k);
  Plotly.restyle(gd, {x: [j < 0 ? [] : [t.x[j]]], y: [j < 0 ? [] : [t.y[j]]]},
                 [uids.indexOf("selected")]);
  $("point-summary").textContent = "Point " + k + ": " + F.metric + " " + num(p.metric, 4) +
    ", size " + size(p.size) + ", " + F.latency_label + " " + p.speed +
    (k === F.recommended ? " (recommended)" : "") + "; " +
    Object.keys(p.counts).map(function (f) { return f + " " + p.counts[f]; }).join(", ");
  $("point-command").textContent =
    "mpsearch export " + F.run_dir + " --point " + k + " --out model.onnx";
  $("point-rows").replaceChildren.apply($("point-rows"), F.nodes.map(function (n, i) {
    var tr = document.createElement("tr"), f = p.formats[i];
    cell(tr, i + 1); cell(tr, n[0]); cell(tr, n[1]);
    var badge = document.createElement("span"); badge.className = "fmt";
    badge.textContent = f < 0 ? "-" : F.formats[f];
    badge.style.background = f < 0 ? "#bbb" : F.colors[f];
    cell(tr, "").appendChild(badge); cell(tr, n[2] || "-"); return tr; }));
  $("point-select").value = String(k);
}
if (F && gd && gd.on) {
  gd.on("plotly_click", function (e) {
    var p = e.points.filter(function (q) { return q.data.uid === "front"; })[0];
    if (p) select(p.customdata[0]); });
  $("point-select").addEventListener("change", function () { select(+this.value); });
  $("point-copy").addEventListener("click", function () {
    try { navigator.clipboard.writeText($("point-command").textContent); } catch (e) {} });
  var m = /point=(\\d+)/.exec(location.hash);
  select(m ? +m[1] : F["default"]);
}
if (mpsearchErrors.length) {
  $("mpsearch-errors").style.display = "block";
  $("mpsearch-errors").textContent = "Errors while drawing: " + mpsearchErrors.join(" | ");
}
document.body.setAttribute("data-drawn", String(drawn.length));
window.mpsearchReport = {drawn: drawn, select: select};
})();"""


_SENSITIVITY_NOTE = (
    '<p class="muted">Each bar: the model with only that node quantized. Taller metric drop or '
    "lower SQNR = more sensitive; colors are the classes low / medium / high, hatching tells "
    "the formats apart.</p>")

_REVERSE_NOTE = (
    '<p class="muted">Each bar: every node quantized except that one, kept in FP32; taller = '
    "more worth keeping in higher precision. Colors as above.</p>")

_REVERSE_NOT_RUN = (
    '<p class="notrun">Reverse view: not run (<code>sensitivity.json</code> has no reverse '
    "rows). Run `mpsearch analyze` without <code>--no-reverse</code> or "
    "<code>--proxy</code>.</p>")

_DISTRIBUTION_NOTE = (
    '<p class="muted">Bars: FP32 values; steps: the same values quantized and dequantized '
    "(other formats in the legend); dashed lines: the clipping range.</p>")


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], scroll: bool = False
           ) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="scroll">{table}</div>' if scroll else table


def _not_run(what: str, file: str, how: str) -> str:
    return (f'<p class="notrun">{esc(what)}: not run (no <code>{esc(file)}</code> in the run '
            f"directory). {esc(how)}</p>")


def _chart(chart_id: str, charts: Mapping[str, Any]) -> str:
    return f'<div class="chart" id="{chart_id}"></div>' if chart_id in charts else ""


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else "n/a"


def _shape(shape: Any) -> str:
    return "?" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


def _summary_html(summary: Any, charts: Mapping[str, Any]) -> str:
    if not isinstance(summary, Mapping):
        return _not_run("Model summary", "summary.json", "Run `mpsearch analyze` or search.")
    totals = [("model", f"{summary.get('model')} (opset {summary.get('opset')})"),
              *((f"input {n}", f"{_shape(s)} {d}") for n, s, d in summary.get("inputs", ())),
              *((f"output {n}", f"{_shape(s)} {d}") for n, s, d in summary.get("outputs", ())),
              ("parameters", f"{summary.get('params', 0):,}"),
              ("MACs", f"{summary.get('macs', 0):,}"), ("FLOPs", f"{summary.get('flops', 0):,}"),
              ("weight bytes", f"{summary.get('weight_bytes', 0):,}"),
              ("nodes", f"{len(summary.get('nodes', ()))} ({summary.get('quantizable')} "
                        "quantizable)"),
              *(("normalized", c) for c in summary.get("changes", ()))]
    nodes = [(i + 1, n.get("name"), n.get("op_type"),
              " ".join(_shape(s) for s in n.get("input_shapes", ())),
              " ".join(_shape(s) for s in n.get("output_shapes", ())), f"{n.get('params', 0):,}",
              f"{n.get('macs', 0):,}", f"{n.get('flops', 0):,}",
              "yes" if n.get("quantizable") else f"no: {n.get('reason') or '-'}")
             for i, n in enumerate(summary.get("nodes", ()))]
    return (f'<div class="grid"><div>{_table(["total", "value"], totals)}</div>'
            f'{_chart("chart-op-types", charts)}</div>{_chart("chart-flops", charts)}'
            "<details><summary>Per-node table (topological order)</summary>"
            + _table(["#", "node", "op", "input shapes", "output shapes", "params", "MACs",
                      "FLOPs", "quantizable"], nodes, scroll=True) + "</details>")


def _tensor(t: Mapping[str, Any]) -> str:
    if str(t.get("dtype", "")).startswith("float"):
        return str(t.get("dtype"))
    kind = "sym" if t.get("symmetric") else "asym"
    return f"{t.get('dtype')} {kind} {t.get('granularity', '')} {t.get('scale', '')}".strip()


def _profile_html(profile: Any) -> str:
    if not isinstance(profile, Mapping):
        return _not_run("Hardware profile", "profile.json", "Run `mpsearch analyze` or search.")
    keys = ("name", "description", "versions", "default_format", "cost_reference", "fallback",
            "transition_cost", "memory_budget_bytes")
    facts = [(k, "not set" if profile[k] is None else profile[k]) for k in keys if k in profile]
    formats = [(n, _tensor(f.get("activation", {})), _tensor(f.get("weight", {})),
                f.get("bias"), f.get("executes"), f.get("relative_cost") or "unknown")
               for n, f in profile.get("formats", {}).items()]
    rules = [(op, ", ".join(r.get("formats", ())),
              "; ".join(f"{k}={v}" for k, v in r.items() if k != "formats") or "-")
             for op, r in profile.get("op_rules", {}).items()]
    sources = "".join(
        f'<li><a href="{esc(u)}" rel="noreferrer">{esc(u)}</a></li>'
        if str(u).startswith(("https://", "http://")) else f"<li>{esc(u)}</li>"
        for u in profile.get("sources", ()))
    unknowns = "".join(f"<li>{esc(u)}</li>" for u in profile.get("unknowns", ()))
    return (_table(["field", "value"], facts)
            + "<h3>Formats</h3>" + _table(["format", "activation", "weight", "bias", "executes",
                                           "relative cost / MAC"], formats)
            + "<details><summary>Op rules</summary>"
            + _table(["op", "formats", "constraints"], rules, scroll=True) + "</details>"
            + (f"<h3>Unknowns</h3><ul>{unknowns}</ul>" if unknowns else "")
            + (f"<details><summary>Sources</summary><ul>{sources}</ul></details>"
               if sources else ""))


def _sensitivity_html(charts: Mapping[str, Any], notes: Sequence[str] = ()) -> str:
    if "chart-sensitivity" not in charts:
        return _not_run("Sensitivity analysis", "sensitivity.json", "Run `mpsearch analyze`.")
    reverse = (_REVERSE_NOTE + _chart("chart-reverse", charts) if "chart-reverse" in charts
               else _REVERSE_NOT_RUN)
    subsets = ("" if not notes else '<p class="muted" id="analysis-notes">Subsets and shortcuts: '
               + "; ".join(esc(n) for n in notes) + ".</p>")
    return (_SENSITIVITY_NOTE + subsets + _chart("chart-sensitivity", charts)
            + '<h3 id="reverse">Gain when restored to FP32</h3>' + reverse)


def _distributions_html(dist_nodes: Sequence[str]) -> str:
    if not dist_nodes:
        return _not_run("Distributions", "distributions.json", "Run `mpsearch analyze`.")
    options = "".join(f'<option value="{i}">{esc(n)}</option>' for i, n in enumerate(dist_nodes))
    return (f'{_DISTRIBUTION_NOTE}<p>Node: <select id="dist-select">{options}</select></p>'
            '<ul id="dist-flags" class="flags"></ul><div class="chart" '
            'id="chart-distribution"></div>')


def _interval_cell(interval: Any) -> str:
    return "n/a" if not interval else f"[{_num(interval[0])}, {_num(interval[1])}]"


def _ms_cell(value: Any, interval: Any) -> str:
    """A median in ms with the spread of its runs: "0.175 [0.171, 0.182]"."""
    if value is None:
        return "n/a"
    return _num(value) + ("" if not interval else f" [{_num(interval[0])}, {_num(interval[1])}]")


def _front_rows(front: Mapping[str, Any], points: Sequence[Mapping[str, Any]],
                measured: bool, baselines: bool = True) -> list[list[str]]:
    named = [("FP32", front.get("fp32") or {}),
             *((f.upper(), b) for f, b in (front.get("uniform") or {}).items())]
    rows = []
    for name, p in [*(named if baselines else []), *((str(p["index"]), p) for p in points)]:
        speed = "-" if name == "FP32" else latency_words(
            p, front.get("fp32") or {}, batch=front.get("latency_batch"),
            source=front.get("latency_source"))
        row = [name, _num(p.get("metric")), _interval_cell(p.get("interval")),
               f'{p.get("size") or 0:,}', speed]
        if measured:
            row += ["-" if name == "FP32" else versus_fp32(p.get("latency_estimate")),
                    _ms_cell(p.get("latency_ms"), p.get("latency_ms_interval")),
                    _ms_cell(p.get("batch_latency_ms"), p.get("batch_latency_ms_interval"))]
        status = ("baseline" if "index" not in p else
                  f"beaten by {p.get('beaten_by')}" if not p.get("shown", True) else
                  "front, recommended" if p.get("index") == front.get("recommended")
                  else "front")
        rows.append([*row, status])
    return rows


def _front_table(front: Mapping[str, Any]) -> str:
    """The recommendation, the baselines and the shown front points of ``front.json``:
    held-out metric, 95 % interval, latency in words and ms with its interval (measured where
    this host ran the target, the estimate beside it); the points a baseline or another point
    beats, folded away with the reason."""
    measured = front.get("latency_source") == "measured"
    head = ["point", f"{front.get('metric', 'metric')} (held-out)", "95 % interval", "bytes",
            "latency"]
    if measured:
        batch = front.get("latency_batch")
        head += ["est. latency", "ms, batch 1 [fastest, slowest]",
                 f"ms, batch {batch} [fastest, slowest]"]
    points = front.get("points", ())
    shown = [p for p in points if p.get("shown", True)]
    hidden = [p for p in points if not p.get("shown", True)]
    timing = ("Latency is the median of interleaved ONNX Runtime runs of every built model on "
              f"this machine (batch 1 and batch {front.get('latency_batch')}), with the fastest "
              "and the slowest run; the words compare it with FP32's; the profile's estimate "
              "stands beside it. " if measured else
              "Latency is the profile's estimate (relative costs x MACs), not a measurement. ")
    recommendation = front.get("recommendation")
    lead = ("" if not recommendation else
            f'<p id="recommendation"><b>{esc(recommendation)}</b></p>')
    note = ('<p class="muted">Held-out metric with its 95 % interval (Wilson for accuracy, top5 '
            "and agreement; bootstrap over samples otherwise). " + timing + "The uniform "
            "baselines are candidates of the front: a searched point is not shown when a "
            "baseline or another point is at least as good on every objective after the "
            "held-out re-measure and better on one (sizes within 0.1 % tie).</p>")
    out = lead + note + _table([*head, "status"], _front_rows(front, shown, measured),
                               scroll=True)
    if hidden:
        out += (f'<details id="hidden-points"><summary>{esc(_hidden_note(front, hidden))}'
                "</summary>"
                + _table([*head, "status"], _front_rows(front, hidden, measured, False),
                         scroll=True) + "</details>")
    return out


def _hidden_note(front: Mapping[str, Any], hidden: Sequence[Mapping[str, Any]]) -> str:
    """Why points are hidden: beaten (dominated) or tied with the one shown point."""
    metric = front.get("metric", "metric")
    parts = []
    beaten = ", ".join(f"point {p['index']} by {p.get('beaten_by')}" for p in hidden
                       if p.get("dominated", True))
    if beaten:
        on = "size and latency" if "latency" in (front.get("objectives") or ()) else "size"
        parts.append(f"beaten on held-out {metric}, {on} ({beaten})")
    tied = ", ".join(f"point {p['index']} with {p.get('beaten_by')}" for p in hidden
                     if not p.get("dominated", True))
    if tied:
        parts.append(f"tied in size and {metric} interval ({tied})")
    return (f"{len(hidden)} of {len(front.get('points', ()))} searched points hidden: "
            + "; ".join(parts))


def _front_html(charts: Mapping[str, Any], front: Mapping[str, Any] | None,
                front_json: Mapping[str, Any]) -> str:
    if front is None:
        return _not_run("Search", "front.json", "Run `mpsearch search` to get a Pareto front.")
    options = "".join(
        f'<option value="{p["index"]}">point {p["index"]}: {esc(front["metric"])} '
        f'{_num(p["metric"])}, {p["size"] or 0:,} bytes'
        f'{" (recommended)" if p["index"] == front.get("recommended") else ""}</option>'
        for p in front["points"])
    return (f'{_chart("chart-front", charts)}{_front_table(front_json)}'
            '<h3 id="point">Selected point</h3>'
            '<p class="muted">Click a point of the front, or pick one: '
            f'<select id="point-select">{options}</select></p><p id="point-summary"></p>'
            '<p>Export it: <code id="point-command"></code> <button id="point-copy" '
            'type="button">copy</button></p><div class="scroll"><table><thead><tr><th>#</th>'
            "<th>node</th><th>op</th><th>format</th><th>sensitivity</th></tr></thead>"
            '<tbody id="point-rows"></tbody></table></div>')


def _shown(value: Any) -> Any:
    """A path as its file name (a report names no folder of the machine it was made on)."""
    if isinstance(value, str) and ("/" in value or "\\" in value):
        return value.replace("\\", "/").rsplit("/", 1)[-1]
    return value


def render_page(files: Mapping[str, Any], payload: Mapping[str, Any],
                dist_nodes: Sequence[str], plotly_js: str) -> str:
    """The whole HTML document: the sections, ``plotly_js``, ``payload`` as JSON, the script.

    ``files``: the parsed run files; ``payload``: ``charts`` (element id -> figure),
    ``distributions``, ``flags`` and ``front``; ``dist_nodes``: the nodes of the distribution
    selector, in the order of ``payload["distributions"]``.
    """
    charts, run = payload["charts"], files.get("run.json") or {}
    model = run.get("name") or (files.get("summary.json") or {}).get("model") or run.get("model")
    title = f"mpsearch report: {model}"
    info = " · ".join(f"{k} {_shown(v)}" for k, v in run.items()
                      if k != "name" and v not in (None, "", [], {}))
    sections = [
        ("summary", "Model summary", _summary_html(files.get("summary.json"), charts)),
        ("profile", "Hardware profile", _profile_html(files.get("profile.json"))),
        ("sensitivity", "Sensitivity per node",
         _sensitivity_html(charts, (files.get("sensitivity.json") or {}).get("notes") or ())),
        ("distributions", "Weight and activation distributions", _distributions_html(dist_nodes)),
        ("curve", "Node-by-node curve", _chart("chart-curve", charts) or _not_run(
            "Node-by-node curve", "curve.json", "Run `mpsearch analyze`.")),
        ("front", "Pareto front", _front_html(charts, payload["front"],
                                              files.get("front.json") or {})),
    ]
    target = target_html(files.get("front.json") or {})
    if target is not None:  # the run's front as the profile's toolchain ran it
        sections.append(("target", "On the target", target))
    nav = "".join(f'<a href="#{i}">{esc(t)}</a>' for i, t, _ in sections)
    body = "".join(f'<section id="{i}"><h2>{esc(t)}</h2>{b}</section>' for i, t, b in sections)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><title>{esc(title)}</title>'
            f"<style>{_CSS}</style><script>{_ERRORS_JS}</script></head><body>"
            f'<div id="mpsearch-errors"></div><header><h1>{esc(title)}</h1>'
            f'<p class="muted">{esc(info)}</p></header><nav>{nav}</nav><main>{body}</main>'
            f"<script>{plotly_js}</script>"
            f'<script type="application/json" id="mpsearch-data">{_script_json(payload)}'
            f"</script><script>{_SCRIPT}</script></body></html>")


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element (no ``</script>``, no ``<!--``)."""
    text = json.dumps(json_finite(value), separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
