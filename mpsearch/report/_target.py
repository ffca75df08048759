"""The report's "On the target" section: front points as the profile's toolchain ran them.

Consumes ``front.json`` of a run searched with ``verify: toolchain`` or ``front``; produces
HTML: per point the verdict (a point the target rejected is marked FAILED with the reason),
the held-out metric in ONNX Runtime and on the target and their difference, the nodes on the
accelerator, the toolchain's cost figures, and (folded) every node's unit, precision, cycles
and the toolchain's reason when it is not on the accelerator. Every text from the run is
escaped.
"""

from __future__ import annotations

import html as _html
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["target_html"]


def esc(text: object) -> str:
    return _html.escape(str(text), quote=True)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>' \
           "</table></div>"


def _num(value: Any, form: str = ".4f") -> str:
    return "-" if value is None else format(value, form)


def _samples(points: Sequence[Mapping[str, Any]]) -> str:
    """Which samples the target ran: the held-out split, or its first N."""
    for p in points:
        placed = p["target_placement"]
        if placed.get("ort_metric") is not None:
            return (f"the first {esc(placed.get('samples'))} samples of the held-out split "
                    "(evaluation.target_samples; ONNX Runtime's metric on the same samples)")
    return "the held-out split"


def _verdict_line(points: Sequence[Mapping[str, Any]]) -> str:
    """One sentence: how many verified points the target rejected (never recommended)."""
    failed = [p for p in points if p.get("target_failure")]
    if not failed:
        return f"<p>All {len(points)} verified point(s) passed on the target.</p>"
    which = ", ".join(str(p.get("index")) for p in failed)
    return (f'<p><b>{len(failed)} of {len(points)} verified point(s) failed on '
            f"the target</b> (point {esc(which)}): the toolchain crashed, could not compile or "
            "run it, or its metric lies outside the profile's target tolerance. Such a point is "
            "never recommended.</p>")


def target_html(front: Mapping[str, Any]) -> str | None:
    """The section's HTML, or None when no front point was run on a target."""
    points = [p for p in front.get("points", []) if p.get("target_placement")]
    if not points:
        return None
    first = points[0]["target_placement"]
    settings = ", ".join(f"{k} {v}" for k, v in (first.get("settings") or {}).items())
    intro = (f"<p>Each front point compiled and run by <b>{esc(first.get('toolchain'))}</b> "
             f"({esc(first.get('version', ''))}{'; ' + esc(settings) if settings else ''}) on "
             f"{_samples(points)}: the metric as the target computes it beside ONNX "
             "Runtime's, and the toolchain's own cost figures.</p>")
    rows = []
    for p in points:
        placed, cost = p["target_placement"], p.get("target_cost") or {}
        target = p.get("target_metric")
        ort = p.get("metric") if placed.get("ort_metric") is None else placed["ort_metric"]
        diff = None if target is None or ort is None else target - ort
        failure = p.get("target_failure")
        rows.append([p.get("index"), "FAILED: " + str(failure) if failure else "ok",
                     _num(ort), _num(target), _num(diff, "+.4f"),
                     f"{placed.get('on_accelerator', 0)} of {placed.get('nodes', 0)}",
                     ", ".join(f"{k} {v:.0f}" for k, v in cost.items()) or "-",
                     "; ".join(f"{f['node']}: {f['reason']}"
                               for f in placed.get("fallback", [])) or "-"])
    html = intro + _verdict_line(points) + _table(
        ["point", "verdict", "ORT", "target", "target - ORT", "on the accelerator", "cost",
         "on the CPU (the toolchain's reason)"], rows)
    for p in points:
        placements = p["target_placement"].get("placements") or []
        if not placements:
            continue
        detail = _table(["node", "unit", "precision", "cycles", "reason"],
                        [[q["node"], q["unit"], q["precision"], _num(q.get("cycles"), ".0f"),
                          q.get("reason") or ""] for q in placements])
        html += (f"<details><summary>Point {esc(p.get('index'))}: every node on the target"
                 f"</summary>{detail}</details>")
    return html
