"""The one place where the stages are composed; the CLI and the web server call only this.

``prepare`` loads and checks a spec's model, profile and data, splits the data and calibrates
once (cached in the run directory); ``analyze_run``, ``search_run``, ``export_point`` and
``quantize_one`` compose the stages after it, each with one shared
:class:`~mpsearch.analysis.Measurer` per data split, and write the run directory through
:class:`~mpsearch.rundir.RunDir`. The stages themselves take (graph, profile, table, data) and
know nothing of specs, run directories or each other.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from mpsearch import __version__
from mpsearch._io import write_json, write_model
from mpsearch._results import held_out_front, relative_latency, write_analysis
from mpsearch.analysis import (
    Analysis,
    Measurer,
    Thresholds,
    analyze,
)
from mpsearch.assignment import (
    Assignment,
    latency_unknown_reason,
    load_assignment,
    make_assignment,
    model_size,
    uniform_assignment,
)
from mpsearch.calibration import CalibrationTable, calibrate, calibrate_cached
from mpsearch.clock import time_runs
from mpsearch.data import Dataset, check_finite, check_signature, load_data
from mpsearch.errors import DataError, ModelError, SearchError, SpecError
from mpsearch.evaluate import Evaluation, Evaluator
from mpsearch.graph import ModelGraph, load_model
from mpsearch.profiles import (
    HardwareProfile,
    check_profile_for_cpu,
    load_profile,
    measures_latency,
)
from mpsearch.progress import Reporter
from mpsearch.quantize import Quantizer
from mpsearch.recovery import (
    DECISION_SAMPLES,
    CorrectedQuantizer,
    InputHessians,
    InputMeans,
    RecoveryDecision,
    RecoverySettings,
    recover,
)
from mpsearch.rundir import (
    Front,
    FrontPoint,
    MeasurementCache,
    RunDir,
    check_measurements,
    read_json,
)
from mpsearch.runtime import create_session, ort_version
from mpsearch.search import (
    MEASURE_ABOVE,
    SearchResult,
    SearchSettings,
    check_resume,
    group_nodes,
    run_search,
    seed_assignments,
)
from mpsearch.spec import SearchSpec, load_spec
from mpsearch.summary import ModelSummary, summarize
from mpsearch.targets import TargetError
from mpsearch.targets._probes import ProbeResult, check_profile
from mpsearch.targets._verify import (
    TargetVerifier,
    placement_record,
    target_for,
    toolchain_version,
)

__all__ = ["BuiltModel", "DryRun", "Prepared", "SearchRun",
           "analyze_prepared", "analyze_run", "calibrate_model", "dry_run", "evaluate_model",
           "export_point", "prepare", "prepare_inputs", "quantize_one", "search_run",
           "split_data", "write_analysis", "write_model"]

logger = logging.getLogger(__name__)

#: In a search, the report's extra views (the reverse view and the curves) measure at most this
#: many configurations each; ``mpsearch analyze`` measures them whole.
REPORT_VIEW_NODES = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """Everything the stages share, computed once: the composer's own record."""

    graph: ModelGraph
    summary: ModelSummary
    profile: HardwareProfile
    calibration: Dataset
    validation: Dataset
    table: CalibrationTable
    method: str
    means: InputMeans | None = None  # set when builds are bias-corrected
    hessians: InputHessians | None = None  # set when builds round weights by GPTQ
    recovery: RecoveryDecision | None = None  # what `recovery: auto` decided, and why

    def quantizer(self) -> Quantizer:
        if self.means is not None or self.hessians is not None:
            return CorrectedQuantizer(self.graph, self.table, self.profile, means=self.means,
                                      hessians=self.hessians, method=self.method)
        return Quantizer(self.graph, self.table, self.profile, method=self.method)


def split_data(data: Dataset, calibration_samples: int, seed: int) -> tuple[Dataset, Dataset]:
    """Seeded split into (calibration, validation); calibration gets at most half the data."""
    if len(data) < 2:
        raise DataError(f"{data.source}: {len(data)} sample(s); need at least 2 to calibrate "
                        "and validate")
    count = max(1, min(calibration_samples, len(data) // 2))
    return data.split(count / len(data), seed)


def prepare_inputs(
    model: str | os.PathLike[str] | onnx.ModelProto | ModelGraph,
    profile: str | os.PathLike[str] | HardwareProfile,
    data: str | os.PathLike[str] | Dataset,
    *,
    calibration_samples: int = 256,
    method: str = "minmax",
    seed: int = 0,
    batch_size: int | None = None,
    threads: int = 2,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Reporter | None = None,
    cle: bool | None = False,
    bias_correction: bool | None = False,
    gptq: bool | None = False,
    smoothquant: bool | None = False,
    smoothquant_alpha: float = 0.5,
    held_out: float = 0.5,
    metric: str | None = None,
    recovery_cache: str | os.PathLike[str] | None = None,
) -> Prepared:
    """Load and check the inputs (objects or paths), split the data and calibrate once (or
    load the table cached in ``cache_dir``); ``batch_size`` None sizes the calibration
    batches from a memory budget (:func:`mpsearch.calibrate`). ``cle`` equalizes the graph
    after loading; ``smoothquant`` then migrates LayerNorm outputs' per-channel ranges into
    the MatMul/Gemm weights reading them, from the calibration split's channel maxima
    (``smoothquant_alpha``: migration strength), so calibration sees the smoothed graph;
    ``gptq`` rounds every build's 8-bit weights by GPTQ and ``bias_correction`` corrects its
    biases, both from the calibration split (:mod:`mpsearch.recovery`). A recovery setting
    None is decided by :func:`mpsearch.recovery.recover` on the search split (the validation
    split less its ``held_out`` fraction; ``metric`` is recorded beside the SQNRs); the
    decision is kept in ``recovery_cache`` (a JSON file) and read back when its inputs match."""
    graph = model if isinstance(model, ModelGraph) else load_model(model)
    hw = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
    dataset = data if isinstance(data, Dataset) else load_data(data)
    dataset = dataset.for_inputs([i.name for i in graph.inputs])
    check_signature(dataset, graph)
    _check_inputs(graph, hw, dataset)
    mismatch = check_profile_for_cpu(hw.name)
    if mismatch:
        logger.warning(mismatch)
    for node in graph.nodes.values():  # fail early when the target cannot run an op at all
        hw.formats_for_node(node)
    calib, valid = split_data(dataset, calibration_samples, seed)
    options: dict[str, Any] = dict(batch_size=batch_size, threads=threads, progress=progress)

    def calibrate_graph(g: ModelGraph) -> CalibrationTable:
        if cache_dir is not None:
            return calibrate_cached(g, calib, cache_dir, **options)
        return calibrate(g, calib, **options)

    settings = RecoverySettings(cle=cle, bias_correction=bias_correction, gptq=gptq,
                                smoothquant=smoothquant, smoothquant_alpha=smoothquant_alpha)
    search = search_split(valid, held_out, seed)[0]
    key = _recovery_key(graph, hw, calib, search, settings, metric) if settings.auto else {}
    decided = _cached_decision(recovery_cache, key) if settings.auto else None
    if decided is not None:  # the decision this run made before: its methods, fixed
        settings = RecoverySettings(**decided.chosen, smoothquant_alpha=smoothquant_alpha)
    done = recover(graph, hw, calib, search, calibrate_graph, settings, metric=metric,
                   threads=threads, progress=progress)
    if cache_dir is not None and done.decision is not None:
        done.table.save(cache_dir)  # the chosen graph's table, for the next prepare
    if recovery_cache is not None and done.decision is not None:
        write_json(Path(recovery_cache), {"key": key, "decision": done.decision.to_dict()})
    graph, table = done.graph, done.table
    logger.info("calibrated %d tensors on %d samples", len(table.tensors), len(calib))
    return Prepared(graph=graph, summary=summarize(graph), profile=hw, calibration=calib,
                    validation=valid, table=table, method=method, means=done.means,
                    hessians=done.hessians, recovery=decided or done.decision)


def _recovery_key(graph: ModelGraph, profile: HardwareProfile, calib: Dataset, search: Dataset,
                  settings: RecoverySettings, metric: str | None) -> dict[str, Any]:
    """What a recovery decision depends on (its cache key)."""
    return {"mpsearch": __version__, "model": graph.fingerprint,
            "profile": _digest(profile.to_dict()), "calibration": calib.fingerprint,
            "search": search.fingerprint, "settings": _digest(asdict(settings)), "metric": metric,
            "samples": DECISION_SAMPLES, "onnxruntime": ort_version()}


def _cached_decision(path: str | os.PathLike[str] | None, key: dict[str, Any]
                     ) -> RecoveryDecision | None:
    """The decision saved in ``path`` for ``key`` (None: none, or for other inputs)."""
    saved = None if path is None else read_json(Path(path))
    if not isinstance(saved, dict) or saved.get("key") != key:
        return None
    try:
        return RecoveryDecision.from_dict(saved["decision"])
    except (KeyError, TypeError, ValueError):
        return None


def _check_inputs(graph: ModelGraph, profile: HardwareProfile, data: Dataset) -> None:
    """Before any work: the model has weights to quantize, and no sample of the data (named
    by its place in the file, before any split) holds NaN or Inf."""
    if model_size(graph, profile, {}) == 0:
        raise ModelError(f"{graph.path or graph.name}: the model has no weights; mixed "
                         "precision has nothing to make smaller")
    batch = 256
    for index, feeds in enumerate(data.batches(batch)):
        check_finite(feeds, source=data.source, batch=index, batch_size=batch)


def prepare(spec: SearchSpec, run_dir: RunDir | str | Path | None = None, *,
            progress: Reporter | None = None) -> Prepared:
    """:func:`prepare_inputs` of a spec; the calibration table is cached in ``run_dir``."""
    run = None if run_dir is None else _rundir(run_dir)
    return prepare_inputs(spec.model, spec.profile, spec.data.source,
                          cache_dir=None if run is None else run.calibration, progress=progress,
                          recovery_cache=None if run is None else run.recovery_json,
                          **_prepare_options(spec))


def _prepare_options(spec: SearchSpec) -> dict[str, Any]:
    """The spec's calibration, split and ``recovery`` settings as :func:`prepare_inputs`
    takes them."""
    return dict(**asdict(spec.recovery), calibration_samples=spec.data.calibration,
                method=spec.calibration.method, seed=spec.data.seed,
                threads=spec.evaluation.threads, held_out=spec.data.held_out,
                metric=spec.metric)


def _rundir(run_dir: RunDir | str | Path) -> RunDir:
    return run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)


def search_split(validation: Dataset, held_out: float, seed: int) -> tuple[Dataset, Dataset]:
    """(search, held-out) from the validation data; held-out is never searched on (nor is
    recovery decided on it)."""
    if held_out <= 0 or len(validation) < 2:
        return validation, validation
    return validation.split(1.0 - held_out, seed)


def _splits(prepared: Prepared, spec: SearchSpec) -> tuple[Dataset, Dataset]:
    """(search, held-out) of ``prepared`` under ``spec``: :func:`search_split`."""
    return search_split(prepared.validation, spec.data.held_out, spec.data.seed)


def _digest(value: Any) -> str:
    """Short sha256 of ``value`` as canonical JSON (what a cache or a study is keyed by)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextmanager
def _measuring(prepared: Prepared, data: Dataset, run: RunDir | None, name: str, *,
               metric: str | None, batch_size: int, threads: int,
               prefix_samples: int | None = None) -> Iterator[Measurer]:
    """The measurer of one data split, its cache (in ``run`` when given) keyed by every input
    it depends on and flushed when the block ends, however it ends; ``prefix_samples``: see
    :class:`~mpsearch.analysis.Measurer`."""
    key = {"mpsearch": __version__, "split": name, "model": prepared.graph.fingerprint,
           "table": prepared.table.data_fingerprint, "data": data.fingerprint,
           "samples": len(data), "profile": prepared.profile.name,
           "profile_digest": _digest(prepared.profile.to_dict()),
           "method": prepared.method, "metric": metric, "onnxruntime": ort_version(),
           "bias_correction": prepared.means is not None,
           "gptq": prepared.hessians is not None, "prefix_samples": prefix_samples}
    cache = MeasurementCache(None if run is None else run.measurements, name, key)
    try:
        yield Measurer(prepared.quantizer(), data, metric=metric, batch_size=batch_size,
                       threads=threads, cache=cache, on_new=cache.changed,
                       prefix_samples=prefix_samples)
    finally:
        cache.flush()


def _spec_measuring(prepared: Prepared, spec: SearchSpec, data: Dataset, run: RunDir,
                    name: str, *, prefix: bool = False) -> AbstractContextManager[Measurer]:
    """:func:`_measuring` with the spec's settings; ``prefix``: configurations measured on
    the sensitivity samples run only what they change."""
    evaluation = spec.evaluation
    return _measuring(prepared, data, run, name, metric=spec.metric,
                      batch_size=evaluation.batch_size, threads=evaluation.threads,
                      prefix_samples=evaluation.sensitivity_samples if prefix else None)


def _write_inputs(run: RunDir, spec: SearchSpec, prepared: Prepared, kind: str) -> None:
    """The spec (YAML and JSON) and ``run.json``."""
    run.create()
    run.write_spec(spec)
    run.write_run(spec=spec.to_dict(), run={
        "kind": kind, "name": spec.name or Path(spec.model).name, "model": spec.model,
        "profile": spec.profile, "resolved_profile": prepared.profile.name,
        "data": spec.data.source,
        "spec": spec.path, "mpsearch": __version__, "onnxruntime": ort_version()})


def _write_model_info(run: RunDir, prepared: Prepared) -> None:
    run.write_model_info(summary=prepared.summary.to_dict(), profile=prepared.profile.to_dict())


# -- analyze ---------------------------------------------------------------------------------
def analyze_prepared(
    prepared: Prepared, run_dir: RunDir | str | Path | None = None, *,
    data: Dataset | None = None, metric: str | None = None, samples: int | None = None,
    batch_size: int = 64, threads: int = 2, progress: Reporter | None = None,
    **options: Any,
) -> Analysis:
    """:func:`mpsearch.analyze` of ``prepared`` on ``data`` (the validation split by default),
    its first ``samples`` samples; with ``run_dir``, measurements are cached there and the
    analysis files written. ``options`` go to :func:`mpsearch.analyze`."""
    run = None if run_dir is None else _rundir(run_dir).create()
    dataset = prepared.validation if data is None else data
    with _measuring(prepared, dataset, run, "validation", metric=metric,
                    batch_size=batch_size, threads=threads, prefix_samples=samples) as measurer:
        analysis = analyze(measurer, samples=samples, progress=progress, **options)
    if run is not None:
        _write_model_info(run, prepared)
        write_analysis(run, analysis, model_size(prepared.graph, prepared.profile, {}))
    return analysis


def analyze_run(
    spec: SearchSpec, run_dir: RunDir | str | Path, *, proxy: bool = False,
    reverse: bool | None = None, curve: bool | None = None,
    thresholds: Thresholds | None = None, progress: Reporter | None = None,
) -> Analysis:
    """``mpsearch analyze``: prepare, analyze the validation split (its first
    ``spec.evaluation.sensitivity_samples`` samples) and write the run directory."""
    run = _rundir(run_dir).create()
    prepared = prepare(spec, run, progress=progress)
    _write_inputs(run, spec, prepared, "analysis")
    evaluation = spec.evaluation
    return analyze_prepared(prepared, run, metric=spec.metric,
                            samples=evaluation.sensitivity_samples,
                            batch_size=evaluation.batch_size, threads=evaluation.threads,
                            progress=progress, formats=spec.formats, proxy=proxy,
                            reverse=reverse, curve=curve, thresholds=thresholds)


# -- search ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class SearchRun:
    """A finished search: where it was written, the study's result and the re-measured front."""

    run_dir: Path
    result: SearchResult
    front: Front
    analysis: Analysis | None
    measured: tuple[str, ...]
    recovery: RecoveryDecision | None = None  # what `recovery: auto` decided


def search_run(
    spec: SearchSpec, run_dir: RunDir | str | Path, *, resume: bool = False,
    progress: Reporter | None = None,
) -> SearchRun:
    """Prepare, analyze (when ``spec.analysis``), search and re-measure the front on held-out
    data, through one measurer per split; write the run directory."""
    spec = with_objectives(spec)
    _check_latency_objective(spec)  # before any work: an unknown cost fails every trial
    run = _rundir(run_dir).create()
    prepared = prepare(spec, run, progress=progress)
    search_data, held_data = _splits(prepared, spec)
    inputs = _search_inputs(prepared, spec, search_data)
    settings = _search_settings(spec)
    check_resume(settings, run.journal, inputs, resume)  # before the run dir is rewritten
    check_measurements(run.measurements)
    verifier = _verifier(spec, prepared, run.path, held_data)
    _write_inputs(run, spec, prepared, "search")
    _write_model_info(run, prepared)
    with _spec_measuring(prepared, spec, search_data, run, "search", prefix=True) as measurer:
        analysis = None
        if spec.analysis:  # the report's node-level views; the search reuses every row
            analysis = analyze(measurer, formats=spec.formats,
                               samples=spec.evaluation.sensitivity_samples,
                               reverse_top=REPORT_VIEW_NODES,
                               curve_max_steps=REPORT_VIEW_NODES,
                               measure_above=MEASURE_ABOVE, progress=progress)
            write_analysis(run, analysis, model_size(prepared.graph, prepared.profile, {}))
        result = run_search(measurer, prepared.summary, settings, journal=run.journal,
                            resume=resume,
                            inputs=inputs, progress=progress,
                            refusal=verifier.refusal if verifier is not None
                            and spec.verify == "toolchain" else None)
        with _spec_measuring(prepared, spec, held_data, run, "held-out") as held:
            front = held_out_front(prepared.summary, spec, result, held, measurer,
                                   progress)
        if verifier is not None:  # the front points' metric as the target computes it
            front = verifier.front(front, _evaluator(prepared, held_data, spec))
    run.write_front(front)
    run.write_trials([[r.trial, r.state, r.metric, r.size, relative_latency(r.latency, front.fp32),
                       r.source] for r in result.trials])
    return SearchRun(run_dir=run.path, result=result, front=front, analysis=analysis,
                     measured=tuple(measurer.measured), recovery=prepared.recovery)


def with_objectives(spec: SearchSpec) -> SearchSpec:
    """``spec`` with its objectives decided: as written, else metric and size, and latency
    where this host times the profile's target (:func:`measures_latency`): a person deploys
    on the machine that measured the front, and the time it takes is part of the answer."""
    if spec.objectives:
        return spec
    timed = measures_latency(load_profile(spec.profile))
    return replace(spec, objectives=("metric", "size", "latency") if timed else
                   ("metric", "size"))


def _verifier(spec: SearchSpec, prepared: Prepared, run_dir: Path, data: Dataset
              ) -> TargetVerifier | None:
    """The profile's toolchain for ``verify: toolchain`` or ``front`` (None otherwise); its
    work files go to the run directory's ``targets/``."""
    if spec.verify == "none":
        return None
    try:
        return TargetVerifier(prepared.quantizer(), run_dir / "targets",
                              next(iter(data.batches(1))))
    except TargetError as e:
        raise SpecError(f"{spec.path or 'search spec'}: verify: {spec.verify}: {e}") from e


def check_profile_claims(
    profile: str | os.PathLike[str], *, ops: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[HardwareProfile, str, tuple[ProbeResult, ...]]:
    """``mpsearch profiles check``: the profile, its toolchain's version and one probe per
    (op, format) (:func:`mpsearch.targets._probes.check_profile`)."""
    hw = load_profile(profile)
    tool = target_for(hw)
    results = check_profile(hw, tool, ops=ops, progress=progress)
    return hw, toolchain_version(tool), results


def _check_latency_objective(spec: SearchSpec) -> None:
    """SpecError when ``latency`` is an objective but the profile can neither have it timed
    here nor estimate it (a cost is unknown): every quantized trial would fail, leaving an
    FP32-only front."""
    if "latency" not in spec.objectives:
        return
    profile = load_profile(spec.profile)
    if measures_latency(profile):
        return
    try:  # the op types only; a model that cannot load is reported by prepare
        op_types = {n.op_type for n in onnx.load(spec.model, load_external_data=False).graph.node}
    except Exception:
        op_types = set()
    why = latency_unknown_reason(profile, op_types)
    if why is not None:
        raise SpecError(f"{spec.path or 'search spec'}: objective 'latency': {why}")


#: Spec settings left out of the spec's fingerprint: more trials, more time, another worker,
#: storage or sampler resume the same study; the model, data and profile count by content.
#: Named flat, as :data:`_FLAT_NAMES` spells a section's settings.
_NOT_HASHED = frozenset({"trials", "timeout_s", "storage", "study", "path", "seed", "sampler",
                         "explore", "analysis", "model", "data", "profile", "name",
                         "heartbeat_s"})
#: A section's settings in the fingerprint under the names they had in the flat spec (the rest
#: under their own): a study started before the spec was nested still resumes.
_FLAT_NAMES = {"data.source": "data", "data.calibration": "calibration_samples",
               "data.seed": "data_seed", "constraints.memory_budget": "use_memory_budget",
               "evaluation.sensitivity_samples": "sensitivity_limit"}


def _spec_fingerprint(spec: SearchSpec) -> str:
    """The digest of the settings a study's results depend on (all but :data:`_NOT_HASHED`)."""
    flat: dict[str, Any] = {}
    for key, value in spec.to_dict().items():
        if isinstance(value, dict):  # a section
            section: dict[str, Any] = value
            flat.update({_FLAT_NAMES.get(f"{key}.{name}", name): setting
                         for name, setting in section.items()})
        else:
            flat[key] = value
    return _digest({k: v for k, v in flat.items() if k not in _NOT_HASHED})


def _search_inputs(prepared: Prepared, spec: SearchSpec, data: Dataset) -> dict[str, str]:
    """What a study's results depend on, fingerprinted: resuming with other inputs is refused."""
    return {"model": prepared.graph.fingerprint, "data": data.fingerprint,
            "profile": _digest(prepared.profile.to_dict()), "spec": _spec_fingerprint(spec)}


def _search_settings(spec: SearchSpec) -> SearchSettings:
    """What the search needs of ``spec`` (the search never sees the spec itself)."""
    constraints, budget, evaluation = spec.constraints, spec.budget, spec.evaluation
    return SearchSettings(
        objectives=spec.objectives, trials=budget.trials, timeout_s=budget.timeout_s,
        patience=budget.patience, sampler=spec.sampler, seed=spec.seed, storage=spec.storage,
        study=spec.study, heartbeat_s=spec.heartbeat_s, formats=spec.formats,
        min_metric=constraints.min_metric, max_metric_drop=constraints.max_metric_drop,
        max_size_bytes=constraints.max_size_bytes,
        use_memory_budget=constraints.memory_budget,
        sensitivity_limit=evaluation.sensitivity_samples, chunks=evaluation.chunks,
        search_score=evaluation.search_score, seeding=spec.seeding, explore=spec.explore)


def _evaluator(prepared: Prepared, data: Dataset, spec: SearchSpec) -> Evaluator:
    """An evaluator of ``prepared``'s model on ``data`` with the spec's metric and settings."""
    return Evaluator(prepared.graph, data, metric=spec.metric,
                     batch_size=spec.evaluation.batch_size, threads=spec.evaluation.threads)


# -- export and quantize ---------------------------------------------------------------------
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
    model = prepared.quantizer().build(assignment)
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
        verifier = TargetVerifier(prepared.quantizer(), built.path.parent,
                                  next(iter(held.batches(1))))
    except TargetError as e:
        raise SearchError(f"export --target: {e}") from e
    folder = built.path.parent / f"{built.path.stem}_{verifier.tool.name}"
    model, compiled = verifier.compile(built.assignment, folder=folder)
    evaluator = _evaluator(prepared, held, spec)
    metrics = evaluator.metrics(verifier.outputs(compiled, model, evaluator))
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
    model = prepared.quantizer().build(make_assignment(graph, profile, smallest))
    create_session(model, threads=spec.evaluation.threads)
    return DryRun(dimensions=len(groups), seeds=len(seeds),
                  fp32_size=model_size(graph, profile, {}),
                  smallest_size=model_size(graph, profile, smallest))
