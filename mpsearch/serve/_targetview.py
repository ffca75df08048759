"""The target on the pages of ``mpsearch serve``: the form's ``verify`` choice and the results'
"On the target" section.

Consumes a profile as a dict (its ``toolchain`` key, when it names one) and ``front.json`` as a
dict; produces HTML. The form offers ``verify`` (none / front / toolchain, as a spec's
``verify:`` key) only for a profile that names a toolchain, and says when that toolchain is not
installed on this machine, with the command that installs it. The results show, per front point
re-measured on the target, the held-out metric in ONNX Runtime and on the target, the nodes on
the accelerator and on the CPU (with the toolchain's reasons) and the toolchain's own cost
figures, as the report's "On the target" section does; without a target run they say the
figures are ONNX Runtime's on this machine's CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mpsearch.serve._pages import e
from mpsearch.serve._store import UploadError

__all__ = ["VERIFY_CHOICES", "check_verify", "target_section", "toolchain_missing",
           "verify_html"]

#: The ``verify`` values and what each does, in the form's words.
VERIFY_CHOICES = (
    ("none", "none: ONNX Runtime on this machine's CPU only"),
    ("front", "front: compile and run the front's points on the target (CPU fallback shown)"),
    ("toolchain", "toolchain: compile every trial; a node left on the CPU makes it infeasible"),
)


def _toolchain(profile: Mapping[str, Any]) -> Mapping[str, Any] | None:
    ref = profile.get("toolchain")
    return ref if isinstance(ref, Mapping) and ref.get("name") else None


def toolchain_missing(name: str) -> str | None:
    """None when toolchain ``name`` is usable here, else its adapter's line saying what to
    install and how."""
    from mpsearch.pipeline import toolchain_missing as missing  # loads the engine: late

    return missing(name)


def verify_html(profile: Mapping[str, Any], selected: str = "none") -> str:
    """The ``verify`` control (bound to the job form) and the toolchain's status, or a line
    saying the profile names no toolchain."""
    ref = _toolchain(profile)
    if ref is None:
        return ('<p class="muted" id="no-toolchain">This profile names no target toolchain: a '
                "search measures in ONNX Runtime on this machine's CPU.</p>")
    name = str(ref["name"])
    settings = ", ".join(f"{k} {v}" for k, v in ref.items() if k != "name")
    missing = toolchain_missing(name)
    if missing is None:
        status = '<span class="ok" id="toolchain-status">installed</span>'
    else:
        status = (f'<span class="error" id="toolchain-status">not installed on this machine: '
                  f"{e(missing)}</span>")
    options = "".join(
        f'<option value="{v}"{" selected" if v == selected else ""}'
        f'{" disabled" if missing is not None and v != "none" else ""}>{e(label)}</option>'
        for v, label in VERIFY_CHOICES)
    return (f'<div id="target-verify" data-toolchain="{e(name)}"><p><b>Target toolchain</b> '
            f"{e(name)}{' (' + e(settings) + ')' if settings else ''}: {status}</p>"
            f'<label>verify on the target <select name="verify" id="verify" form="job-form">'
            f"{options}</select><small class=\"help\">without it, every metric and latency "
            "of the search is ONNX Runtime's on this machine's CPU, not the target's</small>"
            "</label></div>")


def check_verify(verify: str, profile: Mapping[str, Any]) -> None:
    """:class:`UploadError` when ``verify`` asks for a toolchain the profile does not name or
    this machine does not have."""
    if verify == "none":
        return
    ref = _toolchain(profile)
    if ref is None:
        raise UploadError(f"verify '{verify}' needs a profile that names a target toolchain; "
                          f"profile '{profile.get('name')}' names none: choose verify none")
    missing = toolchain_missing(str(ref["name"]))
    if missing is not None:
        raise UploadError(f"verify '{verify}': {missing}; or choose verify none")


def _num(value: Any, form: str = ".4f") -> str:
    return "-" if not isinstance(value, (int, float)) else format(value, form)


def _row(p: Mapping[str, Any]) -> str:
    placed = p.get("target_placement") or {}
    cost = p.get("target_cost") or {}
    target = p.get("target_metric")  # ORT on the same samples when the target ran fewer
    ort = p.get("metric") if placed.get("ort_metric") is None else placed["ort_metric"]
    diff = (target - ort if isinstance(target, (int, float)) and isinstance(ort, (int, float))
            else None)
    nodes, on = int(placed.get("nodes") or 0), int(placed.get("on_accelerator") or 0)
    fallback: Sequence[Mapping[str, Any]] = placed.get("fallback") or ()
    reasons = placed.get("error") or "; ".join(
        f"{f.get('node')}: {f.get('reason')}" for f in fallback) or "-"
    costs = ", ".join(f"{k} {float(v):,.0f}" for k, v in cost.items()
                      if isinstance(v, (int, float))) or "-"
    k, failed = p.get("index"), p.get("target_failure")
    verdict = (f'<td class="verdict failed">failed: {e(failed)}</td>' if failed else
               '<td class="verdict">ok</td>')
    cls = ' class="target-failed"' if failed else ""
    return (f'<tr data-point="{e(k)}"{cls}><td>{e(k)}</td><td class="ort">{_num(ort)}</td>'
            f'<td class="target-metric">{_num(target)}</td><td>{_num(diff, "+.4f")}</td>'
            f'<td class="placement">{on} of {nodes} on the accelerator, {nodes - on} on the '
            f'CPU</td><td class="cost">{e(costs)}</td><td class="fallback">{e(reasons)}</td>'
            f"{verdict}</tr>")


def target_section(front: Mapping[str, Any]) -> str:
    """The results' "On the target" section, or the note that no target run happened."""
    points = [p for p in front.get("points") or ()
              if isinstance(p, Mapping) and p.get("target_placement")]
    if not points:
        return ('<p class="note" id="cpu-numbers">These are ONNX Runtime numbers on this '
                "machine's CPU: no target toolchain verified this search (verify none).</p>")
    first = points[0]["target_placement"]
    settings = ", ".join(f"{k} {v}" for k, v in (first.get("settings") or {}).items())
    head = ("<thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in (
        "point", "metric, ONNX Runtime", "metric, on the target", "target - ORT", "placement",
        "toolchain cost", "on the CPU (the toolchain's reason)", "verdict"))
        + "</tr></thead>")
    return (f'<section id="on-target"><h3>On the target</h3><p>Each front point compiled and '
            f"run by <b>{e(first.get('toolchain'))}</b> ({e(first.get('version', ''))}"
            f"{'; ' + e(settings) if settings else ''}) on the held-out split: the metric as "
            "the target computes it beside ONNX Runtime's, where each node ran, and the "
            "toolchain's own cost figures. Latency above is ONNX Runtime's on this machine's "
            f'CPU.</p><table id="target-table">{head}<tbody>'
            + "".join(_row(p) for p in points) + "</tbody></table></section>")
