"""Run directory -> one self-contained, interactive HTML report.

Consumes what a run directory holds (``run.json``, ``summary.json``, ``profile.json``,
``sensitivity.json``, ``distributions.json``, ``curve.json``, ``front.json``, ``trials.csv``);
produces one HTML file that works offline: plotly.js is embedded once, the data as JSON, and a
small script draws the charts, swaps the node shown in the distribution view and fills the
selected Pareto point's assignment table and export command. A section whose file is missing
says "not run". Figures come from :mod:`mpsearch._report_figures`. Every text from the run
(node names come from user models) is escaped.
"""

from __future__ import annotations

import csv
import html
import json
import logging
import math
import os
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mpsearch import _report_figures as figs
from mpsearch.errors import MpsearchError

__all__ = ["MAX_DISTRIBUTION_NODES", "RunFiles", "load_run", "render_report", "write_report"]

logger = logging.getLogger(__name__)

MAX_DISTRIBUTION_NODES = 200
_FILES = ("run.json", "summary.json", "profile.json", "sensitivity.json", "distributions.json",
          "curve.json", "front.json")

RunFiles = dict[str, Any]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MpsearchError(f"{path}: cannot read it as JSON ({e}); rerun the stage that "
                            "writes it or delete the file") from e


def _number(text: str | None) -> float | None:
    try:
        value = float(text or "nan")
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _read_trials(path: Path) -> list[dict[str, Any]]:
    """``trials.csv`` rows with numbers parsed; empty when the file is missing."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise MpsearchError(f"{path}: cannot read it as CSV ({e})") from e
    return [{"trial": _number(r.get("trial")), "state": r.get("state") or "",
             "metric": _number(r.get("metric")), "size": _number(r.get("size")),
             "latency": _number(r.get("latency")), "source": r.get("source") or ""}
            for r in rows]


def load_run(run_dir: str | os.PathLike[str]) -> RunFiles:
    """The parsed files of ``run_dir`` keyed by file name (None when missing), plus trials."""
    root = Path(run_dir)
    if not root.is_dir():
        raise MpsearchError(f"{root}: no such run directory; give the directory `mpsearch "
                            "search` or `mpsearch analyze` wrote")
    files: RunFiles = {name: _read_json(root / name) for name in _FILES}
    files["trials.csv"] = _read_trials(root / "trials.csv")
    if all(files[name] is None for name in _FILES):
        raise MpsearchError(f"{root}: none of {', '.join(_FILES)} is there; is it a run "
                            "directory?")
    return files


# -- normalizing the analysis files ----------------------------------------------------------
def _rows(doc: Any, *keys: str) -> list[Mapping[str, Any]]:
    """The list of row dicts in ``doc``: ``doc`` itself, or the first of ``keys`` it has."""
    if isinstance(doc, list):
        return [r for r in doc if isinstance(r, Mapping)]
    if isinstance(doc, Mapping):
        for key in keys:
            if isinstance(doc.get(key), list):
                return _rows(doc[key])
    return []


def _node_order(files: RunFiles, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Node names in topological order: the summary's, else by the rows' ``index``."""
    order = [str(n["name"]) for n in (files.get("summary.json") or {}).get("nodes", ())]
    indexed = sorted(rows, key=lambda r: (r.get("index", 0), str(r.get("node"))))
    return order or list(dict.fromkeys(str(r["node"]) for r in indexed if "node" in r))


def _formats_by_rank(files: RunFiles, names: Sequence[str]) -> list[str]:
    known = list((files.get("profile.json") or {}).get("formats", {}))
    return sorted(dict.fromkeys(names), key=lambda f: known.index(f) if f in known else 99)


def _metric_name(files: RunFiles, *docs: Any) -> str:
    for doc in (*docs, files.get("front.json")):
        if isinstance(doc, Mapping) and doc.get("metric"):
            return str(doc["metric"])
    return "metric"


def _histogram(hist: Any) -> dict[str, Any] | None:
    """One ``TensorDistribution.to_dict()`` in the figure's shape; None if absent or malformed.

    ``formats`` keeps only well-formed per-format histograms, the shown ``format`` first.
    """
    if not isinstance(hist, Mapping):
        return None
    edges, fp32 = hist.get("edges"), hist.get("fp32")
    if not edges or not fp32 or len(edges) != len(fp32) + 1:
        return None
    formats = {str(k): v for k, v in (hist.get("formats") or {}).items()
               if isinstance(v, Mapping) and len(v.get("quantized") or ()) == len(fp32)}
    shown = hist.get("format")
    if shown in formats:
        formats = {shown: formats[shown], **formats}
    clip = hist.get("clip")
    return {"tensor": hist.get("tensor"), "edges": edges, "fp32": fp32, "format": shown,
            "clip": list(clip) if isinstance(clip, list | tuple) and len(clip) == 2 else None,
            "stats": hist.get("stats") or {}, "formats": formats}


def _distributions(files: RunFiles) -> list[dict[str, Any]]:
    """Per node ``{node, op_type, weight, activation, flags}``, flagged / sensitive first."""
    entries = []
    for row in _rows(files.get("distributions.json"), "nodes"):
        weight, activation = _histogram(row.get("weight")), _histogram(row.get("activation"))
        if weight is None and activation is None:
            continue
        entries.append({"node": str(row.get("node", "?")), "op_type": row.get("op_type", "?"),
                        "weight": weight, "activation": activation,
                        "flags": [str(f) for f in row.get("flags", ())],
                        "codes": [str(c) for c in row.get("codes", ())]})
    if len(entries) > MAX_DISTRIBUTION_NODES:
        order = {n: i for i, n in enumerate(_node_order(files, []))}
        ranks = {str(r.get("node")): int(r.get("rank") or 10**9)
                 for r in _rows(files.get("sensitivity.json"), "nodes")}
        keep = sorted(entries, key=lambda e: (not e["flags"], ranks.get(e["node"], 10**9),
                                              order.get(e["node"], 0)))[:MAX_DISTRIBUTION_NODES]
        logger.info("report: showing distributions of %d of %d nodes (flagged and most "
                    "sensitive first)", len(keep), len(entries))
        entries = sorted(keep, key=lambda e: order.get(e["node"], 0))
    return entries


def _curve_orders(doc: Any) -> dict[str, list[Mapping[str, Any]]]:
    """Order name -> steps, from ``curve.json`` (``{"orders": {name: [CurvePoint]}}``)."""
    orders = doc.get("orders") if isinstance(doc, Mapping) else None
    if not isinstance(orders, Mapping):
        return {}
    return {str(name): sorted(_rows(steps), key=lambda s: s.get("step", 0))
            for name, steps in orders.items() if _rows(steps)}


# -- assembling ------------------------------------------------------------------------------
def _front_data(files: RunFiles, run_dir: str) -> dict[str, Any] | None:
    """What the page's script needs to fill the selected point's table and command."""
    front = files.get("front.json")
    if not isinstance(front, Mapping) or not front.get("points"):
        return None
    summary = files.get("summary.json") or {}
    ops = {str(n["name"]): str(n.get("op_type", "")) for n in summary.get("nodes", ())}
    points = list(front["points"])
    nodes = list(ops) or sorted({n for p in points for n in p.get("assignment", {})})
    classes: dict[str, str] = {}  # a node's worst class over the formats analyzed
    for row in _rows(files.get("sensitivity.json"), "nodes"):
        if row.get("cls") in figs.CLASS_COLORS and row.get("node") in ops:
            classes[row["node"]] = max(classes.get(row["node"], "low"), row["cls"],
                                       key=list(figs.CLASS_COLORS).index)
    formats = _formats_by_rank(files, [f for p in points for f in p.get("assignment",
                                                                          {}).values()])
    sign = 1 if front.get("higher_is_better", True) else -1
    scored = [p for p in points if p.get("metric") is not None] or points
    best = max(scored, key=lambda p: (sign * (p.get("metric") or 0), -(p.get("size") or 0)))
    return {
        "nodes": [[n, ops.get(n, ""), classes.get(n, "")] for n in nodes],
        "formats": formats, "colors": [figs.format_color(f) for f in formats],
        "points": [{"index": p.get("index", i), "metric": p.get("metric"),
                    "size": p.get("size"), "latency": p.get("latency"),
                    "counts": p.get("counts", {}),
                    "formats": [formats.index(p["assignment"][n])
                                if n in p.get("assignment", {}) else -1 for n in nodes]}
                   for i, p in enumerate(points)],
        "default": best.get("index", 0), "run_dir": shlex.quote(run_dir),
        "metric": _metric_name(files),
    }


def _charts(files: RunFiles) -> dict[str, dict[str, Any]]:
    charts: dict[str, dict[str, Any]] = {}
    summary = files.get("summary.json")
    if isinstance(summary, Mapping):
        charts["chart-op-types"] = figs.figure_op_types(summary)
        charts["chart-flops"] = figs.figure_flops(summary)
    sensitivity = files.get("sensitivity.json")
    rows = _rows(sensitivity, "nodes")
    if rows:
        formats = (list(sensitivity.get("formats") or ()) if isinstance(sensitivity, Mapping)
                   else []) or _formats_by_rank(files, [str(r.get("format")) for r in rows])
        charts["chart-sensitivity"] = figs.figure_sensitivity(
            rows, _node_order(files, rows), formats, _metric_name(files, sensitivity))
    curve = files.get("curve.json")
    orders = _curve_orders(curve)
    if orders and isinstance(curve, Mapping):
        charts["chart-curve"] = figs.figure_curve(
            orders, _metric_name(files, curve, sensitivity), curve.get("fp32_metric"))
    front = files.get("front.json")
    if isinstance(front, Mapping) and front.get("points"):
        charts["chart-front"] = figs.figure_front(front, files["trials.csv"])
    return charts


def render_report(run_dir: str | os.PathLike[str]) -> str:
    """The HTML report of ``run_dir`` as one self-contained string."""
    from plotly.offline import get_plotlyjs  # type: ignore[import-untyped]

    files = load_run(run_dir)
    distributions = _distributions(files)
    payload = {
        "charts": _charts(files),
        "distributions": [figs.figure_distribution(e) for e in distributions],
        "flags": [e["flags"] for e in distributions],
        "front": _front_data(files, str(run_dir)),
    }
    return (_page(files, payload, [e["node"] for e in distributions])
            + f"<script>{get_plotlyjs()}</script>"
            + f'<script type="application/json" id="mpsearch-data">{_script_json(payload)}'
            + f"</script><script>{_SCRIPT}</script></body></html>")


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
    ", size " + size(p.size) + ", est. latency " + num(p.latency, 2) + "\u00d7 FP32; " +
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

_DISTRIBUTION_NOTE = (
    '<p class="muted">Bars: FP32 values; steps: the same values quantized and dequantized '
    "(other formats in the legend); dashed lines: the clipping range.</p>")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], scroll: bool = False
           ) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="scroll">{table}</div>' if scroll else table


def _not_run(what: str, file: str, how: str) -> str:
    return (f'<p class="notrun">{_e(what)}: not run (no <code>{_e(file)}</code> in the run '
            f"directory). {_e(how)}</p>")


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
        f'<li><a href="{_e(u)}" rel="noreferrer">{_e(u)}</a></li>'
        if str(u).startswith(("https://", "http://")) else f"<li>{_e(u)}</li>"
        for u in profile.get("sources", ()))
    unknowns = "".join(f"<li>{_e(u)}</li>" for u in profile.get("unknowns", ()))
    return (_table(["field", "value"], facts)
            + "<h3>Formats</h3>" + _table(["format", "activation", "weight", "bias", "executes",
                                           "relative cost / MAC"], formats)
            + "<details><summary>Op rules</summary>"
            + _table(["op", "formats", "constraints"], rules, scroll=True) + "</details>"
            + (f"<h3>Unknowns</h3><ul>{unknowns}</ul>" if unknowns else "")
            + (f"<details><summary>Sources</summary><ul>{sources}</ul></details>"
               if sources else ""))


def _front_html(files: RunFiles, charts: Mapping[str, Any], front: Mapping[str, Any] | None
                ) -> str:
    if front is None:
        return _not_run("Search", "front.json", "Run `mpsearch search` to get a Pareto front.")
    options = "".join(
        f'<option value="{p["index"]}">point {p["index"]}: {_e(front["metric"])} '
        f'{_num(p["metric"])}, {p["size"] or 0:,} bytes</option>' for p in front["points"])
    return (f'{_chart("chart-front", charts)}<h3 id="point">Selected point</h3>'
            '<p class="muted">Click a point of the front, or pick one: '
            f'<select id="point-select">{options}</select></p><p id="point-summary"></p>'
            '<p>Export it: <code id="point-command"></code> <button id="point-copy" '
            'type="button">copy</button></p><div class="scroll"><table><thead><tr><th>#</th>'
            "<th>node</th><th>op</th><th>format</th><th>sensitivity</th></tr></thead>"
            '<tbody id="point-rows"></tbody></table></div>')


def _page(files: RunFiles, payload: Mapping[str, Any], dist_nodes: Sequence[str]) -> str:
    charts, run = payload["charts"], files.get("run.json") or {}
    model = (files.get("summary.json") or {}).get("model") or run.get("model")
    title = f"mpsearch report: {model}"
    info = " · ".join(f"{k} {v}" for k, v in run.items() if v not in (None, "", [], {}))
    options = "".join(f'<option value="{i}">{_e(n)}</option>' for i, n in enumerate(dist_nodes))
    sections = [
        ("summary", "Model summary", _summary_html(files.get("summary.json"), charts)),
        ("profile", "Hardware profile", _profile_html(files.get("profile.json"))),
        ("sensitivity", "Sensitivity per node", (_SENSITIVITY_NOTE + _chart(
            "chart-sensitivity", charts)) if "chart-sensitivity" in charts else _not_run(
            "Sensitivity analysis", "sensitivity.json", "Run `mpsearch analyze`.")),
        ("distributions", "Weight and activation distributions",
         (f'{_DISTRIBUTION_NOTE}<p>Node: <select id="dist-select">{options}</select></p>'
          '<ul id="dist-flags" class="flags"></ul><div class="chart" '
          'id="chart-distribution"></div>')
         if dist_nodes else _not_run("Distributions", "distributions.json",
                                     "Run `mpsearch analyze`.")),
        ("curve", "Node-by-node curve", _chart("chart-curve", charts) or _not_run(
            "Node-by-node curve", "curve.json", "Run `mpsearch analyze`.")),
        ("front", "Pareto front", _front_html(files, charts, payload["front"])),
    ]
    nav = "".join(f'<a href="#{i}">{_e(t)}</a>' for i, t, _ in sections)
    body = "".join(f'<section id="{i}"><h2>{_e(t)}</h2>{b}</section>' for i, t, b in sections)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><title>{_e(title)}</title>'
            f"<style>{_CSS}</style><script>{_ERRORS_JS}</script></head><body>"
            f'<div id="mpsearch-errors"></div><header><h1>{_e(title)}</h1>'
            f'<p class="muted">{_e(info)}</p></header><nav>{nav}</nav><main>{body}</main>')


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element (no ``</script>``, no ``<!--``)."""
    text = json.dumps(_clean(value), separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None
                 ) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``)."""
    path = Path(out) if out is not None else Path(run_dir) / "report.html"
    text = render_report(run_dir)
    _atomic_write(path, text)
    logger.info("report: wrote %s (%.1f MB)", path, len(text.encode()) / 1e6)
    return path
