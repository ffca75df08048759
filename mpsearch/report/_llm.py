"""The HTML report of a language-model run: the front against the baselines, and the bits.

Consumes a language-model run's ``front.json`` (:func:`mpsearch.rundir.read_llm_front`);
produces one self-contained HTML file: held-out perplexity against bits per weight for FP32,
the hand-made baselines and the searched points (plotly.js embedded, works offline), the table
of every point with its 95 % intervals, each searched point's bit map (layer x projection),
and each weight's sensitivity (KL on a search window when it alone takes each format).
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mpsearch.rundir import estimate_text, read_llm_front

__all__ = ["write_llm_report"]

_ROLES = ("q", "k", "v", "o", "gate", "up", "down")


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _entries(front: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return ([("FP32", front["fp32"])] + [(b["name"], b) for b in front["baselines"]]
            + [(f"point {p['index']}", p) for p in front["points"]])


def _bitmap(point: Mapping[str, Any]) -> str:
    formats: Mapping[str, str] = point["formats"]
    layers = sorted({int(k.split(".")[0]) for k in formats if k.split(".")[0].isdigit()})
    rows = [[i, *(formats.get(f"{i}.{r}", "fp32").split(":")[0] for r in _ROLES)]
            for i in layers]
    head = formats.get("lm_head", "fp32").split(":")[0]
    return (f"<h3>point {point['index']}: {point['bpw']:.3f} bits per weight "
            f"({html.escape(point['source'])}); lm_head {html.escape(head)}</h3>"
            + _table(["layer", *_ROLES], rows))


def _chart(front: Mapping[str, Any]) -> dict[str, Any]:
    def trace(name: str, rows: Sequence[Mapping[str, Any]], labels: Sequence[str],
              mode: str) -> dict[str, Any]:
        return {"type": "scatter", "mode": mode, "name": name, "text": list(labels),
                "x": [r["bpw"] for r in rows], "y": [r["perplexity"][0] for r in rows],
                "error_y": {"type": "data", "symmetric": False,
                            "array": [r["perplexity"][2] - r["perplexity"][0] for r in rows],
                            "arrayminus": [r["perplexity"][0] - r["perplexity"][1]
                                           for r in rows]},
                "hovertemplate": "%{text}: %{x:.3f} bpw, perplexity %{y:.2f}<extra></extra>"}
    points, bases = front["points"], front["baselines"]
    fp32 = front["fp32"]["perplexity"][0]
    return {"data": [trace("searched", points, [f"point {p['index']}" for p in points],
                           "lines+markers"),
                     trace("baselines", bases, [b["name"] for b in bases], "markers")],
            "layout": {"height": 420, "xaxis": {"title": {"text": "bits per weight"}},
                       "yaxis": {"title": {"text": "held-out perplexity"}},
                       "shapes": [{"type": "line", "xref": "paper", "x0": 0, "x1": 1,
                                   "y0": fp32, "y1": fp32, "line": {"dash": "dot"}}],
                       "margin": {"t": 20}}}


def write_llm_report(run_dir: str | os.PathLike[str],
                     out: str | os.PathLike[str] | None = None) -> Path:
    """Write the report of language-model run ``run_dir`` (default ``run_dir/report.html``)."""
    from plotly.offline import get_plotlyjs  # type: ignore[import-untyped]

    front = read_llm_front(run_dir)
    target = Path(out) if out is not None else Path(run_dir) / "report.html"
    rows = [[name, f"{e['bpw']:.3f}", e["bytes"], estimate_text(e["perplexity"], 2),
             estimate_text(e["kl"], 4), estimate_text(e["top1"], 3),
             "" if e.get("search_kl") is None else f"{e['search_kl']:.4f}"]
            for name, e in _entries(front)]
    sensitivity = [[s["weight"], *(f"{f}: {v:.4f}" for f, v in s["kl"].items())]
                   for s in sorted(front["sensitivity"], key=lambda s: -max(s["kl"].values()))]
    width = max((len(r) for r in sensitivity), default=1)
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>mpsearch language-model "
        f"report: {html.escape(Path(front['model']).name)}</title><style>body{{font-family:"
        "sans-serif;margin:2em}}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:2px 6px;font-size:13px}</style>"
        f"<script>{get_plotlyjs()}</script></head><body>"
        f"<h1>{html.escape(Path(front['model']).name)}: weight-only bits per projection</h1>"
        f"<p>{front['params']:,} searchable weights; windows {html.escape(str(front['windows']))}"
        f"; {front['evaluations']} search evaluations. Held-out figures are on windows the "
        "search never saw, with 95 % intervals over windows.</p>"
        "<h2>Perplexity against bits per weight</h2><div id='front-chart'></div>"
        + _table(["", "bits/weight", "bytes", "held-out perplexity", "KL to FP32 (nats)",
                  "top-1 = FP32", "search KL"], rows)
        + "<h2>Bit maps</h2>" + "".join(_bitmap(p) for p in front["points"])
        + "<h2>Sensitivity: KL when one weight alone takes a format</h2>"
        + _table(["weight", *(f"format {i + 1}" for i in range(width - 1))], sensitivity)
        + "<script>Plotly.newPlot('front-chart', " + json.dumps(_chart(front)["data"]) + ", "
        + json.dumps(_chart(front)["layout"]) + ", {displaylogo: false});</script>"
        "</body></html>")
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, target)
    return target
