"""The per-projection bit allocation of a language model: KL on the search windows vs size.

Consumes a :class:`~mpsearch.llm.Scorer`, a :class:`~mpsearch.llm._choices.WeightBank`, a menu
(weight key -> candidate choices, smallest first) and its :class:`Sensitivity`; produces the
:class:`~mpsearch.search.LLMSearch` of :func:`mpsearch.search.search_choices` over one
dimension per weight. Seeds, run first: every menu level uniformly, then the solutions of the
additive sensitivity model (least summed one-weight KL, :func:`mpsearch.search.knapsack`) at
each bits-per-weight budget. Baselines scored by the caller join as fixed points.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from mpsearch.llm._choices import Choice, WeightBank
from mpsearch.llm._metrics import Scorer
from mpsearch.llm._sensitivity import Menu, Sensitivity
from mpsearch.search import Group, Seed, knapsack
from mpsearch.search._llm import LLMPoint, LLMSearch, search_choices

__all__ = ["BUDGETS", "LLMPoint", "LLMSearch", "allocate", "search_bits", "to_assignment"]

#: bits-per-weight budgets of the knapsack seeds
BUDGETS = (2.75, 3.0, 3.25, 3.5, 3.75, 4.0, 4.25, 4.5, 5.0)


def _groups(menu: Menu) -> tuple[Group, ...]:
    return tuple(Group(name=key, nodes=(key,), formats=tuple(c.label for c in choices))
                 for key, choices in menu.items())


def _lookup(menu: Menu) -> dict[str, dict[str, Choice]]:
    return {key: {c.label: c for c in choices} for key, choices in menu.items()}


def to_assignment(menu: Menu, labels: Mapping[str, str]) -> dict[str, Choice]:
    """A searched point's ``{key: choice label}`` as an assignment."""
    lookup = _lookup(menu)
    return {key: lookup[key][label] for key, label in labels.items()}


def allocate(bank: WeightBank, menu: Menu, sensitivity: Sensitivity, bpw: float
             ) -> dict[str, Choice] | None:
    """The least summed one-weight KL within ``bpw`` bits per weight (None when even the
    smallest choices do not fit)."""
    groups = _groups(menu)
    lookup = _lookup(menu)
    sizes = {(g.name, f): float(bank.weight_bytes(g.name, lookup[g.name][f]))
             for g in groups for f in g.formats}
    lowest = sum(sizes[(g.name, g.formats[0])] for g in groups)
    extra = {(g.name, f): sizes[(g.name, f)] - sizes[(g.name, g.formats[0])]
             for g in groups for f in g.formats}
    cost = {(g.name, f): sensitivity.cost(g.name, lookup[g.name][f])
            for g in groups for f in g.formats}
    capacity = bpw * bank.params(menu) / 8.0 - lowest
    picked = knapsack(groups, cost, extra, capacity, bins=2000)
    return None if picked is None else to_assignment(menu, picked)


def search_bits(scorer: Scorer, bank: WeightBank, menu: Menu, sensitivity: Sensitivity,
                windows: np.ndarray, *, budgets: Sequence[float] = BUDGETS, trials: int = 20,
                seed: int = 0, fixed: Sequence[tuple[str, float, float]] = (),
                max_bpw: float | None = None,
                progress: Callable[[int, int], None] | None = None) -> LLMSearch:
    """Search per-weight choices of ``menu`` by KL on ``windows`` against bytes; ``fixed``:
    (label, KL on the same windows, bytes) of baselines; ``max_bpw`` bounds every trial."""
    groups = _groups(menu)
    lookup = _lookup(menu)
    seeds = []
    for level in range(max(len(g.formats) for g in groups)):
        seeds.append(Seed(source=f"uniform level {level}", formats={
            g.name: g.formats[min(level, len(g.formats) - 1)] for g in groups}))
    for bpw in budgets:
        picked = allocate(bank, menu, sensitivity, bpw)
        if picked is not None:
            seeds.append(Seed(source=f"knapsack {bpw:g} bpw",
                              formats={k: c.label for k, c in picked.items()}))
    unique = {tuple(sorted(s.formats.items())): s for s in reversed(seeds)}
    seeds = sorted(unique.values(), key=seeds.index)
    cost = {(g.name, f): sensitivity.cost(g.name, lookup[g.name][f])
            for g in groups for f in g.formats}
    sizes = {(g.name, f): float(bank.weight_bytes(g.name, lookup[g.name][f]))
             for g in groups for f in g.formats}

    def size(labels: Mapping[str, str]) -> float:
        return sum(sizes[(key, label)] for key, label in labels.items())

    def evaluate(labels: Mapping[str, str]) -> float:
        return scorer.score(bank.feeds(to_assignment(menu, labels)), windows).kl.mean

    max_size = None if max_bpw is None else max_bpw * bank.params(menu) / 8.0
    return search_choices(groups, evaluate, size, seeds=seeds, cost=cost, trials=trials,
                          seed=seed, fixed=fixed, max_size=max_size, progress=progress)
