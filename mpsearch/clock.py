"""The one latency clock: repeated, interleaved runs; a median and the runs' spread.

Consumes zero-argument callables (each runs one configuration once, e.g. an ONNX Runtime session
on one batch); produces a :class:`Timing` per callable. Every latency mpsearch reports is timed
here, with one repeat policy: a warm-up run each, then :data:`ROUNDS` rounds, each running every
configuration once, in an order rotated from round to round, so that load on the machine (other
processes, frequency scaling) falls on every configuration alike. The median is the latency;
the interval is the spread of the runs: the fastest and the slowest. Load that changes between
two runs of a search moves a median far more than sampling does, so an interval of the median
alone (order statistics) would claim a precision that a second search does not reproduce.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ROUNDS", "Timing", "time_runs"]

#: Timed runs of each configuration (after one warm-up run): enough that the spread sees the
#: machine's load come and go, few enough to keep timing a small part of a search.
ROUNDS = 9


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """Seconds of one run of a configuration: the median of ``runs`` runs and their spread
    ``(low, high)``, the fastest and the slowest run."""

    seconds: float
    low: float
    high: float
    runs: int

    @property
    def interval_ms(self) -> tuple[float, float]:
        return 1e3 * self.low, 1e3 * self.high


def time_runs(runs: Sequence[Callable[[], object]], *, rounds: int = ROUNDS
              ) -> tuple[Timing, ...]:
    """Time each of ``runs`` ``rounds`` times after one warm-up run each, interleaved (module
    doc)."""
    for run in runs:
        run()
    times: list[list[float]] = [[] for _ in runs]
    for r in range(rounds):
        shift = r % len(runs) if runs else 0
        for i in [*range(shift, len(runs)), *range(shift)]:
            start = time.perf_counter()
            runs[i]()
            times[i].append(time.perf_counter() - start)
    out = []
    for seconds in times:
        out.append(Timing(seconds=float(np.median(seconds)), low=min(seconds),
                          high=max(seconds), runs=len(seconds)))
    return tuple(out)
