"""The model page (summary + configuration form) and the job page of ``mpsearch serve``.

Consumes plain values (the model upload and its summary dict, choices for the form, a job
state, its progress dict and ``front.json``); produces HTML strings (see
:mod:`mpsearch._serve_pages` for the shared layout).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mpsearch.serve._pages import bytes_text, e, error_box, file_form, page, summary_html

__all__ = ["job_page", "model_page"]

_IMAGE_FIELDS = (("size", "resize shorter side to", "e.g. 256"), ("crop", "center crop", "224"),
                 ("mean", "mean per channel", "0.485,0.456,0.406"),
                 ("std", "std per channel", "0.229,0.224,0.225"), ("scale", "scale", "1/255"))


def _options(choices: Sequence[tuple[str, str]], selected: str | None) -> str:
    return "".join(f'<option value="{e(v)}"{" selected" if v == selected else ""}>{e(label)}'
                   "</option>" for v, label in choices)


def _select(name: str, label: str, choices: Sequence[tuple[str, str]], selected: str | None,
            **attrs: str) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{e(v)}"' for k, v in attrs.items())
    return (f'<label>{e(label)} <select name="{name}" id="{name}"{extra}>'
            f"{_options(choices, selected)}</select></label>")


def _input(name: str, label: str, value: str, kind: str = "text", **attrs: str) -> str:
    extra = "".join(f' {k}="{e(v)}"' for k, v in attrs.items())
    return (f'<label>{e(label)} <input type="{kind}" name="{name}" id="{name}" '
            f'value="{e(value)}"{extra}></label>')


def model_page(model: Any, summary: Mapping[str, Any], *, profiles: Sequence[tuple[str, str]],
               profile: str, card: str, data: Sequence[tuple[str, str]], selected_data: str,
               metrics: Sequence[str], form: Mapping[str, str], errors: Mapping[str, Any],
               max_bytes: int) -> str:
    base = f"/models/{model.id}"
    value = form.get
    first_input = summary["inputs"][0][0] if summary["inputs"] else "input"
    images = "".join(_input(f"image_{k}", label, "", placeholder=hint)
                     for k, label, hint in _IMAGE_FIELDS)
    images += _select("image_layout", "layout", [("NCHW", "NCHW"), ("NHWC", "NHWC")], "NCHW")
    images += _select("image_mode", "colour", [("RGB", "RGB"), ("L", "grey (L)")], "RGB")
    images += _input("image_input_name", "model input", first_input)
    keep = {"profile": profile, "data": selected_data}
    data_form = file_form(
        f"{base}/data", "data", ".npz,.zip", "Data (.npz, or a .zip of images)", max_bytes,
        extra=f"<details><summary>Preprocessing of a zip of images</summary><div class="
              f'"fields">{images}</div></details>', keep=keep)
    job_form = (
        f'<form method="post" action="{base}/jobs" id="job-form" class="fields">'
        f'<input type="hidden" name="profile" value="{e(profile)}">'
        + _select("data", "data", data, selected_data)
        + _select("method", "range method",
                  [(m, m) for m in ("minmax", "percentile", "entropy", "mse")],
                  value("method", "minmax"))
        + _select("granularity", "weight granularity",
                  [("profile", "as the profile says"), ("per_channel", "per channel"),
                   ("per_tensor", "per tensor")], value("granularity", "profile"))
        + _select("metric", "metric", [("", "auto (accuracy with labels)")]
                  + [(m, m) for m in metrics], value("metric", ""))
        + _input("calibration", "calibration samples", value("calibration", "128"), "number",
                 min="1")
        + _input("held_out", "held-out fraction", value("held_out", "0.5"), "number",
                 min="0", max="0.9", step="0.05")
        + _input("trials", "trials", value("trials", "20"), "number", min="1")
        + _input("max_metric_drop", "max metric drop", value("max_metric_drop", ""), "number",
                 min="0", step="any", placeholder="none")
        + _input("sensitivity_samples", "sensitivity samples", value("sensitivity_samples", ""),
                 "number", min="1", placeholder="all")
        + _input("seed", "seed", value("seed", "0"), "number", min="0")
        + _select("analysis", "per-node analysis in a search",
                  [("on", "on (sensitivity, histograms, curve)"), ("off", "off (faster)")],
                  value("analysis", "on"))
        + '<label><input type="checkbox" name="latency" value="1"'
        + (" checked" if value("latency") else "") + "> latency objective</label>"
        + '<div class="buttons"><button type="submit" name="kind" value="analysis" '
          'id="run-analysis">Run analysis</button><button type="submit" name="kind" '
          'value="search" id="run-search">Run search</button></div></form>')
    choose = (f'<form method="get" action="{base}" class="fields"><input type="hidden" '
              f'name="data" value="{e(selected_data)}"><label>profile <select name="profile" '
              f'id="profile-select" data-card-url="/profiles/card">{_options(profiles, profile)}'
              '</select></label><noscript><button type="submit">Show</button></noscript></form>')
    body = (
        f"<section><h2>Summary</h2>{summary_html(summary)}</section>"
        "<section><h2>Hardware profile</h2>" + choose
        + f'<div id="profile-card">{card}</div>'
        + file_form(f"{base}/profiles", "profile", ".yaml,.yml", "or upload a profile YAML",
                    max_bytes, keep=keep)
        + error_box(errors.get("profile"), "profile")
        + "</section><section><h2>Calibration and validation data</h2>"
        + data_form + error_box(errors.get("data"), "data")
        + "</section><section><h2>Quantization configuration</h2>"
        + job_form + error_box(errors.get("job"), "job") + "</section>")
    return page(f"Model {model.name}", body)


def _state(job: Any, position: int | None) -> str:
    where = f" (#{position} in the queue)" if position else ""
    return f'<span class="state {e(job.state)}" id="job-state">{e(job.state)}{where}</span>'


def _commands(job: Any) -> str:
    lines = "\n".join(e(line) for line in job.commands)
    return f'<pre class="commands" id="commands">{lines}</pre>'


def _front_table(job: Any, front: Mapping[str, Any]) -> str:
    metric = front.get("metric", "metric")
    rows = []
    for p in front.get("points", ()):
        k = int(p["index"])
        counts = ", ".join(f"{f} {n}" for f, n in sorted(p.get("counts", {}).items()))
        latency = "-" if p.get("latency") is None else f"{p['latency']:.2f}×"
        rows.append(
            f'<tr><td><input type="radio" name="point" value="{k}" id="point-{k}"'
            f'{" checked" if k == 0 else ""}></td><td><label for="point-{k}">{k}</label></td>'
            f'<td>{p["metric"]:.4f}</td><td>{e(bytes_text(p["size"]))}</td><td>{latency}</td>'
            f"<td>{e(counts)}</td><td><a href=\"/jobs/{job.id}/export?point={k}\" "
            f'class="download">QDQ model</a></td></tr>')
    fp32 = front.get("fp32") or {}
    note = (f'<p class="muted">FP32: {e(metric)} {fp32.get("metric", float("nan")):.4f}, '
            f'{e(bytes_text(fp32.get("size", 0)))}; {front.get("evaluations", 0)} evaluations'
            "</p>")
    if not rows:
        return note + '<p class="error">No point met the constraints.</p>'
    return (note + f'<form method="get" action="/jobs/{job.id}/export" id="export-form">'
            f'<table id="front"><thead><tr><th></th><th>point</th><th>{e(metric)} (held-out)'
            "</th><th>size</th><th>latency vs FP32</th><th>formats</th><th></th></tr></thead>"
            f'<tbody>{"".join(rows)}</tbody></table><button type="submit" id="export-button">'
            "Download the selected point's QDQ model</button></form>")


def job_page(job: Any, *, progress: Mapping[str, Any] | None, front: Mapping[str, Any] | None,
             has_report: bool, has_profile: bool, run_dir: str, position: int | None) -> str:
    links = [f'<a href="/jobs/{job.id}/spec.yaml" download id="spec-link">spec.yaml</a>']
    if has_profile:
        links.append(f'<a href="/jobs/{job.id}/hw_profile.yaml" download>hw_profile.yaml</a>')
    parts = [f'<p>{_state(job, position)} <a href="/models/{e(job.model)}">model</a> · '
             f'{" · ".join(links)}</p>']
    if job.state in ("queued", "running"):
        parts.append(
            f'<form method="post" action="/jobs/{job.id}/cancel"><button type="submit" '
            'id="cancel">Cancel</button></form><div id="progress" class="progress">'
            '<p id="progress-text">waiting…</p><progress id="progress-bar" max="1" value="0">'
            '</progress><p id="progress-message" class="muted"></p><p id="progress-trials">'
            '</p><div id="mini-front"></div></div>')
    if job.state in ("cancelled", "failed", "interrupted"):
        parts.append(f'<form method="post" action="/jobs/{job.id}/resume"><button '
                     'type="submit" id="resume">Resume</button></form>')
    if job.error:
        parts.append(f'<div class="error" role="alert" id="job-error">{e(job.error)}</div>')
    if job.note:
        parts.append(f'<p class="note">{e(job.note)}</p>')
    if front is not None:
        parts.append(f"<section><h2>Pareto front</h2>{_front_table(job, front)}</section>")
    if has_report:
        parts.append(
            f'<section><h2>Report</h2><p><a href="/jobs/{job.id}/report" target="_blank">'
            f'open in a new tab</a></p><iframe id="report" src="/jobs/{job.id}/report" '
            'title="report"></iframe></section>')
    if job.commands:
        parts.append("<section><h2>From the command line</h2><p class=\"muted\">The same "
                     f"run from a shell (run directory {e(run_dir)}):</p>{_commands(job)}"
                     "</section>")
    data = {"job": job.id, "state": job.state, "higher": job.higher_is_better,
            "progress": dict(progress) if progress else None}
    return page(job.title, "".join(parts), data=data)
