"""Optuna multi-objective precision search: the study, its objective and its result.

Consumes the run's :class:`~mpsearch.analysis.Measurer` (graph, profile, calibration table and
the search split, with the measurements the analysis already made), the model summary and a
:class:`~mpsearch.search.SearchSettings`; produces the Pareto front of per-node format assignments
(metric up, size down, optionally latency down: timed in ONNX Runtime where this host runs the
profile's target, else estimated) on the search split.

* Space: one ordered integer dimension per group of nodes (a weighted node and the weightless
  nodes that follow it, which runtimes fuse), values = the formats the profile allows, by rank.
* Seeds, enqueued before the sampler: uniform formats, the greedy "promote the k most sensitive
  groups" path and knapsack solutions of the additive sensitivity model for several size budgets.
* Objective (``SearchSettings.search_score``, :mod:`._score`): the model output's SQNR
  against FP32 for ``agreement``, else the metric with an SQNR tie-break. The metric is
  measured either way: it decides feasibility, and records and the front report it.
* Constraints: size limits are repaired before evaluation; duplicates are served from a cache;
  the metric is raced (:mod:`._race`) and a trial that cannot reach the front is pruned at the
  first stage that shows it.
* Budget: ``trials``, ``timeout_s`` and the patience stop (``patience``) of the settings: the
  search ends once that many trials in a row after the seeds found nothing an earlier trial
  did not match within a margin (:func:`._callbacks.patience_callback`); the result says so.
* Storage (:mod:`._storage`): a journal file in the run directory by default (resumable), or
  any RDB URL so several workers share one study.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import optuna

from mpsearch.analysis import Measurement, Measurer
from mpsearch.assignment import Assignment, estimate_latency, make_assignment, model_size
from mpsearch.errors import SearchError
from mpsearch.evaluate import metric_floor
from mpsearch.pareto import dominated_flags, thin
from mpsearch.profiles import measures_latency
from mpsearch.progress import Reporter
from mpsearch.search._callbacks import (
    FINISHED,
    Callback,
    explore_callback,
    finished,
    patience_callback,
    progress_callback,
    unmoved_trials,
)
from mpsearch.search._cancel import cancelled_reason, clear_cancel, watch_cancel
from mpsearch.search._race import hopeless, race_stages
from mpsearch.search._score import front_margin, score
from mpsearch.search._seeds import Group, Seed, group_costs, group_nodes, seed_assignments
from mpsearch.search._settings import SearchSettings
from mpsearch.search._storage import open_study, settle_dead_trials
from mpsearch.summary import ModelSummary

__all__ = ["SearchResult", "TrialRecord", "run_search"]

logger = logging.getLogger(__name__)


_WORKER = f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialRecord:
    """One evaluated configuration."""

    trial: int
    state: str
    metric: float | None
    size: int
    #: The value the sampler optimized (the metric with :func:`._score.score`'s tie-break).
    score: float | None = None
    latency: float | None
    source: str
    assignment: Mapping[str, str] = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    trials: tuple[TrialRecord, ...]
    front: tuple[TrialRecord, ...]
    evaluations: int
    seconds: float
    timing: Mapping[str, float]
    #: Why the search ended before its trial budget (the patience stop, or "cancelled after N
    #: trials" when finished with the trials a cancelled search ran), else None.
    stopped: str | None = None


class _Objective:
    """Turns a trial into (metric, size[, latency]) with caching, repair and early pruning:
    wires the measurer to the pure rules of :mod:`._score` and :mod:`._race`."""

    def __init__(self, measurer: Measurer, summary: ModelSummary, settings: SearchSettings,
                 groups: Sequence[Group], min_metric: float | None, max_size: int | None,
                 refusal: Callable[[Assignment], str | None] | None = None) -> None:
        self.measurer = measurer
        #: Why the target would not run an assignment wholly on its accelerator (None: it
        #: would); such a trial is infeasible (``verify: toolchain``).
        self.refusal = refusal
        self.graph = measurer.quantizer.graph
        self.profile = measurer.quantizer.profile
        self.summary = summary
        self.settings = settings
        self.groups = groups
        self.noise: Mapping[tuple[str, str], float] = {}
        self.min_metric = min_metric
        self.max_size = max_size
        self.cache: dict[str, tuple[float, ...]] = {}  # assignment key -> objective values
        self.metrics: dict[str, float] = {}  # assignment key -> the metric (no tie-break)
        self.timing = {"build": 0.0, "session": 0.0, "inference": 0.0}
        self.evaluations = 0
        self.higher = measurer.higher_is_better  # the metric's direction
        self.by_sqnr = search_by_sqnr(settings, measurer)
        self.score_higher = self.by_sqnr or self.higher  # the objective's direction
        #: Racing by SQNR, per stage (sample count): how much a completed trial's score rose
        #: from that stage to its final one (:func:`._race.sqnr_slack`).
        self.gains: dict[int, list[float]] = {}

    def measure_costs(self, progress: Reporter | None) -> dict[tuple[str, str], float]:
        """The additive sensitivity model that seeds the search (see :func:`group_costs`)."""
        return group_costs(self.graph, self.profile, self.groups, self._group_cost, progress)

    def _group_cost(self, group: Group, fmt: str) -> float:
        """``group`` alone at ``fmt``, the rest float, on the sensitivity samples: relative
        output noise power plus the metric drop. A one-node group is the analysis's row."""
        samples = self.settings.sensitivity_limit
        before = self.measurer.evaluations
        result = self.measurer.measure(dict.fromkeys(group.nodes, fmt), samples=samples)
        self.evaluations += self.measurer.evaluations - before
        return result.cost(self.measurer.fp32(samples).value, self.higher)

    def assignment(self, choice: Mapping[str, int]) -> dict[str, str]:
        formats: dict[str, str] = {}
        for group in self.groups:
            fmt = group.formats[choice[group.name]]
            formats.update(dict.fromkeys(group.nodes, fmt))
        return formats

    def repair(self, formats: dict[str, str]) -> dict[str, str] | None:
        """Lower the least sensitive groups until the size limit holds (None if impossible)."""
        if self.max_size is None:
            return formats
        graph, profile = self.graph, self.profile
        order = sorted(self.groups, key=lambda g: self.noise.get((g.name, g.formats[0]), 0.0))
        for group in order:
            if model_size(graph, profile, formats) <= self.max_size:
                return formats
            formats.update(dict.fromkeys(group.nodes, group.formats[0]))
        return formats if model_size(graph, profile, formats) <= self.max_size else None

    def evaluated(self, choice: Mapping[str, int]) -> bool:
        """Whether the configuration ``choice`` (format levels by group, before repair) was
        already evaluated."""
        formats = self.assignment(choice)
        return make_assignment(self.graph, self.profile, formats).key() in self.cache

    def values(self, metric: float, assignment: Assignment) -> tuple[float, ...]:
        """(metric, size[, latency]): latency timed in ONNX Runtime where this host runs the
        profile's target (batch 1, median seconds), else the profile's estimate."""
        out = [metric, float(model_size(self.graph, self.profile, assignment))]
        if "latency" in self.settings.objectives:
            latency = (self.measurer.latency(assignment) if measures_latency(self.profile)
                       else estimate_latency(self.graph, self.summary, self.profile, assignment))
            out.append(float("nan") if latency is None else latency)
        return tuple(out)

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        choice = {g.name: trial.suggest_int(g.name, 0, len(g.formats) - 1) for g in self.groups}
        trial.set_user_attr("worker", _WORKER)
        formats = self.repair(self.assignment(choice))
        if formats is None:
            trial.set_user_attr("rejected", "size limit cannot be met")
            raise optuna.TrialPruned("size limit cannot be met")
        assignment = make_assignment(self.graph, self.profile, formats)
        key = assignment.key()
        trial.set_user_attr("assignment", assignment.to_dict())
        why = None if self.refusal is None else self.refusal(assignment)
        if why is not None:
            trial.set_user_attr("rejected", why)
            raise optuna.TrialPruned(why)
        if key in self.cache:
            trial.set_user_attr("cached", True)
            trial.set_user_attr("metric", self.metrics[key])
            return self.cache[key]
        result = self._measure(trial, assignment)
        values = self.values(self._score(result), assignment)
        self.cache[key], self.metrics[key] = values, result.value
        trial.set_user_attr("metric", result.value)
        return values

    def _score(self, result: Measurement) -> float:
        return score(result, higher=self.higher, by_sqnr=self.by_sqnr)

    def _measure(self, trial: optuna.Trial, assignment: Assignment) -> Measurement:
        """The metric on the search split, raced: measured on a first chunk, then on twice as
        many samples, and so on up to all of them, continuing where the last stage stopped;
        a trial that is clearly dominated after any stage is pruned there."""
        total = len(self.measurer.data)
        before = self.measurer.evaluations
        for samples in race_stages(total, self.settings.chunks):
            result = self.measurer.measure(assignment, samples=samples)
            if result.samples < total and self._hopeless(result, assignment):
                self._account(result, before)
                trial.set_user_attr("pruned_after", result.samples)
                raise optuna.TrialPruned(f"metric {result.value:.4f} on {result.samples} "
                                         "samples cannot reach the front")
        self._account(result, before)
        self.record_gains(assignment, result)
        trial.set_user_attr("metrics", dict(result.metrics))
        return result

    def record_gains(self, assignment: Mapping[str, str], result: Measurement) -> None:
        """Remember how the score of a completed ``assignment`` (``result``: on all samples)
        moved from each race stage (those its measurer holds): the SQNR race's calibration."""
        if not self.by_sqnr:
            return
        final = self._score(result)
        for samples in race_stages(len(self.measurer.data), self.settings.chunks)[:-1]:
            stage = self.measurer.cached(assignment, samples=samples)
            if stage is not None:
                self.gains.setdefault(samples, []).append(final - self._score(stage))

    def _account(self, result: Measurement, before: int) -> None:
        if self.measurer.evaluations == before:
            return  # served from the measurer's cache
        self.evaluations += 1
        self.timing["build"] += result.build_s
        self.timing["session"] += result.session_s
        self.timing["inference"] += result.eval_s

    def _hopeless(self, partial: Measurement, assignment: Assignment) -> bool:
        """Whether the partly measured ``assignment`` cannot reach the front
        (:func:`._race.hopeless`, against every trial evaluated so far)."""
        others = ((values[0], values[1], self.metrics[key]) for key, values in self.cache.items())
        return hopeless(partial, size=model_size(self.graph, self.profile, assignment),
                        higher=self.higher, by_sqnr=self.by_sqnr, min_metric=self.min_metric,
                        gains=self.gains, finished=others)


#: The most front points handed on (each is re-measured on held-out data and timed): a front
#: searched by a continuous score can hold dozens of near neighbours.
FRONT_POINTS = 12


def thin_front(front: Sequence[TrialRecord], limit: int) -> tuple[TrialRecord, ...]:
    """At most ``limit`` (>= 2) of ``front`` (sorted by size), spread along it
    (:func:`mpsearch.pareto.thin`)."""
    chosen = thin([r.size for r in front], [r.metric or 0.0 for r in front], limit)
    return tuple(front[i] for i in chosen)


def search_by_sqnr(settings: SearchSettings, measurer: Measurer) -> bool:
    """Whether the search optimizes the output SQNR (spec ``evaluation.search_score``)."""
    if settings.search_score == "auto":
        return measurer.fp32().primary == "agreement"
    return settings.search_score == "sqnr"


def _enqueue(study: optuna.Study, seeds: Sequence[Seed], groups: Sequence[Group]) -> None:
    if study.user_attrs.get("seeded"):
        return
    for seed in seeds:
        params = {g.name: g.formats.index(seed.formats[g.name]) for g in groups}
        study.enqueue_trial(params, user_attrs={"source": seed.source, "seed": True},
                            skip_if_exists=True)
    study.set_user_attr("seeded", True)


def _costs(study: optuna.Study, objective: _Objective, progress: Reporter | None
           ) -> dict[tuple[str, str], float]:
    """Group costs stored with the study, so a resumed search or a second worker reuses them."""
    stored = study.user_attrs.get("group_costs")
    if stored is not None:
        return {(g, f): float(c) for g, f, c in stored}
    costs = objective.measure_costs(progress)
    study.set_user_attr("group_costs", [[g, f, c] for (g, f), c in sorted(costs.items())])
    return costs


def run_search(
    measurer: Measurer, summary: ModelSummary, settings: SearchSettings, *, journal: Path,
    resume: bool = False, inputs: Mapping[str, str] | None = None,
    progress: Reporter | None = None,
    refusal: Callable[[Assignment], str | None] | None = None,
) -> SearchResult:
    """Run (or resume) the search until the study holds ``settings.trials`` finished trials,
    in the run directory's ``journal`` unless ``settings.storage`` names another storage;
    ``refusal``: why the target would not take an assignment (None: it would), making that
    trial infeasible."""
    graph, profile = measurer.quantizer.graph, measurer.quantizer.profile
    groups = group_nodes(graph, profile, settings.formats)
    if not groups:
        raise SearchError(f"{graph.name}: no node can take a quantized format under profile "
                          f"'{profile.name}'; nothing to search")
    higher = measurer.higher_is_better
    min_metric = metric_floor(measurer.fp32().value, higher, min_metric=settings.min_metric,
                              max_metric_drop=settings.max_metric_drop)
    max_size = profile.size_limit(settings.max_size_bytes, settings.use_memory_budget)
    objective = _Objective(measurer, summary, settings, groups, min_metric, max_size, refusal)
    directions = ["maximize" if objective.score_higher else "minimize", "minimize"]
    if "latency" in settings.objectives:
        directions.append("minimize")
    study = open_study(settings, journal, directions=directions, resume=resume, inputs=inputs)
    _restore_cache(study, objective)
    if settings.seeding:
        objective.noise = _costs(study, objective, progress)
        _enqueue(study, seed_assignments(graph, profile, groups, objective.noise), groups)
    start = time.perf_counter()
    done = finished(study)
    remaining = max(settings.trials - done, 0)
    if settings.patience is not None and unmoved_trials(study) >= settings.patience:
        remaining = 0  # a resumed search that had already stopped
    if remaining:
        callbacks: list[Callback] = [
            optuna.study.MaxTrialsCallback(settings.trials, states=FINISHED)]  # shared storages
        if settings.explore > 0:
            callbacks.append(explore_callback(settings, objective.groups, objective.noise,
                                              objective.evaluated))
        if settings.patience is not None:
            margin = front_margin(by_sqnr=objective.by_sqnr, primary=measurer.fp32().primary,
                                  samples=measurer.count(None))
            callbacks.append(patience_callback(settings.patience, margin,
                                               objective.score_higher))
        if progress is not None:
            callbacks.append(progress_callback(settings.trials, progress, higher=objective.higher,
                                               evaluations=lambda: objective.evaluations))
        clear_cancel(study)
        with watch_cancel(study, objective) as watched:
            study.optimize(watched, n_trials=remaining, timeout=settings.timeout_s,
                           gc_after_trial=False, callbacks=callbacks, catch=())
        retries = settle_dead_trials(study)  # a dead worker's trial, failed and queued again
        if retries:
            study.optimize(objective, n_trials=retries, gc_after_trial=False, catch=())
    records = _records(study)
    stopped = None
    unmoved = unmoved_trials(study)
    patience = settings.patience
    if patience is not None and finished(study) < settings.trials and unmoved >= patience:
        stopped = (f"the front did not change in the last {unmoved} trials: stopped after "
                   f"{finished(study)} trials (budget.patience {patience}; set 0 to run every "
                   "trial)")
        logger.info("search: %s", stopped)
    stopped = stopped or cancelled_reason(study)
    front = _front(records, min_metric, higher, objective.score_higher)
    if len(front) > FRONT_POINTS:
        logger.info("search front: %d points; re-measuring %d spread along it", len(front),
                    FRONT_POINTS)
        front = thin_front(front, FRONT_POINTS)
    return SearchResult(trials=records, front=front, evaluations=objective.evaluations,
                        seconds=time.perf_counter() - start, timing=dict(objective.timing),
                        stopped=stopped)


def _restore_cache(study: optuna.Study, objective: _Objective) -> None:
    """Resume: completed trials' values by assignment, so nothing is evaluated twice."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        formats = trial.user_attrs.get("assignment")
        if formats:
            key = make_assignment(objective.graph, objective.profile, formats).key()
            objective.cache[key] = tuple(trial.values)
            objective.metrics[key] = float(trial.user_attrs.get("metric", trial.values[0]))
            result = objective.measurer.cached(formats)
            if result is not None:  # its stages, from the measurement cache
                objective.record_gains(formats, result)


def _records(study: optuna.Study) -> tuple[TrialRecord, ...]:
    records = []
    for trial in study.get_trials(deepcopy=False):
        if not trial.state.is_finished():  # seeds still queued, or a worker's running trial
            continue
        values = trial.values if trial.state == optuna.trial.TrialState.COMPLETE else None
        formats = trial.user_attrs.get("assignment", {})
        latency = values[2] if values is not None and len(values) > 2 else None
        records.append(TrialRecord(
            trial=trial.number, state=trial.state.name.lower(),
            metric=None if values is None else float(trial.user_attrs.get("metric", values[0])),
            size=int(values[1]) if values is not None else 0,
            score=None if values is None else float(values[0]),
            latency=None if latency is None or np.isnan(latency) else float(latency),
            source=str(trial.user_attrs.get("source", "sampler")),
            assignment=formats,
        ))
    return tuple(records)


def _front(records: Sequence[TrialRecord], min_metric: float | None, higher: bool,
           score_higher: bool | None = None) -> tuple[TrialRecord, ...]:
    """Feasible non-dominated records (objective value vs size vs latency, by
    :mod:`mpsearch.pareto`'s rule), one per objective vector; the metric (``higher`` is better
    or not) decides feasibility, the objective value (``score_higher``, default ``higher``)
    dominance."""
    sign = 1.0 if higher else -1.0
    score_higher = higher if score_higher is None else score_higher
    done = [r for r in records if r.metric is not None]
    if min_metric is not None:
        done = [r for r in done if sign * (r.metric or 0.0) >= sign * min_metric]

    def value(record: TrialRecord) -> float:
        return record.score if record.score is not None else (record.metric or 0.0)

    unique: dict[tuple[float, int, float | None], TrialRecord] = {}
    for record in done:  # one point per objective vector (the first trial that reached it)
        unique.setdefault((value(record), record.size, record.latency), record)
    kept = list(unique.values())
    flags = dominated_flags([(value(r), float(r.size), r.latency) for r in kept],
                            higher_is_better=score_higher)
    front = [r for r, dominated in zip(kept, flags, strict=True) if not dominated]
    return tuple(sorted(front, key=lambda r: (r.size, -sign * (r.metric or 0.0))))
