"""Run directory -> one self-contained, interactive HTML report.

Consumes what a run directory holds (``run.json``, ``summary.json``, ``profile.json``,
``sensitivity.json``, ``distributions.json``, ``curve.json``, ``front.json``, ``trials.csv``);
produces one HTML file that works offline: plotly.js is embedded once, the data as JSON, and a
small script draws the charts, swaps the node shown in the distribution view and fills the
selected Pareto point's assignment table and export command. A section whose file is missing
says "not run". This module loads and normalizes the run files; the figures come from
:mod:`mpsearch.report._figures`, the page around them from :mod:`mpsearch.report._page`.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mpsearch._io import atomic_write, load_json, read_text
from mpsearch.errors import MpsearchError
from mpsearch.report import _figures as figs
from mpsearch.report._page import CLASS_COLORS, format_color, render_page
from mpsearch.rundir import RunDir, latency_words

__all__ = ["MAX_DISTRIBUTION_NODES", "RunFiles", "load_run", "render_report", "write_report"]

logger = logging.getLogger(__name__)

MAX_DISTRIBUTION_NODES = 200
_FILES = ("run_json", "summary_json", "profile_json", "sensitivity_json", "distributions_json",
          "curve_json", "front_json")  # RunDir attributes; the loaded files keep their names

RunFiles = dict[str, Any]


def _read_json(path: Path) -> Any:
    try:
        return load_json(path, MpsearchError, links=False,
                         fix="rerun the stage that writes it or delete the file")
    except FileNotFoundError:
        return None


def _number(text: str | None) -> float | None:
    try:
        value = float(text or "nan")
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _read_trials(path: Path) -> list[dict[str, Any]]:
    """``trials.csv`` rows with numbers parsed; empty when the file is missing."""
    try:
        text = read_text(path, MpsearchError, links=False, limit=64 << 20,
                         fix="rerun the search or delete the file")
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except FileNotFoundError:
        return []
    except csv.Error as e:
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
    run = RunDir(root)
    paths = [getattr(run, attribute) for attribute in _FILES]
    files: RunFiles = {path.name: _read_json(path) for path in paths}
    files[run.trials_csv.name] = _read_trials(run.trials_csv)
    if all(files[path.name] is None for path in paths):
        raise MpsearchError(f"{root}: none of {', '.join(p.name for p in paths)} is there; is "
                            "it a run directory?")
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


def _reverse(doc: Any) -> tuple[list[Mapping[str, Any]], float | None]:
    """The reverse view's rows and the all-quantized base metric, from ``sensitivity.json``
    (``{"reverse": {"base": {"metric": ...}, "rows": [RestoreGain]}}``); no rows if not run."""
    reverse = doc.get("reverse") if isinstance(doc, Mapping) else None
    base = reverse.get("base") if isinstance(reverse, Mapping) else None
    metric = base.get("metric") if isinstance(base, Mapping) else None
    return (_rows(reverse, "rows"),
            float(metric) if isinstance(metric, int | float) else None)


def _classes(rows: Sequence[Mapping[str, Any]], gains: Sequence[Mapping[str, Any]]
             ) -> dict[str, str]:
    """Node -> its sensitivity class in the format the reverse view restored it from."""
    restored = {str(g.get("node")): g.get("format") for g in gains}
    classes = {}
    for row in rows:
        node, cls = str(row.get("node")), row.get("cls") or row.get("class")
        if cls and node in restored and restored[node] == row.get("format"):
            classes[node] = str(cls)
    return classes


# -- assembling ------------------------------------------------------------------------------
def _front_data(files: RunFiles, run_dir: str) -> dict[str, Any] | None:
    """What the page's script needs to fill the selected point's table and command."""
    front = files.get("front.json")
    if not isinstance(front, Mapping) or not front.get("points"):
        return None
    summary = files.get("summary.json") or {}
    ops = {str(n["name"]): str(n.get("op_type", "")) for n in summary.get("nodes", ())}
    everything = list(front["points"])
    points = [p for p in everything if p.get("shown", True)]  # a beaten point: the record only
    nodes = list(ops) or sorted({n for p in everything for n in p.get("assignment", {})})
    classes: dict[str, str] = {}  # a node's worst class over the formats analyzed
    for row in _rows(files.get("sensitivity.json"), "nodes"):
        if row.get("cls") in CLASS_COLORS and row.get("node") in ops:
            classes[row["node"]] = max(classes.get(row["node"], "low"), row["cls"],
                                       key=list(CLASS_COLORS).index)
    formats = _formats_by_rank(files, [f for p in everything for f in p.get("assignment",
                                                                              {}).values()])
    sign = 1 if front.get("higher_is_better", True) else -1
    scored = [p for p in points if p.get("metric") is not None] or points
    best = max(scored, key=lambda p: (sign * (p.get("metric") or 0), -(p.get("size") or 0)),
               default=None)
    shown = {p.get("index") for p in points}
    default = (front.get("recommended") if front.get("recommended") in shown
               else None if best is None else best.get("index", 0))
    return {
        "nodes": [[n, ops.get(n, ""), classes.get(n, "")] for n in nodes],
        "formats": formats, "colors": [format_color(f) for f in formats],
        "points": [{"index": p.get("index", i), "metric": p.get("metric"),
                    "size": p.get("size"), "latency": p.get("latency"),
                    "interval": p.get("interval"), "dominated": bool(p.get("dominated")),
                    "speed": latency_words(p, front.get("fp32") or {},
                                           batch=front.get("latency_batch"),
                                           source=front.get("latency_source")),
                    "counts": p.get("counts", {}),
                    "formats": [formats.index(p["assignment"][n])
                                if n in p.get("assignment", {}) else -1 for n in nodes]}
                   for i, p in enumerate(points)],
        "default": default, "recommended": front.get("recommended"),
        "run_dir": shlex.quote(run_dir),
        "latency_label": figs.latency_label(front),
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
        gains, base = _reverse(sensitivity)
        if gains:
            charts["chart-reverse"] = figs.figure_reverse(
                gains, _node_order(files, rows), _classes(rows, gains),
                _metric_name(files, sensitivity), base)
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
    return render_page(files, payload, [e["node"] for e in distributions], get_plotlyjs())


def write_report(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None
                 ) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``)."""
    path = Path(out) if out is not None else RunDir(run_dir).report_html
    text = render_report(run_dir)
    atomic_write(path, text.encode())
    logger.info("report: wrote %s (%.1f MB)", path, len(text.encode()) / 1e6)
    return path
