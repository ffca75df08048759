"""One line of results and settings per job, for the Jobs list, and an analysis' headline.

Consumes a job's run directory (``spec.yaml``, ``front.json``, ``curve.json``,
``sensitivity.json``; whichever exist); produces plain dicts of short texts: the settings that
tell runs apart (range method, metric, held-out share, calibration samples, analysis), and the
results (the best held-out metric and the smallest size on the shown front, the
recommendation), or an analysis job's headline numbers (FP32 against every node quantized,
the most sensitive nodes). Files are re-read only when they change.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from mpsearch.rundir import RunDir, read_json
from mpsearch.serve._frontview import is_shown, recommendation
from mpsearch.serve._pages import bytes_text

__all__ = ["analysis_headline", "job_summary"]

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


def _settings(run: RunDir) -> str:
    try:
        spec = yaml.safe_load(run.spec_yaml.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return ""
    if not isinstance(spec, dict):
        return ""
    data = spec.get("data") or {}
    evaluation = spec.get("evaluation") or {}
    words = [str((spec.get("calibration") or {}).get("method", "minmax")),
             str(spec.get("metric") or "metric auto"),
             f"held-out {data.get('held_out', '-')}",
             f"{data.get('calibration', '-')} calibration samples"]
    if "latency" in (spec.get("objectives") or ()):
        words.append("latency objective")
    if spec.get("analysis") is False:
        words.append("no per-node analysis")
    else:
        words.append(f"{evaluation.get('sensitivity_samples', '-')} sensitivity samples")
    return ", ".join(words)


def _front(front: Mapping[str, Any]) -> dict[str, str]:
    points = [p for p in front.get("points") or () if isinstance(p, Mapping) and is_shown(p)]
    if not points:
        return {"best": "-", "smallest": "-", "recommendation": recommendation(front) or "-"}
    higher = bool(front.get("higher_is_better", True))
    best = (max if higher else min)(float(p["metric"]) for p in points)
    smallest = min(points, key=lambda p: int(p["size"]))
    metric = str(front.get("metric", "metric"))
    return {"best": f"{metric} {best:.4f}",
            "smallest": f"{bytes_text(int(smallest['size']))} ({metric} "
                        f"{float(smallest['metric']):.4f})",
            "recommendation": recommendation(front) or "-"}


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
    out = {"settings": _settings(run), "best": "-", "smallest": "-", "recommendation": "-"}
    if job.state == "done" and job.kind == "search":
        front = read_json(run.front_json)
        if isinstance(front, dict):
            out.update(_front(front))
    elif job.state == "done":
        out.update(_analysis(run_dir))
    with _LOCK:
        if len(_CACHE) > _MAX_CACHED:  # stale versions of changed files
            _CACHE.clear()
        _CACHE[key] = out
    return dict(out)
