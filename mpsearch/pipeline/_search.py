"""Search runs: the spec turned into the search's settings, the study run, the held-out front
measured and verified on the target, and the run directory written."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from mpsearch._recommend import recommend
from mpsearch._results import _limits, held_out_front, relative_latency, write_analysis
from mpsearch.analysis import Analysis, analyze
from mpsearch.assignment import latency_unknown_reason, model_size
from mpsearch.data import Dataset
from mpsearch.errors import SpecError
from mpsearch.evaluate import Evaluator
from mpsearch.pipeline._analyze import (
    REPORT_VIEW_NODES,
    _spec_measuring,
    _write_inputs,
    _write_model_info,
)
from mpsearch.pipeline._prepare import Prepared, _digest, _rundir, _splits, prepare
from mpsearch.profiles import HardwareProfile, load_profile, measures_latency, runs_fused_int8
from mpsearch.progress import Reporter
from mpsearch.recovery import RecoveryDecision
from mpsearch.rundir import Front, RunDir, check_measurements
from mpsearch.search import (
    MEASURE_ABOVE,
    SearchResult,
    SearchSettings,
    check_resume,
    check_storage,
    run_search,
)
from mpsearch.spec import SearchSpec
from mpsearch.targets import TargetError, toolchain
from mpsearch.targets._probes import ProbeResult, check_profile
from mpsearch.targets._verdict import Verified
from mpsearch.targets._verify import (
    AUTO_FLOOR,
    AUTO_SECONDS,
    TargetVerifier,
    target_for,
    toolchain_version,
)

logger = logging.getLogger(__name__)


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
    settings = _search_settings(spec)
    check_storage(settings, run.journal)  # a foreign file fails now, not after calibration
    prepared = prepare(spec, run, progress=progress)
    search_data, held_data = _splits(prepared, spec)
    prepared = prepared.without_samples()  # the splits above are all the search reads
    settings = replace(settings, sensitivity_limit=spec.evaluation.sensitivity_count(
        len(search_data)))  # `auto` is a share of the search split
    inputs = _search_inputs(prepared, spec, search_data)
    check_resume(settings, run.journal, inputs, resume)  # before the run dir is rewritten
    check_measurements(run.measurements)
    verifier = _verifier(spec, prepared, run.path, held_data)
    _write_inputs(run, spec, prepared, "search")
    _write_model_info(run, prepared)
    with _spec_measuring(prepared, spec, search_data, run, "search",
                         prefix_samples=settings.sensitivity_limit) as measurer:
        analysis = None
        if spec.analysis:  # the report's node-level views; the search reuses every row
            analysis = analyze(measurer, formats=spec.formats,
                               samples=settings.sensitivity_limit,
                               reverse_top=REPORT_VIEW_NODES,
                               curve_max_steps=REPORT_VIEW_NODES,
                               measure_above=MEASURE_ABOVE, progress=progress)
            write_analysis(run, analysis, model_size(prepared.graph, prepared.profile, {}))
        result = run_search(measurer, prepared.summary, settings, journal=run.journal,
                            resume=resume,
                            inputs=inputs, progress=progress,
                            refusal=verifier.refusal if verifier is not None
                            and spec.verify == "toolchain" else None)
        measurer.release()  # its kept tensors and last session; its results stay cached
        with _spec_measuring(prepared, spec, held_data, run, "held-out") as held:
            front = held_out_front(prepared.summary, spec, result, held, measurer,
                                   progress)
        if verifier is not None:  # the shown points as the target computes them, judged
            front = _verified_front(front, verifier, run, spec, prepared, held_data,
                                    resume=resume, progress=progress)
            chosen, line = recommend(front, _limits(spec, prepared.profile, result))
            front = replace(front, recommended=chosen, recommendation=line)
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
        return TargetVerifier(prepared.quantizer, run_dir / "targets",
                              next(iter(data.batches(1))))
    except TargetError as e:
        raise SpecError(f"{spec.path or 'search spec'}: verify: {spec.verify}: {e}") from e


def _verified_front(front: Front, verifier: TargetVerifier, run: RunDir, spec: SearchSpec,
                    prepared: Prepared, data: Dataset, *, resume: bool,
                    progress: Reporter | None) -> Front:
    """``front`` verified on the target (:meth:`TargetVerifier.front`), each configuration's
    record written to ``verify.json`` as it finishes; with ``resume``, the records already
    there for the same inputs are used instead of verifying those configurations again."""
    key = {**_search_inputs(prepared, spec, data), "toolchain": verifier.tool.name,
           "version": toolchain_version(verifier.tool),
           "samples": spec.evaluation.target_samples}
    stored = run.read_verified(key) if resume else {}
    known = {name: Verified.from_dict(record) for name, record in stored.items()}
    if known:
        logger.info("%s: %d verified configuration(s) kept from the stopped run",
                    run.verify_json, len(known))
    kept = {name: record.to_dict() for name, record in known.items()}

    def save(name: str, record: Verified) -> None:
        kept[name] = record.to_dict()
        run.write_verified(key, kept)

    limit = _target_samples(spec, verifier, front, data, known)
    subset = limit < len(data)
    if subset:
        data = data.take(limit)
    return verifier.front(front, _evaluator(prepared, data, spec), known=known, save=save,
                          progress=progress, subset=subset)


def _target_samples(spec: SearchSpec, verifier: TargetVerifier, front: Front, data: Dataset,
                    known: Mapping[str, Verified]) -> int:
    """How many of the first held-out samples the target runs for each point: the spec's
    count, or all, or with ``auto`` the count a stopped run used (its records keep it), else
    :meth:`TargetVerifier.affordable`'s."""
    setting = spec.evaluation.target_samples
    stopped = [r.samples for r in known.values() if r.samples]
    if setting != "auto":
        limit = min(setting or len(data), len(data))
        why = "evaluation.target_samples"
    elif stopped:
        limit = max(stopped)
        why = "evaluation.target_samples: auto, as the stopped run's records"
    else:
        limit, each = verifier.affordable(verifier.shown(front), data)
        why = (f"evaluation.target_samples: auto; {each:.2g} s a sample on "
               f"{verifier.tool.name}: those that fit {AUTO_SECONDS:.0f} s a point, at least "
               f"{AUTO_FLOOR}" if each is not None else "evaluation.target_samples: auto")
    if limit < len(data):
        logger.info("verify: the target runs the first %d of %d held-out samples (%s)",
                    limit, len(data), why)
    return limit


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


def toolchain_missing(name: str) -> str | None:
    """None when target toolchain ``name`` (a profile's ``toolchain.name``) is usable on this
    machine, else its adapter's one line saying what to install and how."""
    return toolchain(name).missing()


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
                         "heartbeat_s", "target_samples"})
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
    """What the search needs of ``spec`` (the search never sees the spec itself), but the
    sensitivity samples, known once the search split is."""
    constraints, budget, evaluation = spec.constraints, spec.budget, spec.evaluation
    return SearchSettings(
        objectives=spec.objectives, trials=budget.trials, timeout_s=budget.timeout_s,
        patience=budget.patience, sampler=spec.sampler, seed=spec.seed, storage=spec.storage,
        study=spec.study, heartbeat_s=spec.heartbeat_s, formats=spec.formats,
        min_metric=constraints.min_metric, max_metric_drop=constraints.max_metric_drop,
        max_size_bytes=constraints.max_size_bytes,
        use_memory_budget=constraints.memory_budget,
        chunks=evaluation.chunks,
        search_score=evaluation.search_score, seeding=spec.seeding, explore=spec.explore)


def _evaluator(prepared: Prepared, data: Dataset, spec: SearchSpec) -> Evaluator:
    """An evaluator of ``prepared``'s model on ``data`` with the spec's metric and settings."""
    return Evaluator(prepared.graph, data, metric=spec.metric,
                     batch_size=spec.evaluation.batch_size, threads=spec.evaluation.threads,
                     fused_int8=runs_fused_int8(prepared.profile))


# -- export and quantize ---------------------------------------------------------------------
