"""Sensitivity per projection: the KL when one weight alone drops to a candidate choice.

Consumes a :class:`~mpsearch.llm.Scorer`, a :class:`~mpsearch.llm._choices.WeightBank` and a
menu (weight key -> its candidate choices, smallest first); produces a :class:`Sensitivity`:
for every (weight, choice) the mean per-token KL divergence from FP32 on the given windows with
every other weight FP32, and the window forward passes it took. A choice that reproduces the
weight exactly (:meth:`WeightBank.exact`) is recorded as KL 0 without a pass. The additive model
``sum of the one-weight KLs`` seeds the search; :meth:`Sensitivity.ranking` orders the weights by
what their smallest choice costs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mpsearch.llm._choices import Choice, WeightBank
from mpsearch.llm._formats import parse_format
from mpsearch.llm._metrics import Scorer

__all__ = ["Sensitivity", "default_menu", "measure_sensitivity"]

logger = logging.getLogger(__name__)

Menu = Mapping[str, Sequence[Choice]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sensitivity:
    """``kl[(key, choice label)]``: the one-weight KL (nats a token); ``measured``: the pairs
    a forward pass scored (the others reproduce the weight exactly); ``passes``: window
    forward passes; ``tokens``: tokens each score predicted."""

    kl: Mapping[tuple[str, str], float]
    measured: frozenset[tuple[str, str]]
    passes: int
    tokens: int

    def cost(self, key: str, choice: Choice) -> float:
        return float(self.kl.get((key, choice.label), 0.0))

    def ranking(self, menu: Menu) -> tuple[str, ...]:
        """Weight keys by falling KL at their smallest choice (most sensitive first); ties
        keep the menu's order."""
        keys = list(menu)
        return tuple(sorted(keys, key=lambda k: -self.cost(k, menu[k][0])))

    def table(self, menu: Menu) -> list[tuple[str, dict[str, float]]]:
        """``[(key, {choice label: KL})]`` in the menu's order, for reports."""
        return [(key, {c.label: self.cost(key, c) for c in choices})
                for key, choices in menu.items()]


def default_menu(bank: WeightBank, formats: Sequence[str], method: str = "kquant",
                 exact: str | None = None, extra: Mapping[str, Sequence[str]] | None = None
                 ) -> dict[str, tuple[Choice, ...]]:
    """Each weight's candidate choices, smallest first: the integer ``formats`` by ``method``
    (``exact``, when given, by ``rtn``: a format that reproduces a weight born on its grid),
    dropping a format that stores no fewer bytes than a finer block of the same bits and zero
    kind (blocks of 128 pad a K of 576 and cost more than blocks of 64); ``extra``: more
    formats for some weights (8 bits for an ``lm_head`` born in 8 bits, say)."""
    menu: dict[str, tuple[Choice, ...]] = {}
    for key in bank.keys:
        names = [*formats, *(extra or {}).get(key, ()), *([exact] if exact else [])]
        sized = []
        for name in names:
            choice = Choice(fmt=name, method="rtn" if name == exact else method)
            sized.append((bank.weight_bytes(key, choice), parse_format(name), choice))
        kept = [(size, fmt, choice) for size, fmt, choice in sized
                if not any(o.bits == fmt.bits and o.zero == fmt.zero and o.block < fmt.block
                           and s <= size for s, o, _ in sized)]
        menu[key] = tuple(c for _, _, c in sorted(kept, key=lambda t: (t[0], t[2].fmt)))
    return menu


def measure_sensitivity(scorer: Scorer, bank: WeightBank, menu: Menu, windows: np.ndarray,
                        progress: Callable[[int, int], None] | None = None) -> Sensitivity:
    """Score every (weight, choice) of ``menu`` alone on ``windows``; the choices are quantized
    and kept in ``bank`` (the search reuses them)."""
    kl: dict[tuple[str, str], float] = {}
    measured: set[tuple[str, str]] = set()
    start = scorer.passes
    tokens = int(windows.shape[0] * (windows.shape[1] - 1))
    pairs = [(key, choice) for key, choices in menu.items() for choice in choices]
    for done, (key, choice) in enumerate(pairs, 1):
        if bank.exact(key, choice):
            kl[(key, choice.label)] = 0.0
        else:
            score = scorer.score(bank.feeds({key: choice}, keep=True), windows)
            kl[(key, choice.label)] = max(score.kl.mean, 0.0)
            measured.add((key, choice.label))
        if progress is not None:
            progress(done, len(pairs))
    logger.info("sensitivity of %d pairs, %d measured, %d passes", len(pairs), len(measured),
                scorer.passes - start)
    return Sensitivity(kl=kl, measured=frozenset(measured), passes=scorer.passes - start,
                       tokens=tokens)
