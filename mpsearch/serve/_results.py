"""The results of a search on its job page: the recommendation, the front with its baselines,
the chart, and the points beaten on the held-out re-measure.

Consumes ``front.json`` (as a dict, read through :mod:`mpsearch.serve._frontview`), the
finished-trial count of the study journal, the sizes of the QDQ files exported so far, and, for
a search that stopped early, the journal's trials; produces HTML sections. Every number says
which data split it comes from: the front is re-measured on the **held-out** split (data the
search never saw), the search itself and a stopped run's partial front use the **search** split.
Sizes are both the weights as deployed (bytes of the weights in the chosen formats) and the
exported ``.onnx`` file (graph, scales and zero points included), once it exists. Latency is in
milliseconds at batch 1 and at the timing batch, with its spread when measured, and in words
against FP32.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mpsearch.rundir import formats_text
from mpsearch.serve._frontview import (
    baselines,
    failure,
    is_shown,
    latency,
    recommendation,
    recommended_index,
    words,
)
from mpsearch.serve._pages import bytes_text, e
from mpsearch.serve._targetview import target_section

__all__ = ["front_section", "partial_section"]

_SIZES = ("<b>weights</b> = the weights as deployed, in the formats chosen; <b>file</b> = the "
          "exported QDQ .onnx (graph, scales and zero points included), shown once exported")


def _file(size: int | None) -> str:
    return bytes_text(size) if size is not None else '<span class="muted">on export</span>'


def _latency_cell(entry: Mapping[str, Any], fp32: Mapping[str, Any], front: Mapping[str, Any],
                  batch: bool) -> str:
    ms, spread = latency(entry, batch)
    said: str | None
    if entry is fp32:
        said = "the reference" if ms is not None else None
    else:  # the CLI's and the report's words for both batches, in the batch-1 cell
        said = None if batch else words(entry, front)
    if ms is None:
        value = ""
    else:
        value = f"{ms:.3g} ms" + (f' <span class="spread">[{spread[0]:.3g}–{spread[1]:.3g}]'
                                   "</span>" if spread is not None else "")
    if not value and not said:
        return '<td class="latency muted">-</td>'
    tag = ""
    if said and "faster" in said:
        tag = " faster"
    elif said and "slower" in said:
        tag = " slower"
    return (f'<td class="latency{tag}">{value}'
            + (f'<small class="words">{e(said)}</small>' if said else "") + "</td>")


def _counts(p: Mapping[str, Any]) -> str:
    return formats_text(p.get("counts") or {})


def _row(job_id: str, p: Mapping[str, Any], file: int | None, fp32: Mapping[str, Any],
         front: Mapping[str, Any], *, selected: int | None, recommended: int | None,
         batch: bool, hidden: bool = False) -> str:
    k = int(p["index"])
    search = p.get("search_metric")
    failed = failure(p)
    tags = ' <span class="tag recommended">recommended</span>' if k == recommended else ""
    if failed is not None:  # never recommended: the target's verification rejected it
        tags = (' <span class="tag target-failed">failed on the target</span>'
                f'<small class="failure">{e(failed)}</small>')
    beaten = (f'<td class="beaten-by">{e(p.get("beaten_by") or "another point")}</td>'
              if hidden else "")
    classes = " ".join(c for c in ("selected" if k == selected else "",
                                   "target-failed" if failed is not None else "") if c)
    cls = f' class="{classes}"' if classes else ""
    return (f'<tr id="row-{k}" data-point="{k}"{cls}><td><input type="radio" name="point" '
            f'value="{k}" id="point-{k}"{" checked" if k == selected else ""}></td>'
            f'<td><label for="point-{k}">{k}</label>{tags}</td>'
            f'<td class="metric">{float(p["metric"]):.4f}</td>'
            f'<td>{"-" if search is None else f"{float(search):.4f}"}</td>'
            f'<td class="weights">{e(bytes_text(p["size"]))}</td>'
            f'<td class="file">{_file(file)}</td>'
            + _latency_cell(p, fp32, front, False)
            + (_latency_cell(p, fp32, front, True) if batch else "")
            + f"<td>{e(_counts(p))}</td>{beaten}"
            f'<td><a href="/jobs/{job_id}/export?point={k}" class="download">download</a>'
            "</td></tr>")


def _baseline_row(key: str, label: str, b: Mapping[str, Any], fp32: Mapping[str, Any],
                  front: Mapping[str, Any], fp32_file: int | None, batch: bool) -> str:
    file = _file(fp32_file) if key == "fp32" else '<span class="muted">-</span>'
    return (f'<tr class="baseline" data-baseline="{e(key)}"><td></td><td>{e(label)}</td>'
            f'<td class="metric">{float(b["metric"]):.4f}</td><td>-</td>'
            f'<td class="weights">{e(bytes_text(b["size"]))}</td><td class="file">{file}</td>'
            + _latency_cell(b, fp32, front, False)
            + (_latency_cell(b, fp32, front, True) if batch else "")
            + f'<td>{"every node float" if key == "fp32" else "every node " + e(key)}</td>'
            "<td></td></tr>")


def _head(metric: str, batch: int | None, hidden: bool = False) -> str:
    cells = ["", "point", f"{metric} (held-out split)", f"{metric} (search split)", "weights",
             "file", "latency, batch 1"]
    if batch:
        cells.append(f"latency, batch {batch}")
    cells.append("formats (nodes)")
    if hidden:
        cells.append("beaten by")
    cells.append("QDQ model")
    return "<thead><tr>" + "".join(f"<th>{e(c)}</th>" for c in cells) + "</tr></thead>"


def front_section(job: Any, front: Mapping[str, Any], *, trials_done: int,
                  files: Mapping[int, int], fp32_file: int | None) -> str:
    """The finished search: the recommendation, the stop reason, the chart, the front's
    table with the baselines below it, then the hidden (beaten) points."""
    metric = str(front.get("metric", "metric"))
    points = [p for p in front.get("points") or () if isinstance(p, Mapping)]
    shown = [p for p in points if is_shown(p)]
    hidden = [p for p in points if not is_shown(p)]
    fp32 = front.get("fp32") or {}
    batch = front.get("latency_batch") if any(
        latency(b, True)[0] is not None for _, _, b in baselines(front)) else None
    selected, _ = recommended_index(front)
    trials = f"{trials_done} of {job.trials}" if job.trials else str(trials_done)
    line = recommendation(front)
    none = " none" if selected is None else ""
    head = (f'<p id="recommendation" class="recommendation{none}"><b>Recommendation:</b> '
            f"{e(line)}</p>" if line else "")
    if front.get("stopped"):
        head += f'<p id="stopped" class="note">The search stopped early: {e(front["stopped"])}</p>'
    head += (f'<p id="front-summary">{e(trials)} trials finished (all runs of this job); '
             f"{len(shown)} point(s) on the front"
             + (f", {len(hidden)} more beaten on the held-out re-measure (listed below the "
                "table)" if hidden else "") + ".</p>"
             f'<p class="muted">{e(metric)} is measured on the <b>held-out split</b> (data the '
             f"search never saw); the search optimized it on the <b>search split</b>. A point "
             "that a baseline or another point beats on the held-out re-measure is not shown as "
             f"part of the front. Sizes: {_SIZES}. Latency: the median time of one run in ONNX "
             "Runtime on this machine, with its spread in brackets where measured.</p>")
    if not points:
        return head + '<p class="error" id="no-front">No point met the constraints.</p>'
    source = front.get("latency_source")
    if source != "measured":
        head += ('<p class="muted" id="latency-source">Latency was not measured on this '
                 "machine" + (": the words use the profile's cost estimate" if source else "")
                 + ".</p>")
    rows = "".join(_row(job.id, p, files.get(int(p["index"])), fp32, front, selected=selected,
                        recommended=selected, batch=bool(batch)) for p in shown)
    if not shown:
        rows = (f'<tr><td colspan="{10 if batch else 9}" class="muted">Every point was beaten '
                "by a baseline on the held-out re-measure: deploy the baseline below.</td></tr>")
    base = "".join(_baseline_row(k, label, b, fp32, front, fp32_file, bool(batch))
                   for k, label, b in baselines(front))
    beaten = ""
    if hidden:
        hidden_rows = "".join(_row(job.id, p, files.get(int(p["index"])), fp32, front,
                                   selected=selected, recommended=selected,
                                   batch=bool(batch), hidden=True) for p in hidden)
        beaten = (f'<details id="hidden-points"><summary>{len(hidden)} point(s) beaten on the '
                  "held-out re-measure, kept for the record (not part of the front)</summary>"
                  f'<table id="hidden">{_head(metric, batch, hidden=True)}<tbody>{hidden_rows}'
                  "</tbody></table></details>")
    return (head + '<div id="results-chart" class="chart"></div>'
            f'<form method="get" action="/jobs/{job.id}/export" id="export-form">'
            f'<table id="front">{_head(metric, batch)}<tbody id="front-points">{rows}</tbody>'
            '<tbody id="baselines"><tr class="group"><th colspan="11">Baselines (every node '
            f"in one format)</th></tr>{base}</tbody></table>{target_section(front)}{beaten}"
            '<button type="submit" id="export-button" class="primary">Download the selected '
            "point's QDQ model</button></form>")


def partial_section(job: Any, progress: Mapping[str, Any]) -> str:
    """What a stopped search found before it stopped (its journal's trials, search split)."""
    done = int(progress.get("trials_done") or 0)
    front: Sequence[Sequence[Any]] = progress.get("front") or ()
    total = f" of {job.trials}" if job.trials else ""
    head = (f'<p id="partial-summary">{done}{total} trials finished before the job stopped; '
            f"{len(front)} point(s) on the front so far. Resume continues the same study "
            "from there; <b>Finish with these trials</b> re-measures this front on the "
            "held-out split and makes its points downloadable.</p>")
    if not front:
        return head
    finish = (f'<form method="post" action="/jobs/{job.id}/finish"><button type="submit" '
              f'id="finish">Finish with these {done} trials</button></form>')
    rows = "".join(f"<tr><td>{k}</td><td>{p[0]:.4f}</td><td>{e(bytes_text(p[1]))}</td>"
                   f"<td>{e(p[2] if len(p) > 2 else '')}</td></tr>" for k, p in enumerate(front))
    return (head + finish
            + '<p class="muted">The metric here is measured on the <b>search split</b>: '
            "the held-out check and the exports come when the search finishes.</p>"
            '<div id="results-chart" class="chart"></div><table id="partial-front"><thead><tr>'
            "<th>#</th><th>metric (search split)</th><th>weights</th><th>formats (nodes)</th>"
            "</tr></thead>"
            f"<tbody>{rows}</tbody></table>")
