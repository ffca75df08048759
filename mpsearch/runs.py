"""Run directories: a whole search from a spec, and export of a front point from a finished run.

Consumes a :class:`~mpsearch.spec.SearchSpec` (or a run directory); produces the run directory
``run.json``, ``spec.json``, ``summary.json``, ``profile.json``, ``calibration/``, the analysis
files, ``study.journal``, ``trials.csv``, ``front.json`` and ``front.csv`` (see README), and for
export a verified QDQ model.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import onnx

from mpsearch import __version__
from mpsearch._io import atomic_write, write_json, write_model
from mpsearch.analysis import analyze
from mpsearch.assignment import estimate_latency, make_assignment, model_size, uniform_assignment
from mpsearch.data import Dataset
from mpsearch.errors import SearchError
from mpsearch.evaluate import Evaluation, Evaluator
from mpsearch.pipeline import Prepared, prepare
from mpsearch.quantize import Quantizer
from mpsearch.runtime import create_session, ort_version
from mpsearch.search import SearchResult, TrialRecord, group_nodes, run_search, seed_assignments
from mpsearch.spec import SearchSpec, check_latency_objective

__all__ = ["DryRun", "ExportResult", "SearchRun", "dry_run", "export_point", "search"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchRun:
    run_dir: Path
    result: SearchResult
    front: tuple[dict[str, Any], ...]
    fp32: Mapping[str, Any]
    uniform: Mapping[str, Mapping[str, Any]]
    metric: str


def _splits(prepared: Prepared, spec: SearchSpec) -> tuple[Dataset, Dataset]:
    """(search, held-out) from the validation data; held-out is never searched on."""
    validation = prepared.validation
    if spec.held_out <= 0 or len(validation) < 2:
        return validation, validation
    return validation.split(1.0 - spec.held_out, spec.data_seed)


def _point(record: TrialRecord, index: int, held: Evaluation, int8: Mapping[str, str],
           latency: float | None, fp32_latency: float | None, searched: set[str]
           ) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for node, fmt in record.assignment.items():
        if node in searched:
            counts[fmt] = counts.get(fmt, 0) + 1
    return {
        "index": index, "trial": record.trial, "metric": held.value,
        "search_metric": record.metric, "size": record.size,
        "latency": None if latency is None or not fp32_latency else latency / fp32_latency,
        "metrics": dict(held.metrics), "assignment": dict(record.assignment), "counts": counts,
        "differs_from_int8": sorted(n for n, f in record.assignment.items()
                                    if int8.get(n) != f),
        "source": record.source,
    }


def _uniform(prepared: Prepared, quantizer: Quantizer, held: Evaluator,
             fp32_latency: float | None) -> dict[str, dict[str, Any]]:
    out = {}
    graph, profile = prepared.graph, prepared.profile
    for fmt in profile.formats:
        if fmt == profile.default_format:
            continue
        try:
            assignment = uniform_assignment(graph, profile, fmt)
        except Exception:  # a format no node may take
            continue
        result = held.evaluate(quantizer.build(assignment))
        latency = estimate_latency(graph, prepared.summary, profile, assignment)
        out[fmt] = {"metric": result.value, "size": model_size(graph, profile, assignment),
                    "latency": None if latency is None or not fp32_latency
                    else latency / fp32_latency}
    return out


def search(
    spec: SearchSpec, run_dir: str | Path | None = None, *, resume: bool = False,
    progress: bool = False,
) -> SearchRun:
    """Prepare, analyse, search and re-measure the front on held-out data; write the run dir."""
    check_latency_objective(spec)  # before any work: an unknown cost fails every trial
    out = Path(run_dir) if run_dir is not None else Path("runs") / Path(spec.path or "x").stem
    out.mkdir(parents=True, exist_ok=True)
    prepared = prepare(spec.model, spec.profile, spec.data,
                       calibration_samples=spec.calibration_samples, method=spec.method,
                       seed=spec.data_seed, batch_size=spec.batch_size, threads=spec.threads,
                       cache_dir=out / "calibration", progress=progress)
    _write_inputs(out, spec, prepared)
    search_data, held_data = _splits(prepared, spec)
    evaluator = Evaluator(prepared.graph, search_data, metric=spec.metric,
                          batch_size=spec.batch_size, threads=spec.threads)
    if spec.analysis:  # node-level sensitivity, distributions and curve for the report
        analyze(prepared, data=search_data, metric=spec.metric, limit=spec.sensitivity_limit,
                batch_size=spec.batch_size, threads=spec.threads, run_dir=out,
                progress=progress)
    result = run_search(prepared, spec, evaluator=evaluator, run_dir=out, resume=resume,
                        progress=progress)
    held = Evaluator(prepared.graph, held_data, metric=spec.metric,
                     batch_size=spec.batch_size, threads=spec.threads)
    graph, profile = prepared.graph, prepared.profile
    fp32_latency = estimate_latency(graph, prepared.summary, profile, {})
    quantizer = Quantizer(graph, prepared.table, profile, method=prepared.method)
    int8 = uniform_assignment(graph, profile, profile.lowest_formats()[0])
    searched = {n for g in group_nodes(graph, profile, spec.formats) for n in g.nodes}
    front = []
    for index, record in enumerate(result.front):
        assignment = make_assignment(graph, profile, record.assignment)
        latency = estimate_latency(graph, prepared.summary, profile, assignment)
        measured = held.evaluate(quantizer.build(assignment))
        front.append(_point(record, index, measured, int8, latency, fp32_latency, searched))
    fp32 = {"metric": held.fp32().value, "size": model_size(graph, profile, {}),
            "latency": 1.0 if fp32_latency else None, "latency_abs": fp32_latency}
    uniform = _uniform(prepared, quantizer, held, fp32_latency)
    run = SearchRun(run_dir=out, result=result, front=tuple(front), fp32=fp32,
                    uniform=uniform, metric=evaluator.primary.name)
    _write_results(run, evaluator)
    return run


def _write_inputs(out: Path, spec: SearchSpec, prepared: Prepared) -> None:
    write_json(out / "spec.json", spec.to_dict())
    write_json(out / "summary.json", prepared.summary.to_dict())
    write_json(out / "profile.json", prepared.profile.to_dict())
    write_json(out / "run.json", {
        "model": spec.model, "profile": spec.profile, "data": spec.data,
        "spec": spec.path, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mpsearch": __version__, "onnxruntime": ort_version(),
    })


def _write_results(run: SearchRun, evaluator: Evaluator) -> None:
    result = run.result
    write_json(run.run_dir / "front.json", {
        "metric": run.metric, "higher_is_better": evaluator.primary.higher_is_better,
        "objectives": ["metric", "size", "latency"], "fp32": dict(run.fp32),
        "uniform": {k: dict(v) for k, v in run.uniform.items()}, "points": list(run.front),
        "evaluations": result.evaluations, "seconds": result.seconds,
        "timing": dict(result.timing),
    })
    fp32_latency = run.fp32.get("latency_abs")
    _write_csv(run.run_dir / "trials.csv", ["trial", "state", "metric", "size", "latency",
                                            "source"],
               [[r.trial, r.state, r.metric, r.size,
                 None if r.latency is None or not fp32_latency else r.latency / fp32_latency,
                 r.source] for r in result.trials])
    _write_csv(run.run_dir / "front.csv",
               ["index", "trial", "metric", "search_metric", "size", "latency", "counts",
                "differs_from_int8", "assignment"],
               [[p["index"], p["trial"], p["metric"], p["search_metric"], p["size"],
                 p["latency"], json.dumps(p["counts"]), " ".join(p["differs_from_int8"]),
                 json.dumps(p["assignment"])] for p in run.front])


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    atomic_write(path, buffer.getvalue().encode())


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportResult:
    path: Path
    point: Mapping[str, Any]
    evaluation: Evaluation
    fp32: Evaluation
    size: int
    fp32_size: int
    latency_s: float
    fp32_latency_s: float


def export_point(run_dir: str | Path, point: int, out: str | Path) -> ExportResult:
    """Rebuild front point ``point`` of a finished run, write it, re-verify it on held-out data."""
    run = Path(run_dir)
    try:
        front = json.loads((run / "front.json").read_text())
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in json.loads((run / "spec.json").read_text()).items()}
        spec = SearchSpec(**fields)
    except (OSError, json.JSONDecodeError, TypeError) as e:
        raise SearchError(f"{run}: not a finished search run ({e}); run `mpsearch search` "
                          "first") from e
    points = front["points"]
    if not 0 <= point < len(points):
        raise SearchError(f"{run}: the front has points 0..{len(points) - 1}, got --point "
                          f"{point}")
    prepared = prepare(spec.model, spec.profile, spec.data,
                       calibration_samples=spec.calibration_samples, method=spec.method,
                       seed=spec.data_seed, batch_size=spec.batch_size, threads=spec.threads,
                       cache_dir=run / "calibration")
    assignment = make_assignment(prepared.graph, prepared.profile, points[point]["assignment"])
    model = Quantizer(prepared.graph, prepared.table, prepared.profile,
                      method=prepared.method).build(assignment)
    onnx.checker.check_model(model)
    write_model(out, model)
    _, held_data = _splits(prepared, spec)
    held = Evaluator(prepared.graph, held_data, metric=spec.metric,
                     batch_size=spec.batch_size, threads=spec.threads)
    evaluation = held.evaluate(onnx.load(str(out)))
    feeds = next(iter(held_data.batches(1)))
    session = held.session(model)
    reference = held.session(prepared.graph.model)
    return ExportResult(
        path=Path(out), point=points[point], evaluation=evaluation, fp32=held.fp32(),
        size=model_size(prepared.graph, prepared.profile, assignment),
        fp32_size=model_size(prepared.graph, prepared.profile, {}),
        latency_s=session.time_batch(feeds), fp32_latency_s=reference.time_batch(feeds),
    )



@dataclass(frozen=True, slots=True, kw_only=True)
class DryRun:
    """What a search would search: its dimensions and seeds (nothing evaluated)."""

    dimensions: int
    seeds: int
    fp32_size: int
    smallest_size: int


def dry_run(spec: SearchSpec, run_dir: str | Path) -> DryRun:
    """Check a spec end to end without searching: load, calibrate, group, seed, build the
    smallest seed and open it in ONNX Runtime."""
    out = Path(run_dir)
    prepared = prepare(spec.model, spec.profile, spec.data,
                       calibration_samples=min(spec.calibration_samples, 32),
                       method=spec.method, seed=spec.data_seed, threads=spec.threads,
                       cache_dir=out / "calibration")
    graph, profile = prepared.graph, prepared.profile
    groups = group_nodes(graph, profile, spec.formats)
    if not groups:
        raise SearchError(f"{spec.path}: no node of {graph.name} can take a quantized format "
                          f"under profile '{profile.name}'; nothing to search")
    seeds = seed_assignments(graph, profile, groups, {})
    smallest = {node: g.formats[0] for g in groups for node in g.nodes}
    model = Quantizer(graph, prepared.table, profile, method=spec.method).build(
        make_assignment(graph, profile, smallest))
    create_session(model, threads=spec.threads)
    return DryRun(dimensions=len(groups), seeds=len(seeds),
                  fp32_size=model_size(graph, profile, {}),
                  smallest_size=model_size(graph, profile, smallest))
