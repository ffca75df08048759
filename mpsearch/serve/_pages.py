"""Server-rendered HTML pages of ``mpsearch serve`` (no templates, no CDN).

Consumes plain values (upload records, a model summary dict, a profile dict, job states);
produces HTML strings. Every text that comes from a user (file names, node names, messages) is
escaped. Styles and the small script live in ``mpsearch/static/`` and are served locally.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from mpsearch.rundir import format_bytes

__all__ = ["bytes_text", "error_page", "index_page", "jobs_page", "jobs_table", "page",
           "profile_card", "summary_html"]

_TOP_NODES = 15


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


def si(value: float, unit: str = "") -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:g} {unit}".strip()


#: Bytes for people: the one formatter, rundir's.
bytes_text = format_bytes


def _dim(d: Any) -> str:
    text = str(d)
    return "?" if text.startswith("unk__") or text in ("", "None") else text


def shape_text(shape: Sequence[Any] | None) -> str:
    """A shape; dimensions ONNX shape inference could not name (``unk__7``) show as ``?``."""
    return "?" if shape is None else "[" + ", ".join(_dim(d) for d in shape) + "]"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, cls: str = "") -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return (f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            "</table>")


def page(title: str, body: str, *, data: Mapping[str, Any] | None = None,
         scripts: Sequence[str] = ()) -> str:
    """A whole page: the local stylesheet and script (after ``scripts``, local addresses such
    as ``/static/plotly.min.js``), ``data`` as JSON for the script."""
    payload = json.dumps(data or {}).replace("<", "\\u003c")
    extra = "".join(f'<script src="{e(src)}"></script>' for src in scripts)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
        f'content="width=device-width, initial-scale=1"><title>{e(title)} · mpsearch</title>'
        '<link rel="icon" href="/favicon.ico" sizes="32x32">'
        '<link rel="stylesheet" href="/static/serve.css"></head><body>'
        '<header><a class="brand" href="/">mpsearch</a><nav><a href="/">Models</a>'
        '<a href="/jobs">Jobs</a></nav></header>'
        f'<main><h1>{e(title)}</h1>{body}</main>'
        f'<script type="application/json" id="page-data">{payload}</script>'
        f'{extra}<script src="/static/serve.js"></script></body></html>')


def error_box(error: Any | None, slot: str) -> str:
    """An inline error (message, and the offending source line when known)."""
    if error is None:
        return f'<div class="error" id="error-{slot}" hidden></div>'
    line = getattr(error, "line", None)
    source = getattr(error, "source_line", None)
    where = (f'<pre class="source"><span class="lineno">{line}</span>{e(source)}</pre>'
             if source is not None else "")
    return f'<div class="error" id="error-{slot}" role="alert">{e(error)}{where}</div>'


def error_page(message: str, status: int) -> str:
    return page("Error", f'<div class="error" role="alert">{e(message)}</div>'
                f'<p class="muted">HTTP {status}. <a href="/">Back to the start page</a></p>')


def file_form(action: str, slot: str, accept: str, label: str, max_bytes: int,
              extra: str = "", keep: Mapping[str, str] | None = None) -> str:
    """An upload form; ``keep`` are the page's current choices, carried through the upload."""
    hidden = "".join(f'<input type="hidden" name="{e(k)}" value="{e(v)}">'
                     for k, v in (keep or {}).items())
    return (f'<form class="upload" method="post" action="{e(action)}" '
            f'enctype="multipart/form-data" data-max-bytes="{max_bytes}" data-slot="{slot}">'
            f'{hidden}<label>{e(label)} <input type="file" name="file" accept="{e(accept)}" '
            f'required></label>{extra}<button type="submit">Upload</button></form>')


def _bundled(bundled: Sequence[str], demo: Sequence[str]) -> str:
    """The bundled models: the demo first, marked as the place to start; fixtures below."""
    first = [n for n in bundled if n in demo]
    rest = [n for n in bundled if n not in demo]
    buttons = "".join(f'<button type="submit" name="name" value="{e(n)}" class="demo" '
                      f'id="open-demo">Open the demo model ({e(n)})</button>' for n in first)
    others = "".join(f'<button type="submit" name="name" value="{e(n)}">{e(n)}</button>'
                     for n in rest)
    return (
        '<form method="post" action="/models/bundled" class="bundled">'
        + (f"{buttons}<span class=\"muted\">a small image classifier with its own data: "
           "the quickest way to try everything</span>" if first else "")
        + (f'<details id="fixtures"><summary>Test fixtures ({len(rest)}), for mpsearch\'s '
           f"own tests</summary>{others}</details>" if rest else "")
        + ("<em>no bundled model found</em>" if not bundled else "") + "</form>")


def index_page(models: Sequence[Any], jobs: Sequence[Any], bundled: Sequence[str],
               max_bytes: int, error: Any | None = None, demo: Sequence[str] = (),
               summaries: Mapping[str, Mapping[str, str]] | None = None) -> str:
    rows = "".join(
        f'<tr><td><a href="/models/{m.id}">{e(m.name)}</a>'
        + (f'<span class="tag">{e(m.info["bundled"])}</span>' if m.info.get("bundled") else "")
        + f'</td><td>{e(m.created[:19].replace("T", " "))}</td>'
        f'<td>{m.info.get("nodes", "")}</td><td>{si(m.info.get("params", 0))}</td>'
        f'<td>{_size(m.info.get("weight_bytes"))}</td><td>{_size(m.info.get("file_bytes"))}'
        "</td></tr>" for m in models)
    body = (
        '<section class="step" id="step-open"><h2><span class="n">1</span>Open a model</h2>'
        '<p class="muted">Then: <b>2</b> pick the hardware profile, <b>3</b> the data '
        "(optional for the demo), <b>4</b> run a search; the results page shows the Pareto "
        "front of accuracy against size and downloads each point's quantized model.</p>"
        + _bundled(bundled, demo)
        + file_form("/models", "model", ".onnx", "or upload your own ONNX model", max_bytes)
        + error_box(error, "model") + "</section>"
        + "<section><h2>Models in this work directory</h2>"
        + ('<table id="models"><thead><tr><th>file</th><th>uploaded (UTC)</th><th>nodes</th>'
           "<th>parameters</th><th>weights</th><th>file size</th></tr></thead>"
           f"<tbody>{rows}</tbody></table>" if models else '<p class="muted">None yet.</p>')
        + f"</section><section><h2>Jobs</h2>{jobs_table(jobs, summaries)}</section>")
    return page("Mixed-precision search", body)


def _size(value: Any) -> str:
    return bytes_text(float(value)) if isinstance(value, (int, float)) else "-"


def jobs_table(jobs: Sequence[Any], summaries: Mapping[str, Mapping[str, str]] | None = None
               ) -> str:
    """Every job with its settings and results (``summaries`` by job id, see
    :func:`mpsearch.serve._summaries.job_summary`), newest first, so runs can be compared."""
    if not jobs:
        return '<p class="muted">No jobs yet.</p>'
    summaries = summaries or {}
    rows = []
    for j in jobs:
        info = summaries.get(j.id, {})
        rows.append(
            f'<tr data-job="{e(j.id)}"><td><a href="/jobs/{j.id}">{e(j.title)}</a></td>'
            f'<td>{e(getattr(j, "model_name", "") or "-")}</td>'
            f'<td>{e(getattr(j, "profile", "") or "-")}</td><td>{e(j.kind)}</td>'
            f'<td>{e(j.trials or "-")}</td>'
            f'<td><span class="state {e(j.state)}">{e(j.state)}</span></td>'
            f'<td class="best">{e(info.get("best", "-"))}</td>'
            f'<td class="smallest">{e(info.get("smallest", "-"))}</td>'
            f'<td class="recommendation">{e(info.get("recommendation", "-"))}</td>'
            f'<td class="formats">{e(info.get("formats", "-"))}</td>'
            f'<td class="settings">{e(info.get("settings", "") or "-")}</td>'
            f'<td class="duration">{e(info.get("duration", "-"))}</td>'
            f"<td>{e(j.created[:19].replace('T', ' '))}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in (
        "job", "model", "profile", "kind", "trials", "status", "best metric (held-out)",
        "smallest size", "recommendation", "recommended formats", "settings", "duration",
        "created (UTC)"))
    return (f'<table id="jobs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody>'
            "</table>")


def jobs_page(jobs: Sequence[Any], summaries: Mapping[str, Mapping[str, str]]) -> str:
    """The Jobs page: every job's settings and results side by side."""
    return page("Jobs", '<p class="muted">Every job of this work directory, newest first: its '
                "settings and what it found (the held-out metric and size of the shown front), "
                "to compare runs.</p>" + jobs_table(jobs, summaries))


def summary_html(summary: Mapping[str, Any]) -> str:
    """The model summary: inputs/outputs, totals, op types and the heaviest nodes."""
    ios = [("input", n, shape_text(s), t) for n, s, t in summary["inputs"]] + [
        ("output", n, shape_text(s), t) for n, s, t in summary["outputs"]]
    nodes = summary["nodes"]
    totals = [("opset", summary["opset"]), ("nodes", len(nodes)),
              ("quantizable nodes", summary["quantizable"]),
              ("parameters", f"{summary['params']:,}"),
              ("weights (FP32)", bytes_text(summary["weight_bytes"])),
              ("MACs", si(summary["macs"])), ("FLOPs", si(summary["flops"]))]
    ops = sorted(summary["op_types"].items(), key=lambda kv: (-kv[1], kv[0]))
    heavy = sorted(nodes, key=lambda n: -n["flops"])[:_TOP_NODES]
    node_rows = [(n["name"], n["op_type"], " ".join(shape_text(s) for s in n["output_shapes"]),
                  f"{n['params']:,}", si(n["flops"]),
                  "yes" if n["quantizable"] else f"no: {n['reason']}") for n in heavy]
    changes = "".join(f"<li>{e(c)}</li>" for c in summary.get("changes") or ())
    return (
        '<div class="cards" id="summary">'
        + "".join(f'<div class="card"><div class="k">{e(k)}</div><div class="v">{e(v)}</div>'
                  "</div>" for k, v in totals)
        + "</div>"
        + '<div class="grid"><div><h3>Inputs and outputs</h3>'
        + table(("", "name", "shape", "dtype"), ios)
        + "<h3>Op types</h3>" + table(("op type", "count"), ops, cls="ops")
        + f"</div><div><h3>Heaviest nodes (by FLOPs, top {_TOP_NODES})</h3>"
        + table(("node", "op", "output shape", "params", "FLOPs", "quantizable"), node_rows,
                cls="nodes")
        + "</div></div>"
        + (f"<details><summary>Normalized on load</summary><ul>{changes}</ul></details>"
           if changes else ""))


def _tensor(t: Mapping[str, Any] | None) -> str:
    if not t:
        return "-"
    if t.get("dtype", "").startswith("float"):
        return str(t["dtype"])
    sym = "sym" if t.get("symmetric") else "asym"
    return f"{t['dtype']} {sym} {str(t.get('granularity', '')).replace('_', '-')}"


def _is_float(fmt: Mapping[str, Any]) -> bool:
    return all(str((fmt.get(t) or {}).get("dtype", "")) == "float32"
               for t in ("activation", "weight"))


def _data_types(formats: Mapping[str, Any]) -> str:
    """Checkboxes (of the job form) for the data types the job may quantize to."""
    boxes = "".join(
        f'<label><input type="checkbox" name="formats" value="{e(n)}" form="job-form" '
        f"checked> {e(n)}</label>" for n, f in formats.items() if not _is_float(f))
    return ('<p class="data-types">Data types to quantize to: <input type="hidden" '
            f'name="formats_shown" value="1" form="job-form">{boxes} '
            '<span class="muted">(the float format is always allowed)</span></p>')


def _note(value: Any) -> str:
    """A profile rule's value as words: a mapping as "key value, ...", a list comma-joined."""
    if isinstance(value, Mapping):
        return ", ".join(f"{str(k).replace('_', ' ')} {_note(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_note(v) for v in value)
    if value is True:
        return "yes"
    return str(value)


def _rule_note(key: str, value: Any) -> str:
    """One note of an op rule in words (fixed quantization parameters, per-format costs)."""
    if key == "fixed_qparams" and isinstance(value, Mapping):
        return "fixed quantization: " + "; ".join(
            f"{fmt} scale {float(q[0]):.4g}, zero point {q[1]}" if isinstance(q, (list, tuple))
            and len(q) == 2 else f"{fmt} {_note(q)}" for fmt, q in value.items())
    if key == "cost" and isinstance(value, Mapping):
        return "relative cost: " + ", ".join(
            f"{fmt} {'unknown' if c is None else f'{float(c):g}'}" for fmt, c in value.items())
    return f"{key.replace('_', ' ')}: {_note(value)}"


def profile_card(profile: Mapping[str, Any]) -> str:
    """A profile's formats and op rules (what the search may choose per op)."""
    formats = profile["formats"]
    rows = [(name, _tensor(f.get("activation")), _tensor(f.get("weight")), f.get("bias", "-"),
             f.get("executes", "-"), "unknown" if f.get("relative_cost") is None
             else f"{f['relative_cost']:g}") for name, f in formats.items()]
    rules = []
    for op, rule in profile.get("op_rules", {}).items():
        notes = [_rule_note(k, v) for k, v in rule.items()
                 if k != "formats" and v not in (None, False, {}, [])]
        rules.append((op, ", ".join(rule.get("formats", ())), "; ".join(notes) or "-"))
    unknowns = "".join(f"<li>{e(u)}</li>" for u in profile.get("unknowns") or ())
    budget = profile.get("memory_budget_bytes")
    return (
        f'<div class="profile-card" data-profile="{e(profile["name"])}"><p><b>'
        f'{e(profile["name"])}</b>: {e(profile.get("description", ""))}</p>'
        f'<p class="muted">default {e(profile.get("default_format"))} · fallback '
        f'{e(profile.get("fallback"))} · unlisted ops '
        f'{e(", ".join(profile.get("unlisted_ops") or ()) or "-")} · memory budget '
        f'{e(bytes_text(budget) if budget else "none")}</p>'
        + table(("format", "activations", "weights", "bias", "executes", "relative cost"),
                rows, cls="formats") + _data_types(formats)
        + f"<details><summary>Op rules ({len(rules)})</summary>"
        + table(("op type", "formats", "notes"), rules, cls="rules") + "</details>"
        + (f"<details><summary>Unknowns ({len(profile.get('unknowns') or ())})</summary>"
           f"<ul>{unknowns}</ul></details>" if unknowns else "")
        + "</div>")
