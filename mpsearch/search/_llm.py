"""An Optuna study over a callable score: per-weight choices of a language model against size.

Consumes dimensions (:class:`~mpsearch.search.Group`: a name and its choices, smallest first),
a score ``evaluate(choices) -> objective`` (lower is better: the KL on the search windows) and
``size(choices) -> bytes``, seed configurations and an additive cost model ``(dimension,
choice) -> cost`` (the one-weight sensitivities); produces every evaluated point and the Pareto
front of (objective, size). Knows nothing of language models: :mod:`mpsearch.llm._search`
builds the dimensions, seeds and score.

* Seeds are enqueued first, in order; ``fixed`` points (baselines scored by the caller) enter
  the study as finished trials, so they are candidates on the front itself.
* After each trial, with probability ``explore``, an unseen neighbour of a random front point
  is queued (:func:`~mpsearch.search.neighbor`, :func:`~mpsearch.search.compress`, guided by
  the costs); otherwise the sampler (TPE) proposes the next point.
* ``max_size`` repairs a proposal above it by lowering, one step at a time, the dimension whose
  step saves bytes at the least added cost. Repeated configurations are served from a cache.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import optuna

from mpsearch.pareto import dominated_flags
from mpsearch.search._seeds import Group, Seed, front_step
from mpsearch.search._storage import make_sampler

__all__ = ["LLMPoint", "LLMSearch", "search_choices"]

logger = logging.getLogger(__name__)

Choices = Mapping[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMPoint:
    """One evaluated configuration: ``choices`` (dimension -> choice; empty for a fixed
    point), its objective and size, and where it came from."""

    number: int
    source: str
    objective: float
    size: float
    choices: Mapping[str, str] = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMSearch:
    points: tuple[LLMPoint, ...]
    front: tuple[LLMPoint, ...]
    evaluations: int
    seconds: float


class _Objective:
    def __init__(self, groups: Sequence[Group], evaluate: Callable[[Choices], float],
                 size: Callable[[Choices], float], cost: Mapping[tuple[str, str], float],
                 max_size: float | None) -> None:
        self.groups, self.evaluate, self.size = groups, evaluate, size
        self.cost, self.max_size = cost, max_size
        self.cache: dict[tuple[int, ...], float] = {}
        self.evaluations = 0

    def levels(self, trial: optuna.Trial) -> dict[str, int]:
        return {g.name: trial.suggest_int(g.name, 0, len(g.formats) - 1) for g in self.groups}

    def choices(self, levels: Mapping[str, int]) -> dict[str, str]:
        return {g.name: g.formats[levels[g.name]] for g in self.groups}

    def repair(self, levels: dict[str, int]) -> dict[str, int]:
        """Lower the cheapest step at a time until the size fits (or nothing is left)."""
        if self.max_size is None:
            return levels
        while self.size(self.choices(levels)) > self.max_size:
            best, best_rate = None, np.inf
            for g in self.groups:
                at = levels[g.name]
                if at == 0:
                    continue
                saved = (self.size({g.name: g.formats[at]})
                         - self.size({g.name: g.formats[at - 1]}))
                added = (self.cost.get((g.name, g.formats[at - 1]), 0.0)
                         - self.cost.get((g.name, g.formats[at]), 0.0))
                rate = max(added, 0.0) / max(saved, 1e-9)
                if rate < best_rate:
                    best, best_rate = g.name, rate
            if best is None:
                break
            levels[best] -= 1
        return levels

    def __call__(self, trial: optuna.Trial) -> tuple[float, float]:
        levels = self.repair(self.levels(trial))
        choices = self.choices(levels)
        key = tuple(levels[g.name] for g in self.groups)
        trial.set_user_attr("levels", list(key))
        if key not in self.cache:
            self.cache[key] = float(self.evaluate(choices))
            self.evaluations += 1
        return self.cache[key], float(self.size(choices))


def _front(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    flags = dominated_flags([(t.values[0], t.values[1], None) for t in done],
                            higher_is_better=False)
    return [t for t, dominated in zip(done, flags, strict=True) if not dominated]


def _explorer(groups: Sequence[Group], cost: Mapping[tuple[str, str], float], explore: float,
              seed: int, seen: Callable[[tuple[int, ...]], bool]
              ) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """Queue an unseen neighbour of a random searched front point (see the module doc)."""
    rng = np.random.default_rng(seed)

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            return
        front = [t for t in _front(study) if "levels" in t.user_attrs]
        if not front or rng.random() >= explore:
            return
        names = [g.name for g in groups]
        points = [(t.values[1], dict(zip(names, t.user_attrs["levels"], strict=True)))
                  for t in front]
        moved = front_step(points, groups, cost, rng,
                           lambda levels: not seen(tuple(levels[n] for n in names)),
                           compress_weight=0.5)
        if moved is not None:
            study.enqueue_trial(moved, user_attrs={"source": "front neighbour"})

    return callback


def search_choices(
    groups: Sequence[Group], evaluate: Callable[[Choices], float],
    size: Callable[[Choices], float], *, seeds: Sequence[Seed] = (),
    cost: Mapping[tuple[str, str], float] | None = None, trials: int = 20, seed: int = 0,
    fixed: Sequence[tuple[str, float, float]] = (), explore: float = 0.8,
    max_size: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> LLMSearch:
    """Run the seeds, then ``trials`` more proposals; ``size`` of a partial mapping is the
    bytes of those dimensions alone (the repair compares steps with it)."""
    start = time.perf_counter()
    cost = dict(cost or {})
    objective = _Objective(groups, evaluate, size, cost, max_size)
    study = optuna.create_study(directions=["minimize", "minimize"],
                                sampler=make_sampler("tpe", seed, trials))
    for label, value, bytes_ in fixed:
        study.add_trial(optuna.trial.create_trial(
            values=[value, bytes_], params={}, distributions={},
            user_attrs={"source": label, "fixed": True}))
    index = {g.name: {f: i for i, f in enumerate(g.formats)} for g in groups}
    for s in seeds:
        study.enqueue_trial({g.name: index[g.name][s.formats[g.name]] for g in groups},
                            user_attrs={"source": s.source})
    total = len(seeds) + trials
    callbacks = [_explorer(groups, cost, explore, seed, objective.cache.__contains__)]
    if progress is not None:
        callbacks.append(lambda study, trial: progress(trial.number + 1 - len(fixed), total))
    study.optimize(objective, n_trials=total, callbacks=callbacks)
    points = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        levels = t.user_attrs.get("levels")
        choices = ({} if levels is None else
                   {g.name: g.formats[i] for g, i in zip(groups, levels, strict=True)})
        points.append(LLMPoint(number=t.number, source=str(t.user_attrs.get("source", "sampler")),
                               objective=float(t.values[0]), size=float(t.values[1]),
                               choices=choices))
    flags = dominated_flags([(p.objective, p.size, None) for p in points], higher_is_better=False)
    front = tuple(sorted((p for p, d in zip(points, flags, strict=True) if not d),
                         key=lambda p: p.size))
    return LLMSearch(points=tuple(points), front=front, evaluations=objective.evaluations,
                     seconds=time.perf_counter() - start)
