"""Builds from a prepared model: a front point exported (and verified on its target), one
uniform or given assignment quantized, and the calibrate, evaluate and dry-run commands."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from mpsearch._io import write_model
from mpsearch.assignment import (
    Assignment,
    load_assignment,
    make_assignment,
    model_size,
    uniform_assignment,
)
from mpsearch.calibration import CalibrationTable, calibrate_cached
from mpsearch.clock import time_runs
from mpsearch.data import Dataset, check_signature, load_data
from mpsearch.errors import SearchError, SpecError
from mpsearch.evaluate import Evaluation, Evaluator
from mpsearch.graph import load_model
from mpsearch.pipeline._prepare import (
    Prepared,
    _prepare_options,
    _rundir,
    _splits,
    prepare,
    prepare_inputs,
)
from mpsearch.pipeline._search import _evaluator
from mpsearch.profiles import load_profile, measures_latency
from mpsearch.progress import Reporter
from mpsearch.rundir import FrontPoint, RunDir
from mpsearch.runtime import create_session
from mpsearch.search import group_nodes, seed_assignments
from mpsearch.spec import SearchSpec, load_spec
from mpsearch.targets import TargetError
from mpsearch.targets._verify import TargetVerifier, placement_record


@dataclass(frozen=True, slots=True, kw_only=True)
class BuiltModel:
    """A QDQ model written to ``path`` and measured against FP32 on held-out data: metrics,
    weight bytes and the median batch-1 latency of both. ``point`` is the front point it
    was exported from, if any. The latencies are :mod:`mpsearch.clock`'s medians of both
    models interleaved, None where this host does not run the profile's target."""

    path: Path
    assignment: Assignment
    evaluation: Evaluation
    fp32: Evaluation
    size: int
    fp32_size: int
    latency_s: float | None
    fp32_latency_s: float | None
    point: FrontPoint | None = None
    #: With ``target``: the toolchain's artifact, the held-out metric it computes, and its
    #: placement record (:func:`~mpsearch.targets._verify.placement_record`) and cost.
    target_artifact: Path | None = None
    target_metric: float | None = None
    target_placement: dict[str, Any] | None = None
    target_cost: dict[str, float] | None = None


def _build(prepared: Prepared, assignment: Assignment, out: str | Path, data: Dataset,
           spec: SearchSpec, point: FrontPoint | None = None) -> BuiltModel:
    """Build, check and write ``assignment``, then measure the written file on ``data``."""
    model = prepared.quantizer.build(assignment)
    onnx.checker.check_model(model)
    write_model(out, model)
    try:  # a model that cannot be measured is not left behind
        evaluator = _evaluator(prepared, data, spec)
        feeds = next(iter(data.batches(1)))
        graph, profile = prepared.graph, prepared.profile
        latency: tuple[float | None, ...] = (None, None)
        if measures_latency(profile):
            sessions = (evaluator.session(model), evaluator.session(graph.model))
            latency = tuple(t.seconds for t in time_runs([s.run for s in sessions], feeds))
        return BuiltModel(
            path=Path(out), assignment=assignment,
            evaluation=evaluator.evaluate(onnx.load(str(out))), fp32=evaluator.fp32(),
            size=model_size(graph, profile, assignment),
            fp32_size=model_size(graph, profile, {}),
            latency_s=latency[0], fp32_latency_s=latency[1], point=point)
    except BaseException:
        Path(out).unlink(missing_ok=True)
        raise


def _spec_of(run: RunDir) -> SearchSpec:
    if not run.spec_yaml.is_file():
        raise SearchError(f"{run.path}: not a finished search run (no {run.spec_yaml.name}); "
                          "run `mpsearch search` first")
    return load_spec(run.spec_yaml)


def export_point(run_dir: RunDir | str | Path, point: int, out: str | Path, *,
                 target: bool = False) -> BuiltModel:
    """Rebuild front point ``point`` of a finished run, write it, re-verify it on held-out data;
    with ``target``, also compile it with the profile's toolchain into ``<out stem>_<name>/``
    beside it and measure the artifact on the held-out data as the target computes it."""
    run = _rundir(run_dir)
    front = run.read_front()
    if not 0 <= point < len(front.points):
        raise SearchError(f"{run.path}: the front has points 0..{len(front.points) - 1}, got "
                          f"point {point}")
    spec = _spec_of(run)
    prepared = prepare(spec, run)
    chosen = front.points[point]
    assignment = make_assignment(prepared.graph, prepared.profile, chosen.assignment)
    held = _splits(prepared, spec)[1]
    built = _build(prepared, assignment, out, held, spec, chosen)
    return _with_target(built, prepared, spec, held) if target else built


def _with_target(built: BuiltModel, prepared: Prepared, spec: SearchSpec, held: Dataset
                 ) -> BuiltModel:
    """``built`` with the profile's toolchain artifact beside it, measured on ``held``."""
    try:
        verifier = TargetVerifier(prepared.quantizer, built.path.parent,
                                  next(iter(held.batches(1))))
    except TargetError as e:
        raise SearchError(f"export --target: {e}") from e
    folder = built.path.parent / f"{built.path.stem}_{verifier.tool.name}"
    names, compiled = verifier.compile(built.assignment, folder=folder)
    evaluator = _evaluator(prepared, held, spec)
    metrics = evaluator.metrics(verifier.outputs(compiled, names, evaluator))
    return replace(built, target_artifact=compiled.artifact,
                   target_metric=metrics[evaluator.primary.name],
                   target_placement=placement_record(compiled), target_cost=dict(compiled.cost))


def quantize_one(spec: SearchSpec, out: str | Path, *, uniform: str | None = None,
                 assignment: str | os.PathLike[str] | None = None,
                 progress: Reporter | None = None) -> BuiltModel:
    """``mpsearch quantize``: one QDQ model (``uniform`` format, or an assignment JSON file)
    built, written and measured on the validation split against FP32."""
    if (uniform is None) == (assignment is None):
        raise SpecError("quantize: give exactly one of a uniform format or an assignment file")
    graph, profile = load_model(spec.model), load_profile(spec.profile)
    chosen = (uniform_assignment(graph, profile, uniform) if uniform is not None
              else load_assignment(str(assignment), graph, profile))  # before any work
    prepared = prepare_inputs(graph, profile, spec.data.source, progress=progress,
                              **_prepare_options(spec))
    return _build(prepared, chosen, out, prepared.validation, spec)


def calibrate_model(
    model: str | os.PathLike[str], data: str | os.PathLike[str], out: str | os.PathLike[str], *,
    samples: int | None = None, progress: Reporter | None = None, **options: Any,
) -> CalibrationTable:
    """``mpsearch calibrate``: one calibration pass over the first ``samples`` samples of
    ``data`` (all by default), saved in ``out`` (or loaded from there when the model and data
    match). ``options`` go to :func:`mpsearch.calibrate`."""
    graph = load_model(model)
    dataset = load_data(data).for_inputs([i.name for i in graph.inputs])
    if samples is not None:
        dataset = dataset.take(samples)
    check_signature(dataset, graph)
    return calibrate_cached(graph, dataset, out, progress=progress, **options)


def evaluate_model(model: str | os.PathLike[str], data: str | os.PathLike[str], *,
                   reference: str | os.PathLike[str] | None = None,
                   metric: str | None = None) -> Evaluation:
    """``mpsearch eval``: the metrics of ``model`` against the outputs of ``reference`` (the
    model itself by default) on ``data``."""
    graph = load_model(reference or model)
    dataset = load_data(data).for_inputs([i.name for i in graph.inputs])
    evaluator = Evaluator(graph, dataset, metric=metric)
    return evaluator.evaluate(load_model(model).model, require_finite=True)


# -- dry run ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class DryRun:
    """What a search would search: its dimensions and seeds (nothing evaluated)."""

    dimensions: int
    seeds: int
    fp32_size: int
    smallest_size: int


def dry_run(spec: SearchSpec, run_dir: RunDir | str | Path) -> DryRun:
    """Check a spec end to end without searching: load, calibrate, group, seed, build the
    smallest seed and open it in ONNX Runtime."""
    quick = replace(spec.data, calibration=min(spec.data.calibration, 32))
    prepared = prepare(replace(spec, data=quick), run_dir)
    graph, profile = prepared.graph, prepared.profile
    groups = group_nodes(graph, profile, spec.formats)
    if not groups:
        raise SearchError(f"{spec.path}: no node of {graph.name} can take a quantized format "
                          f"under profile '{profile.name}'; nothing to search")
    seeds = seed_assignments(graph, profile, groups, {})
    smallest = {node: g.formats[0] for g in groups for node in g.nodes}
    model = prepared.quantizer.build(make_assignment(graph, profile, smallest))
    create_session(model, threads=spec.evaluation.threads)
    return DryRun(dimensions=len(groups), seeds=len(seeds),
                  fp32_size=model_size(graph, profile, {}),
                  smallest_size=model_size(graph, profile, smallest))
