"""The model page (summary + configuration form) and the job page of ``mpsearch serve``.

Consumes plain values (the model upload and its summary dict, choices for the form, a job
state, its progress dict and ``front.json``); produces HTML strings (see
:mod:`mpsearch.serve._pages` for the shared layout).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from mpsearch.serve._frontview import chart_data, export_index
from mpsearch.serve._pages import bytes_text, e, error_box, file_form, page, summary_html
from mpsearch.serve._results import front_section, partial_section
from mpsearch.spec import AUTO_SENSITIVITY

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
    help_text = _HELP.get(name)
    hint = f'<small class="help" id="help-{name}">{e(help_text)}</small>' if help_text else ""
    return (f'<label>{e(label)} <select name="{name}" id="{name}"{extra}>'
            f"{_options(choices, selected)}</select>{hint}</label>")


def _input(name: str, label: str, value: str, kind: str = "text", **attrs: str) -> str:
    extra = "".join(f' {k}="{e(v)}"' for k, v in attrs.items())
    help_text = _HELP.get(name)
    hint = f'<small class="help" id="help-{name}">{e(help_text)}</small>' if help_text else ""
    return (f'<label>{e(label)} <input type="{kind}" name="{name}" id="{name}" '
            f'value="{e(value)}"{extra}>{hint}</label>')


def _spec_default(name: str) -> Any:
    """The default of a :class:`~mpsearch.spec.EvaluationSpec` field (the form agrees with
    it)."""
    import dataclasses

    from mpsearch.spec import EvaluationSpec

    return next(f.default for f in dataclasses.fields(EvaluationSpec) if f.name == name)


_SAMPLES = _spec_default("sensitivity_samples")

_HELP = {
    "held_out": "share of the data kept aside: the search measures on the rest (the search "
                "split), the front is re-measured on this held-out split",
    "max_metric_drop": "largest loss of the metric against FP32 a configuration may have "
                       "to count (0.01 = one point of accuracy); empty: no limit",
    "sensitivity_samples": "samples of the search split the per-node analysis measures "
                           f"each node on; fewer is faster and noisier (default {_SAMPLES}: "
                           "half the split, {} to {}, as a spec's evaluation.sensitivity_samples)"
                           .format(*AUTO_SENSITIVITY),
    "analysis": "before the search, measure each node alone in each format (sensitivity, "
                "range histograms, accuracy-size curve) for the report and to seed the search",
    "trials": "configurations the search builds and measures; more finds a fuller front",
}


def model_page(model: Any, summary: Mapping[str, Any], *, profiles: Sequence[tuple[str, str]],
               profile: str, card: str, data: Sequence[tuple[str, str]], selected_data: str,
               metrics: Sequence[str], form: Mapping[str, str], errors: Mapping[str, Any],
               max_bytes: int, notice: str | None = None) -> str:
    """The model: its summary, then the numbered steps (profile, data, job), the next one
    highlighted; ``notice`` confirms an upload that just happened."""
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
        f"{base}/data", "data", ".npz,.npy,.zip",
        "Upload data (.npz with one array per input, a .npy for a one-input model, or a .zip "
        "of images)", max_bytes,
        extra=f"<details><summary>Preprocessing of a zip of images</summary><div class="
              f'"fields">{images}</div></details>', keep=keep)
    job_form = (
        f'<form method="post" action="{base}/jobs" id="job-form" class="fields">'
        f'<input type="hidden" name="profile" value="{e(profile)}">'
        + _select("data", "data (step 3)", data, selected_data)
        + _select("method", "range method",
                  [(m, m) for m in ("minmax", "percentile", "entropy", "mse")],
                  value("method", "minmax"))
        + _select("granularity", "weight granularity",
                  [("profile", "as the profile says"), ("per_channel", "per channel"),
                   ("per_tensor", "per tensor")], value("granularity", "profile"))
        + _select("metric", "metric", [("", "auto (accuracy with labels, else agreement)")]
                  + [(m, m) for m in metrics], value("metric", ""))
        + _input("calibration", "calibration samples", value("calibration", "128"), "number",
                 min="1")
        + _input("held_out", "held-out fraction", value("held_out", "0.5"), "number",
                 min="0", max="0.9", step="0.05")
        + _input("trials", "trials", value("trials", "20"), "number", min="1")
        + _input("max_metric_drop", "max metric drop", value("max_metric_drop", ""), "number",
                 min="0", step="any", placeholder="none")
        + _input("sensitivity_samples", "sensitivity samples",
                 value("sensitivity_samples", ""), "number", min="1", placeholder=_SAMPLES)
        + _input("seed", "seed", value("seed", "0"), "number", min="0")
        + _select("analysis", "per-node analysis in a search",
                  [("on", "on (sensitivity, histograms, curve)"), ("off", "off (faster)")],
                  value("analysis", "on"))
        + '<label><input type="checkbox" name="latency" value="1"'
        + (" checked" if value("latency") else "") + "> latency objective</label>"
        + '<div class="buttons"><button type="submit" name="kind" value="analysis" '
          'id="run-analysis">Run analysis</button><button type="submit" name="kind" '
          'value="search" id="run-search" class="primary">Run search</button></div></form>')
    choose = (f'<form method="get" action="{base}" class="fields"><input type="hidden" '
              f'name="data" value="{e(selected_data)}"><label>profile <select name="profile" '
              f'id="profile-select" data-card-url="/profiles/card">{_options(profiles, profile)}'
              '</select></label><noscript><button type="submit">Show</button></noscript></form>')
    has_data = bool(selected_data)
    uploaded = "" if not notice else f'<p class="ok" id="uploaded" role="status">{e(notice)}</p>'
    file_bytes = model.info.get("file_bytes")
    size = f" · file {bytes_text(file_bytes)}" if isinstance(file_bytes, int) else ""
    body = (
        f'<p class="muted">Uploaded {e(model.created[:19].replace("T", " "))} UTC{size}. Step 1 '
        "(the model) is done; go through 2 to 4 below. "
        + ('<a href="#step-job" id="next-link">Next: 4, run a search</a>' if has_data else
           '<a href="#step-data" id="next-link">Next: 3, upload the data</a>') + "</p>"
        + uploaded
        + _step(2, "Hardware profile", "profile", False,
                '<p class="muted">What the target runs: the formats each op may take. '
                "x86_ort (ONNX Runtime on this CPU) is a good start.</p>" + choose
                + f'<div id="profile-card">{card}</div>'
                + file_form(f"{base}/profiles", "profile", ".yaml,.yml",
                            "or upload a profile YAML", max_bytes, keep=keep)
                + error_box(errors.get("profile"), "profile"))
        + _step(3, "Data for calibration and validation", "data", not has_data,
                (_data_note(model, data, selected_data)
                 if has_data else
                 '<p class="muted">Upload samples of what the model reads (a few hundred '
                 "are enough; add a 'labels' array for accuracy).</p>")
                + data_form + error_box(errors.get("data"), "data"))
        + _step(4, "Run a search (or only the analysis)", "job", has_data,
                job_form + error_box(errors.get("job"), "job"))
        + f"<section><h2>Model summary</h2>{summary_html(summary)}</section>")
    return page(f"Model {model.name}", body)


def _data_note(model: Any, data: Sequence[tuple[str, str]], selected: str) -> str:
    """Step 3's line when data is already chosen: which data, and that uploading replaces
    it (only the demo comes with its own data)."""
    label = next((text for value, text in data if value == selected), selected)
    if model.info.get("bundled") == "demo" and selected.startswith("bundled:"):
        return ('<p class="muted" id="data-note">The demo comes with its own data, already '
                f"selected in step 4: {e(label)}. Upload other data to use it instead.</p>")
    return (f'<p class="muted" id="data-note">Selected in step 4: {e(label)}. Upload more '
            "data to choose it instead.</p>")


def _step(number: int, title: str, slot: str, is_next: bool, body: str) -> str:
    cls = "step next" if is_next else "step"
    return (f'<section class="{cls}" id="step-{slot}"><h2><span class="n">{number}</span>'
            f"{e(title)}</h2>{body}</section>")


def _state(job: Any, position: int | None) -> str:
    where = f" (#{position} in the queue)" if position else ""
    return f'<span class="state {e(job.state)}" id="job-state">{e(job.state)}{where}</span>'


def _commands(job: Any, exportable: bool, point: int | None) -> str:
    """The job's command lines; ``mpsearch export`` only when there is a front to export, and
    then for ``point`` (the recommended one; the page's script follows the selected row)."""
    lines = []
    for line in job.commands:
        if line.startswith("mpsearch export "):
            if not exportable:
                continue
            k = "K" if point is None else str(point)
            lines.append(re.sub(r"--point (\d+|K)",
                                f'--point <span id="export-point">{k}</span>', e(line)))
        else:
            lines.append(e(line))
    return f'<pre class="commands" id="commands">{chr(10).join(lines)}</pre>'


_PROGRESS = (
    '<div id="progress" class="progress"><p id="overall-text">waiting…</p>'
    '<progress id="overall-bar" max="1"></progress><p id="overall-note" class="muted"></p>'
    '<p id="progress-text" class="stage">waiting…</p><progress id="progress-bar" max="1" '
    'value="0"></progress><p id="progress-message" class="muted"></p>'
    '<p id="progress-trials"></p><div id="mini-front"></div></div>')


def _headline(head: Mapping[str, Any] | None) -> str:
    """An analysis job's headline numbers (see :func:`mpsearch.serve._summaries.
    analysis_headline`)."""
    if head is None or head.get("fp32") is None:
        return ""
    metric = e(head.get("metric") or "metric")
    samples = f" on {head['samples']} samples" if head.get("samples") else ""
    cards = [("FP32 " + metric, f"{float(head['fp32']):.4f}")]
    if head.get("fp32_size"):
        cards.append(("FP32 weights", bytes_text(int(head["fp32_size"]))))
    quantized = head.get("quantized") or {}
    if quantized.get("metric") is not None:
        fmt = e(quantized.get("format") or "quantized")
        cards.append((f"every node {fmt}: {metric}", f"{float(quantized['metric']):.4f}"))
        if quantized.get("size") is not None:
            cards.append((f"every node {fmt}: weights", bytes_text(int(quantized["size"]))))
    sensitive = "".join(
        f"<li><b>{e(fmt)}</b>: {info['high']} of {info['nodes']} nodes highly sensitive; most "
        f"sensitive: {e(', '.join(info['top']))}</li>"
        for fmt, info in (head.get("sensitive") or {}).items())
    return ('<section id="headline"><h2>Headline</h2><div class="cards">'
            + "".join(f'<div class="card"><div class="k">{k}</div><div class="v">{e(v)}</div>'
                      "</div>" for k, v in cards)
            + f'</div><p class="muted">Measured on the analysis samples{e(samples)} (not the '
            "held-out split): a guide to where precision matters, not a deployment figure.</p>"
            + (f"<ul id=\"sensitive\">{sensitive}</ul>" if sensitive else "") + "</section>")


def job_page(job: Any, *, progress: Mapping[str, Any] | None, front: Mapping[str, Any] | None,
             partial: Mapping[str, Any] | None, trials_done: int, files: Mapping[int, int],
             fp32_file: int | None, has_report: bool, has_profile: bool, run_dir: str,
             position: int | None, headline: Mapping[str, Any] | None = None,
             metric_note: str | None = None) -> str:
    """A job: its state and actions, then its results (the recommendation and the front
    first, or an analysis' headline), the report, and the command lines that redo it."""
    links = [f'<a href="/jobs/{job.id}/spec.yaml" download id="spec-link">spec.yaml</a>']
    if has_profile:
        links.append(f'<a href="/jobs/{job.id}/hw_profile.yaml" download>hw_profile.yaml</a>')
    about = " · ".join(e(x) for x in (job.kind, getattr(job, "profile", ""),
                                       f"{job.trials} trials" if job.trials else "") if x)
    parts = [f'<p>{_state(job, position)} <span class="muted">{about}</span> · '
             f'<a href="/models/{e(job.model)}">model {e(getattr(job, "model_name", ""))}</a>'
             f' · {" · ".join(links)}</p>']
    if job.state in ("queued", "running"):
        parts.append(f'<form method="post" action="/jobs/{job.id}/cancel"><button '
                     f'type="submit" id="cancel">Cancel</button></form>{_PROGRESS}')
    if job.state in ("cancelled", "failed", "interrupted"):
        parts.append(f'<form method="post" action="/jobs/{job.id}/resume"><button '
                     'type="submit" id="resume" class="primary">Resume</button></form>')
    if job.error:
        parts.append(f'<div class="error" role="alert" id="job-error">{e(job.error)}</div>')
    if job.state == "unverified":  # finished, but nothing passed the target: not a success
        why = (job.note or "").removeprefix("no verified point: ")
        parts.append('<div class="unverified" role="status" id="job-unverified"><b>No verified '
                     f"point:</b> {e(why)}. The search finished; its front is below for the "
                     "record, and nothing is recommended (the CLI exits 4).</div>")
    elif job.note:
        parts.append(f'<p class="note">{e(job.note)}</p>')
    if metric_note:
        parts.append(f'<p class="note" id="metric-auto">{e(metric_note)}.</p>')
    if front is not None:
        parts.append('<section id="results"><h2>Pareto front</h2>'
                     + front_section(job, front, trials_done=trials_done, files=files,
                                     fp32_file=fp32_file) + "</section>")
    elif partial is not None:
        parts.append('<section id="results"><h2>Partial results</h2>'
                     + partial_section(job, partial) + "</section>")
    if job.kind != "search" and job.state == "done":
        parts.append(_headline(headline))
    if has_report:
        parts.append(
            f'<section><h2>Report</h2><p class="muted">Every chart and table of the run '
            f'(sensitivity, ranges, the accuracy-size curve). <a href="/jobs/{job.id}/report" '
            f'target="_blank">Open it in a new tab</a>.</p><iframe id="report" '
            f'src="/jobs/{job.id}/report" title="report"></iframe></section>')
    if job.commands:
        exportable = front is not None and bool(front.get("points"))
        stopped = job.state in ("cancelled", "failed", "interrupted")
        later = ("" if exportable or job.kind != "search" or not stopped else
                 " <code>mpsearch export</code> works once the search has finished (Resume, or "
                 "Finish with the trials it ran).")
        parts.append("<section><h2>From the command line</h2><p class=\"muted\">The same "
                     f"run from a shell (run directory {e(run_dir)}):{later}</p>"
                     f"{_commands(job, exportable, export_index(front))}</section>")
    data = {"job": job.id, "state": job.state, "higher": job.higher_is_better,
            "progress": dict(progress) if progress else None,
            "chart": chart_data(front, partial)}
    charts = data["chart"] is not None or job.state in ("queued", "running")
    return page(job.title, "".join(parts), data=data,
                scripts=("/static/plotly.min.js",) if charts else ())
