"""The search space (groups of nodes) and the seed configurations enqueued before the sampler.

Consumes the graph, the profile and an additive sensitivity model (group, format) -> cost,
which :func:`group_costs` measures through a callback; produces :class:`Group` dimensions,
:class:`Seed` assignments (every uniform format, the greedy path "promote the k most sensitive
groups" for k = 1, 2, 4, ..., and the solutions of a multiple-choice knapsack, least total
sensitivity under a size budget, for several budgets) and the moves that explore around the
front (:func:`neighbor`, :func:`compress`). Pure: no Optuna here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mpsearch.assignment import model_size, table_format
from mpsearch.graph import ModelGraph
from mpsearch.profiles import Format, HardwareProfile
from mpsearch.progress import Progress, Reporter

__all__ = ["MEASURE_ABOVE", "Group", "Seed", "compress", "front_step", "group_costs",
           "group_nodes", "knapsack", "neighbor", "seed_assignments"]

#: A group's next format up is measured only when the format below costs at least this fraction
#: of the largest lowest-format cost (see :func:`group_costs`).
MEASURE_ABOVE = 0.1

#: Significand bits of the float formats, to compare their rounding noise with integer grids.
_FLOAT_BITS = {"float16": 11, "float32": 24}


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """One search dimension: nodes that take one format together, and the formats by rank."""

    name: str
    nodes: tuple[str, ...]
    formats: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Seed:
    source: str
    formats: Mapping[str, str]  # group name -> format


def group_nodes(
    graph: ModelGraph, profile: HardwareProfile, only: Sequence[str] | None = None
) -> tuple[Group, ...]:
    """A weighted node starts a group; weightless nodes that follow it (activations, pooling,
    residual adds) join their producer's group when they allow the same formats. A weight-only
    node (an embedding table) is a group of its own: what reads its float output is not
    tied to the table's format."""
    members: dict[str, list[str]] = {}
    formats_of: dict[str, tuple[str, ...]] = {}
    group_of: dict[str, str] = {}
    for node in graph.quantizable_nodes():
        allowed = profile.formats_for_node(node)
        if only is not None:
            allowed = tuple(f for f in allowed if f in only or f == profile.default_format)
        if len(allowed) < 2:
            continue
        producer = next((p for p in map(graph.producer, node.activation_inputs)
                         if p in group_of and not graph.nodes[p].weight_only), None)
        if not node.weights and producer is not None:
            owner = group_of[producer]
            if formats_of[owner] == allowed:
                members[owner].append(node.name)
                group_of[node.name] = owner
                continue
        members[node.name] = [node.name]
        formats_of[node.name] = allowed
        group_of[node.name] = node.name
    return tuple(Group(name=n, nodes=tuple(m), formats=formats_of[n]) for n, m in members.items())


def group_costs(
    graph: ModelGraph, profile: HardwareProfile, groups: Sequence[Group],
    measure: Callable[[Group, str], float], progress: Reporter | None = None,
) -> dict[tuple[str, str], float]:
    """The additive sensitivity model (group, format) -> cost, ``measure``-ing as few as needed.

    Every group is measured at its lowest format; the highest (float) format costs 0. A format
    in between is measured only where the format below it costs at least ``MEASURE_ABOVE`` of
    the largest lowest-format cost; elsewhere its cost is the one below scaled by their ratio of
    quantization noise power (:func:`noise_ratio`): a group that barely notices INT8 barely
    notices INT16, and not measuring it leaves that evaluation to the search.
    """
    costs: dict[tuple[str, str], float] = {(g.name, g.formats[-1]): 0.0 for g in groups}
    lowest = [(g, g.formats[0]) for g in groups if len(g.formats) > 1]
    total, done = len(lowest), 0

    def measured(group: Group, fmt: str) -> None:
        nonlocal done
        costs[(group.name, fmt)] = measure(group, fmt)
        done += 1
        if progress is not None:
            progress(Progress(stage="group costs", done=done, total=total, unit="cfg"))

    for group, fmt in lowest:
        measured(group, fmt)
    floor = MEASURE_ABOVE * max((costs[(g.name, f)] for g, f in lowest), default=0.0)
    for level in range(1, max((len(g.formats) for g in groups), default=0) - 1):
        for group in (g for g in groups if level < len(g.formats) - 1):
            below, fmt = group.formats[level - 1], group.formats[level]
            cost = costs[(group.name, below)]
            if cost >= floor and cost > 0.0:
                total += 1
                measured(group, fmt)
            else:
                costs[(group.name, fmt)] = cost * noise_ratio(graph, profile, group, below, fmt)
    return costs


def noise_ratio(graph: ModelGraph, profile: HardwareProfile, group: Group, low: str,
                high: str) -> float:
    """Quantization noise power of ``high`` relative to ``low``, each the sum of ``4 ** -bits``
    over the grids a node rounds on (activations, and weights if it has any): independent
    roundings add their noise, so A16W8 over A8W8 about halves it (the weights' rounding
    stays) and A16W16 over A16W8 leaves ``2 * 4 ** -8`` of it."""
    weighted = any(graph.nodes[n].weights for n in group.nodes)
    noise = [_noise_power(profile.format(f), weighted) for f in (low, high)]
    return noise[1] / noise[0]


def _noise_power(fmt: Format, weighted: bool) -> float:
    """Relative rounding noise power of a node in ``fmt``: ``4 ** -bits`` summed over its
    activation grid and, if it has weights, its weight grid."""
    grids = (fmt.activation, fmt.weight) if weighted else (fmt.activation,)
    return float(sum(4.0 ** -_FLOAT_BITS.get(t.dtype, t.bits - t.reduce_range)
                     for t in grids))


def _expand(groups: Sequence[Group], choice: Mapping[str, str]) -> dict[str, str]:
    return {node: choice[g.name] for g in groups for node in g.nodes}


def knapsack(
    groups: Sequence[Group], cost: Mapping[tuple[str, str], float],
    extra: Mapping[tuple[str, str], float], capacity: float, bins: int = 400,
) -> dict[str, str] | None:
    """Multiple-choice knapsack: one format per group, least total ``cost`` with the total
    ``extra`` bytes (over every group at its lowest format) <= ``capacity``; sizes are
    discretized into ``bins``. None when nothing fits."""
    if capacity < 0:
        return None
    step = max(capacity / bins, 1e-9)
    best = np.full(bins + 1, np.inf)
    best[0] = 0.0
    picks: list[np.ndarray] = []
    for group in groups:
        new = np.full(bins + 1, np.inf)
        pick = np.full(bins + 1, -1, dtype=np.int64)
        for index, fmt in enumerate(group.formats):
            width = _width(extra[(group.name, fmt)], step)
            if width > bins:
                continue
            shifted = np.full(bins + 1, np.inf)
            shifted[width:] = best[: bins + 1 - width] + cost.get((group.name, fmt), 0.0)
            better = shifted < new
            new[better], pick[better] = shifted[better], index
        best = new
        picks.append(pick)
    slot = int(np.argmin(best))
    if not np.isfinite(best[slot]):
        return None
    choice: dict[str, str] = {}
    for group, pick in zip(reversed(groups), reversed(picks), strict=True):
        fmt = group.formats[int(pick[slot])]
        choice[group.name] = fmt
        slot -= _width(extra[(group.name, fmt)], step)
    return choice


def _width(size: float, step: float) -> int:
    return max(int(np.ceil(size / step - 1e-9)), 0)


def seed_assignments(
    graph: ModelGraph, profile: HardwareProfile, groups: Sequence[Group],
    cost: Mapping[tuple[str, str], float], budgets: int = 6,
) -> tuple[Seed, ...]:
    """Uniform, greedy-path and knapsack seeds (group name -> format), without duplicates.

    The knapsack budgets grow geometrically from 2 % to 50 % of the bytes between the smallest
    and the largest model, so the seeds reach the sizes just above the smallest, where a few
    promoted groups buy the most."""
    seeds: list[Seed] = []
    lowest = {g.name: g.formats[0] for g in groups}
    every = sorted({f for g in groups for f in g.formats}, key=lambda f: profile.format(f).rank)
    for fmt in every:
        other = (lowest if table_format(graph, profile, fmt)  # int8 with int8_rows tables
                 else {g.name: g.formats[-1] for g in groups})
        seeds.append(Seed(source=f"uniform {fmt}",
                          formats={g.name: fmt if fmt in g.formats else other[g.name]
                                   for g in groups}))
    ranked = sorted(groups, key=lambda g: cost.get((g.name, g.formats[0]), 0.0), reverse=True)
    k = 1
    while k < len(groups):
        for level, label in ((1, "next"), (-1, "float")):
            choice = dict(lowest)
            for group in ranked[:k]:
                choice[group.name] = group.formats[min(level, len(group.formats) - 1)]
            seeds.append(Seed(source=f"greedy top-{k} {label}", formats=choice))
        k *= 2
    extra = _extra_sizes(graph, profile, groups)
    small = model_size(graph, profile, _expand(groups, lowest))
    large = model_size(graph, profile, _expand(groups, {g.name: g.formats[-1] for g in groups}))
    for fraction in np.geomspace(0.02, 0.5, budgets):
        solved = knapsack(groups, cost, extra, fraction * (large - small))
        if solved is not None:
            seeds.append(Seed(source=f"knapsack {fraction:.1%}", formats=solved))
    unique: dict[tuple[tuple[str, str], ...], Seed] = {}
    for seed in seeds:
        unique.setdefault(tuple(sorted(seed.formats.items())), seed)
    return tuple(unique.values())


def _extra_sizes(
    graph: ModelGraph, profile: HardwareProfile, groups: Sequence[Group]
) -> dict[tuple[str, str], float]:
    """Bytes a group adds at each format over the all-lowest model (the additive size model)."""
    base = _expand(groups, {g.name: g.formats[0] for g in groups})
    reference = float(model_size(graph, profile, base))
    extra: dict[tuple[str, str], float] = {}
    for group in groups:
        for fmt in group.formats:
            trial = dict(base)
            trial.update(dict.fromkeys(group.nodes, fmt))
            extra[(group.name, fmt)] = max(float(model_size(graph, profile, trial)) - reference, 0)
    return extra


def neighbor(
    groups: Sequence[Group], levels: Mapping[str, int], cost: Mapping[tuple[str, str], float],
    rng: np.random.Generator,
) -> dict[str, int]:
    """One step from a front point (group -> format index): promote a group one format up,
    chosen with probability proportional to its sensitivity at its current format, or demote
    one a format down, chosen with probability inversely proportional to the sensitivity it
    would have there. Without sensitivities the choice is uniform."""
    up = [g for g in groups if levels[g.name] < len(g.formats) - 1]
    down = [g for g in groups if levels[g.name] > 0]
    promote = bool(up) and (not down or rng.random() < 0.5)
    pool = up if promote else down
    if promote:
        weights = [cost.get((g.name, g.formats[levels[g.name]]), 0.0) for g in pool]
    else:
        weights = [1.0 / (cost.get((g.name, g.formats[levels[g.name] - 1]), 0.0) + 1e-6)
                   for g in pool]
    total = float(sum(weights))
    chances = [w / total for w in weights] if total > 0 else None
    group = pool[int(rng.choice(len(pool), p=chances))]
    moved = dict(levels)
    moved[group.name] += 1 if promote else -1
    return moved


def compress(
    groups: Sequence[Group], levels: Mapping[str, int], cost: Mapping[tuple[str, str], float],
    rng: np.random.Generator,
) -> dict[str, int]:
    """Many steps down at once from a front point: every group whose cost one format lower is
    at most a random quantile of those costs moves down a format. A point that bought its
    metric with a few expensive promotions keeps them and sheds the cheap ones; single
    :func:`neighbor` steps would need one trial per group to get there."""
    down = {g.name: cost.get((g.name, g.formats[levels[g.name] - 1]), 0.0)
            for g in groups if levels[g.name] > 0}
    moved = dict(levels)
    if not down:
        return moved
    threshold = float(np.quantile(list(down.values()), rng.uniform(0.2, 1.0)))
    for name, below in down.items():
        if below <= threshold:
            moved[name] -= 1
    return moved


def front_step(
    front: Sequence[tuple[float, Mapping[str, int]]], groups: Sequence[Group],
    cost: Mapping[tuple[str, str], float], rng: np.random.Generator,
    unseen: Callable[[Mapping[str, int]], bool], *, compress_weight: float = 1.0,
) -> dict[str, int] | None:
    """An unseen configuration one move from a random front point ((size, format levels)
    pairs), or None after ten tries: :func:`compress` with a probability rising from 0 at the
    front's smallest point to ``compress_weight`` at its largest, else :func:`neighbor`.
    Large points shed the promotions they do not need; small ones take single steps."""
    sizes = [size for size, _ in front]
    span = max(sizes) - min(sizes)
    for _ in range(10):
        size, levels = front[int(rng.integers(len(front)))]
        large = (size - min(sizes)) / span if span > 0 else 0.0
        move = compress if rng.random() < compress_weight * large else neighbor
        moved = move(groups, levels, cost, rng)
        if unseen(moved):
            return moved
    return None
