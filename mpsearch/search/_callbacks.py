"""The callbacks Optuna runs after each trial: explore around the front, the patience stop and
progress reports, with the study queries they share (finished trials, the Pareto-optimal ones).

Each callback takes what it reads as explicit arguments, so it can run against any study.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import optuna

from mpsearch.pareto import Point, dominated_flags, matched
from mpsearch.progress import Progress, Reporter
from mpsearch.search._score import FRONT_MARGIN_LATENCY, FRONT_MARGIN_RELATIVE
from mpsearch.search._seeds import Group, front_step
from mpsearch.search._settings import SearchSettings

__all__ = ["FINISHED", "FRONT_CHANGED", "Callback", "best_trials", "explore_callback",
           "finished", "patience_callback", "progress_callback", "unmoved_trials"]

Callback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]

#: Trial states that count against the trial budget.
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
#: Study attribute of the patience stop: the number of the trial that last moved the front.
FRONT_CHANGED = "front_changed"


def explore_callback(settings: SearchSettings, groups: Sequence[Group],
                     noise: Mapping[tuple[str, str], float],
                     evaluated: Callable[[Mapping[str, int]], bool]) -> Callback:
    """After a trial, with probability ``settings.explore``, queue an unseen neighbour of a random
    front point, guided by the sensitivities ``noise``: every cheap group a format down
    (:func:`compress`) with a probability that grows from 0 at the front's smallest point to 1
    at its largest, else one group a format up or down (:func:`neighbor`); ``evaluated`` says
    whether a choice of format levels was already measured. A local search around the front
    that the sampler alone reaches slowly: large points shed the promotions they do not need,
    small ones take single steps."""
    rng = np.random.default_rng(settings.seed)

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        front = best_trials(study)
        if waiting or not front or rng.random() >= settings.explore:
            return
        points = [(t.values[1], {g.name: int(t.params[g.name]) for g in groups}) for t in front]
        moved = front_step(points, groups, noise, rng, lambda levels: not evaluated(levels))
        if moved is not None:
            study.enqueue_trial(moved, user_attrs={"source": "front neighbour"})

    return callback


def patience_callback(patience: int, margin: float, score_higher: bool) -> Callback:
    """Stop the search once ``patience`` finished trials in a row, counted from the last seed,
    found nothing an earlier trial did not already match within ``margin`` on the objective
    value, :data:`FRONT_MARGIN_RELATIVE` on size and :data:`FRONT_MARGIN_LATENCY` on latency:
    the front stopped moving.
    Kept in the study's attributes, so a resumed search counts on where it stopped."""
    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        earlier = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        others = [_point(other) for other in earlier if other.number != trial.number]
        if trial.state == optuna.trial.TrialState.COMPLETE and not matched(
                _point(trial), others, higher_is_better=score_higher, metric_margin=margin,
                relative=FRONT_MARGIN_RELATIVE, latency_relative=FRONT_MARGIN_LATENCY):
            study.set_user_attr(FRONT_CHANGED, trial.number)
        elif unmoved_trials(study) >= patience:
            study.stop()

    return callback


def progress_callback(total: int, report: Reporter, *, higher: bool,
                      evaluations: Callable[[], int]) -> Callback:
    """Report the trials finished (of ``total``), the front's size and best metric (``higher``
    is better or not) and the ``evaluations`` made so far."""
    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        best = [float(t.user_attrs.get("metric", t.values[0])) for t in best_trials(study)]
        info: dict[str, float | int] = {"front": len(best), "evals": evaluations()}
        if best:
            info["best"] = max(best) if higher else min(best)
        report(Progress(stage="search", done=min(finished(study), total), total=total,
                        unit="trial", info=info))

    return callback


def unmoved_trials(study: optuna.Study) -> int:
    """Finished trials after the last seed and the last trial that moved the front."""
    trials = study.get_trials(deepcopy=False)
    since = max([int(study.user_attrs.get(FRONT_CHANGED, -1)),
                 *(t.number for t in trials if t.user_attrs.get("seed"))])
    return sum(1 for t in trials if t.state in FINISHED and t.number > since)


def best_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The study's Pareto-optimal complete trials (objective value, size[, latency]) by
    :mod:`mpsearch.pareto`'s rule, the final front's: :attr:`optuna.Study.best_trials` without
    its deep copy of every trial (which cost more than the sampler itself after each trial)."""
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    flags = dominated_flags(
        [_point(t) for t in trials],
        higher_is_better=study.directions[0] == optuna.study.StudyDirection.MAXIMIZE)
    return [t for t, dominated in zip(trials, flags, strict=True) if not dominated]


def finished(study: optuna.Study) -> int:
    """How many of the study's trials finished (complete or pruned)."""
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def _point(trial: optuna.trial.FrozenTrial) -> Point:
    """(objective value, size, latency or None) of a complete trial."""
    values = trial.values
    latency = values[2] if len(values) > 2 and values[2] == values[2] else None
    return (values[0], values[1], latency)
