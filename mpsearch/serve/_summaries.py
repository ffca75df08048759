"""One line of results and settings per job, for the Jobs list, and an analysis' headline.

Consumes a job's run directory (``spec.yaml``, ``front.json``, ``curve.json``,
``sensitivity.json``; whichever exist); produces plain dicts of short texts: the settings that
tell runs apart (range method, metric and what "auto" became, held-out share, calibration
samples, seed, analysis), the job's duration, and the results (the best held-out metric and the
smallest size on the shown front, the recommendation and its point's formats), or an analysis
job's headline numbers (FP32 against every node quantized, the most sensitive nodes). Files are
re-read only when they change.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from mpsearch.rundir import RunDir, formats_text, read_json
from mpsearch.serve._frontview import is_shown, recommendation
from mpsearch.serve._pages import bytes_text

__all__ = ["analysis_headline", "job_summary", "metric_note"]

_CACHE: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
_LOCK = threading.Lock()
_TOP = 3
_MAX_CACHED = 4096


def _stamp(paths: tuple[Path, ...]) -> tuple[int, ...]:
    out = []
    for path in paths:
        try:
            out.append(path.stat().st_mtime_ns)
        except OSError:
            out.append(0)
    return tuple(out)


def _spec(run: RunDir) -> dict[str, Any]:
    try:
        spec = yaml.safe_load(run.spec_yaml.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return spec if isinstance(spec, dict) else {}


def metric_note(run_dir: Path, measured: str | None) -> str | None:
    """What ``metric: auto`` became, when the spec left the metric to the data: "metric auto
    became agreement: the data has no labels ..." (None when the spec named one)."""
    if _spec(RunDir(run_dir)).get("metric") or not measured:
        return None
    if measured == "agreement":
        return ("metric auto became agreement: the data has no labels, so the quantized "
                "model is scored by how often its top-1 class matches FP32's")
    return f"metric auto became {measured} (the data has labels)"


def _settings(run: RunDir, measured: str | None = None) -> str:
    spec = _spec(run)
    if not spec:
        return ""
    data = spec.get("data") or {}
    evaluation = spec.get("evaluation") or {}
    auto = f"metric auto: {measured}" if measured else "metric auto"
    words = [str((spec.get("calibration") or {}).get("method", "minmax")),
             str(spec.get("metric") or auto),
             f"held-out {data.get('held_out', '-')}",
             f"{data.get('calibration', '-')} calibration samples",
             f"seed {spec.get('seed', 0)}"]
    if "latency" in (spec.get("objectives") or ()):
        words.append("latency objective")
    if spec.get("analysis") is False:
        words.append("no per-node analysis")
    else:
        words.append(f"{_sensitivity_samples(run, evaluation)} sensitivity samples")
    return ", ".join(words)


def _sensitivity_samples(run: RunDir, evaluation: Mapping[str, Any]) -> str:
    """The spec's ``sensitivity_samples``, with the count ``auto`` took once the analysis
    wrote it ("auto (22)")."""
    setting = evaluation.get("sensitivity_samples", "auto")
    if setting is None:
        return "all"
    analysis = read_json(run.path / "sensitivity.json")
    used = analysis.get("samples") if isinstance(analysis, dict) else None
    return f"auto ({used})" if setting == "auto" and isinstance(used, int) else str(setting)


def _formats(front: Mapping[str, Any]) -> str:
    """The recommended point's formats ("point 3: int16 14, int8 7"), "-" without one."""
    k = front.get("recommended")
    points = front.get("points") or ()
    if not isinstance(k, int) or not 0 <= k < len(points):
        return "-"
    counts = points[k].get("counts") or {}
    return f"point {points[k].get('index', k)}: {formats_text(counts)}"


def _duration(job: Any) -> str:
    """Wall-clock time from start to end of the job's last run ("-" before it ends)."""
    try:
        seconds = (datetime.fromisoformat(job.finished)
                   - datetime.fromisoformat(job.started)).total_seconds()
    except (TypeError, ValueError):
        return "-"
    minutes, rest = divmod(max(0, round(seconds)), 60)
    return f"{minutes}:{rest:02d}"


def _front(front: Mapping[str, Any]) -> dict[str, str]:
    points = [p for p in front.get("points") or () if isinstance(p, Mapping) and is_shown(p)]
    if not points:
        return {"best": "-", "smallest": "-", "recommendation": recommendation(front) or "-",
                "formats": _formats(front)}
    higher = bool(front.get("higher_is_better", True))
    best = (max if higher else min)(float(p["metric"]) for p in points)
    smallest = min(points, key=lambda p: int(p["size"]))
    metric = str(front.get("metric", "metric"))
    return {"best": f"{metric} {best:.4f}",
            "smallest": f"{bytes_text(int(smallest['size']))} ({metric} "
                        f"{float(smallest['metric']):.4f})",
            "recommendation": recommendation(front) or "-", "formats": _formats(front)}


def analysis_headline(run_dir: Path) -> dict[str, Any] | None:
    """An analysis' headline: the metric and size of FP32 and of every node quantized (the
    end of the node-by-node curve), on the samples the analysis measured, and the nodes it
    rated most sensitive per format; None when the analysis wrote nothing yet."""
    run = RunDir(run_dir)
    curve = read_json(run.path / "curve.json")
    sens = read_json(run.path / "sensitivity.json")
    if not isinstance(curve, dict) and not isinstance(sens, dict):
        return None
    out: dict[str, Any] = {"metric": None, "fp32": None, "fp32_size": None, "quantized": None,
                           "samples": None, "sensitive": {}}
    if isinstance(curve, dict):
        out.update(metric=curve.get("metric"), fp32=curve.get("fp32_metric"),
                   fp32_size=curve.get("fp32_size"))
        ends = [steps[-1] for steps in (curve.get("orders") or {}).values()
                if isinstance(steps, list) and steps]
        if ends:
            out["quantized"] = {k: ends[0].get(k) for k in ("metric", "drop", "size",
                                                            "format")}
    if isinstance(sens, dict):
        out["samples"] = sens.get("samples")
        out["metric"] = out["metric"] or sens.get("metric")
        for fmt, nodes in (sens.get("ranking") or {}).items():
            high = {n["node"] for n in sens.get("nodes") or ()
                    if n.get("format") == fmt and n.get("cls") == "high"}
            out["sensitive"][fmt] = {"top": list(nodes[:_TOP]), "high": len(high),
                                     "nodes": len(nodes)}
    return out


def _analysis(run_dir: Path) -> dict[str, str]:
    head = analysis_headline(run_dir)
    if head is None or head["fp32"] is None:
        return {"best": "-", "smallest": "-", "recommendation": "-"}
    metric = head["metric"] or "metric"
    best = f"FP32 {metric} {float(head['fp32']):.4f}"
    quantized = head["quantized"]
    smallest = "-"
    if quantized and quantized.get("size") is not None:
        smallest = (f"{bytes_text(int(quantized['size']))} all {quantized.get('format')} "
                    f"({metric} {float(quantized['metric']):.4f})")
    return {"best": best, "smallest": smallest, "recommendation": "analysis only"}


def job_summary(job: Any, run_dir: Path) -> dict[str, str]:
    """Settings and results of ``job`` for the Jobs list (texts; "-" where there are none)."""
    run = RunDir(run_dir)
    paths = (run.spec_yaml, run.front_json, run.path / "curve.json")
    key = (str(run_dir), (*_stamp(paths), hash(job.state)))
    with _LOCK:
        cached = _CACHE.get(key)
    if cached is not None:
        return dict(cached)
    out = {"settings": _settings(run), "best": "-", "smallest": "-", "recommendation": "-",
           "formats": "-", "duration": _duration(job)}
    if job.state in ("done", "unverified") and job.kind == "search":
        front = read_json(run.front_json)
        if isinstance(front, dict):
            out.update(_front(front))
            out["settings"] = _settings(run, str(front.get("metric") or "") or None)
    elif job.state == "done":
        out.update(_analysis(run_dir))
        head = analysis_headline(run_dir)
        if head is not None and head.get("metric"):
            out["settings"] = _settings(run, str(head["metric"]))
    with _LOCK:
        if len(_CACHE) > _MAX_CACHED:  # stale versions of changed files
            _CACHE.clear()
        _CACHE[key] = out
    return dict(out)
