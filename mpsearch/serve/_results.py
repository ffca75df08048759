"""The results of a search on its job page: the Pareto front first, with its chart and sizes.

Consumes ``front.json`` (as a dict), the finished-trial count of the study journal, the sizes of
the QDQ files exported so far, and, for a search that stopped early, the journal's trials;
produces HTML sections and the data the page's script draws the chart from. Every number says
which data split it comes from: the front is re-measured on the **held-out** split (data the
search never saw), the search itself and a stopped run's partial front use the **search** split.
Sizes are both the weights as deployed (bytes of the weights in the chosen formats) and the
exported ``.onnx`` file (graph, scales and zero points included), once it exists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mpsearch.serve._pages import bytes_text, e

__all__ = ["chart_data", "front_section", "partial_section"]

_SIZES = ("<b>weights</b> = the weights as deployed, in the formats chosen; <b>file</b> = the "
          "exported QDQ .onnx (graph, scales and zero points included), shown once exported")


def _file(size: int | None) -> str:
    return bytes_text(size) if size is not None else '<span class="muted">on export</span>'


def _row(job_id: str, k: int, p: Mapping[str, Any], file: int | None) -> str:
    counts = ", ".join(f"{f} {n}" for f, n in sorted(p.get("counts", {}).items()))
    latency = "-" if p.get("latency") is None else f"{p['latency']:.2f}×"
    search = p.get("search_metric")
    return (f'<tr><td><input type="radio" name="point" value="{k}" id="point-{k}"'
            f'{" checked" if k == 0 else ""}></td><td><label for="point-{k}">{k}</label></td>'
            f'<td class="metric">{p["metric"]:.4f}</td>'
            f'<td>{"-" if search is None else f"{float(search):.4f}"}</td>'
            f'<td class="weights">{e(bytes_text(p["size"]))}</td>'
            f'<td class="file">{_file(file)}</td><td>{latency}</td><td>{e(counts)}</td>'
            f'<td><a href="/jobs/{job_id}/export?point={k}" class="download">download</a>'
            "</td></tr>")


def front_section(job: Any, front: Mapping[str, Any], *, trials_done: int,
                  files: Mapping[int, int], fp32_file: int | None) -> str:
    """The finished search's front: chart, table (held-out split), baselines, trial count."""
    metric = str(front.get("metric", "metric"))
    points = front.get("points", ())
    fp32 = front.get("fp32") or {}
    trials = f"{trials_done} of {job.trials}" if job.trials else str(trials_done)
    head = (f'<p id="front-summary">{e(trials)} trials finished (all runs of this job); '
            f"{len(points)} point(s) on the front. FP32: {e(metric)} "
            f'{float(fp32.get("metric", float("nan"))):.4f} (held-out), weights '
            f'{e(bytes_text(fp32.get("size", 0)))}, file {_file(fp32_file)}.</p>'
            f'<p class="muted">Each point is a per-node precision assignment that no other '
            f"configuration found beats on both {e(metric)} and size. {e(metric)} is measured "
            "on the <b>held-out split</b> (data the search never saw); the search optimized it "
            f"on the <b>search split</b>. Sizes: {_SIZES}.</p>")
    if not points:
        return head + '<p class="error" id="no-front">No point met the constraints.</p>'
    rows = "".join(_row(job.id, int(p["index"]), p, files.get(int(p["index"])))
                   for p in points)
    return (head + '<div id="results-chart" class="chart"></div>'
            f'<form method="get" action="/jobs/{job.id}/export" id="export-form">'
            f'<table id="front"><thead><tr><th></th><th>point</th><th>{e(metric)} '
            f"(held-out split)</th><th>{e(metric)} (search split)</th><th>weights</th>"
            "<th>file</th><th>latency vs FP32</th><th>formats (nodes)</th><th>QDQ model</th>"
            f'</tr></thead><tbody>{rows}</tbody></table><button type="submit" '
            'id="export-button" class="primary">Download the selected point\'s QDQ model'
            "</button></form>")


def partial_section(job: Any, progress: Mapping[str, Any]) -> str:
    """What a stopped search found before it stopped (its journal's trials, search split)."""
    done = int(progress.get("trials_done") or 0)
    front: Sequence[Sequence[float]] = progress.get("front") or ()
    total = f" of {job.trials}" if job.trials else ""
    head = (f'<p id="partial-summary">{done}{total} trials finished before the job stopped; '
            f"{len(front)} point(s) on the front so far. Resume continues the same study "
            "from there.</p>")
    if not front:
        return head
    rows = "".join(f"<tr><td>{k}</td><td>{m:.4f}</td><td>{e(bytes_text(s))}</td></tr>"
                   for k, (m, s) in enumerate(front))
    return (head + '<p class="muted">The metric here is measured on the <b>search split</b>: '
            "the held-out check and the exports come when the search finishes.</p>"
            '<div id="results-chart" class="chart"></div><table id="partial-front"><thead><tr>'
            "<th>#</th><th>metric (search split)</th><th>weights</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def chart_data(front: Mapping[str, Any] | None, progress: Mapping[str, Any] | None
               ) -> dict[str, Any] | None:
    """What the page's script draws in ``#results-chart``: (metric, weight bytes) points."""
    if front is not None and front.get("points"):
        metric = str(front.get("metric", "metric"))
        pts = [[float(p["metric"]), float(p["size"])] for p in front["points"]]
        fp32 = front.get("fp32") or {}
        extra = ([[float(fp32["metric"]), float(fp32["size"])]]
                 if "metric" in fp32 and "size" in fp32 else [])
        return {"points": pts + extra, "front": pts, "y": f"{metric} (held-out split)",
                "x": "weights (bytes)", "marks": extra, "mark": "FP32"}
    if progress is not None and progress.get("front"):
        return {"points": progress.get("points") or [], "front": progress["front"],
                "y": "metric (search split)", "x": "weights (bytes)"}
    return None
