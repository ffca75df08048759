"""The one latency clock: repeated, interleaved runs; a median and the runs' spread.

Consumes callables that run one configuration once on the feeds they are given (e.g. an ONNX
Runtime session's ``run``) and the feeds; produces a :class:`Timing` per callable. Every
latency mpsearch reports is timed here, with one repeat policy:

- a warm-up run each, then at least :data:`ROUNDS` rounds, each running every configuration
  once, in an order rotated from round to round, so that load on the machine (other processes,
  frequency scaling) falls on every configuration alike;
- a run lasts at least :data:`MIN_RUN_SECONDS`: a faster configuration is called several times
  per run and the run reports the mean call, so the timer's resolution and one call's jitter do
  not decide the spread;
- each round places the feeds at another offset within a memory page: where the input starts
  moves a small model's latency by a third (cache-set and 4K-aliasing effects), so one fixed
  placement would make two searches disagree by more than their spreads;
- where a spread is reported, the rounds go on for at least :data:`SPREAD_SECONDS`, since a
  machine's speed wanders by tens of percent over seconds (a virtual machine's neighbours);
  configurations timed at two batches are timed in the same rounds, so both see that time.

The median is the latency; the interval is the spread of the runs, the fastest and the slowest.
An interval of the median alone (order statistics) would claim a precision that a second search
does not reproduce. ``benchmarks/bench_clock.py`` measures what each rule buys.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MIN_RUN_SECONDS", "ROUNDS", "SPREAD_SECONDS", "Timing", "time_runs"]

Feeds = Mapping[str, np.ndarray]

#: Timed runs of each configuration at least (after one warm-up run).
ROUNDS = 9

#: The shortest timed run: a configuration faster than this is called ``ceil(MIN_RUN_SECONDS /
#: one call)`` times per run.
MIN_RUN_SECONDS = 0.002

#: The least time the rounds span where the spread is reported, not just the median.
SPREAD_SECONDS = 2.0

#: Byte offsets of the feeds within a page, one per round in turn: spread over the page and
#: over the low address bits, multiples of 16 so that every dtype stays aligned.
OFFSETS = tuple(i * 528 % 4096 for i in range(ROUNDS))

#: Calls per run, and rounds, at most, whatever the configurations' speed.
_MAX_CALLS = 10_000
_MAX_ROUNDS = 1_000
_PAGE = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """Seconds of one call of a configuration: the median of ``runs`` runs (each the mean of
    ``calls`` calls) and their spread ``(low, high)``, the fastest and the slowest run."""

    seconds: float
    low: float
    high: float
    runs: int
    calls: int

    @property
    def interval_ms(self) -> tuple[float, float]:
        return 1e3 * self.low, 1e3 * self.high


def time_runs(runs: Sequence[Callable[[Feeds], object]], feeds: Feeds | Sequence[Feeds], *,
              rounds: int = ROUNDS, min_run: float = MIN_RUN_SECONDS, span: float = 0.0
              ) -> tuple[Timing, ...]:
    """Time each of ``runs`` on ``feeds`` (one mapping for all, or one per run) at least
    ``rounds`` times after one warm-up run each, interleaved, each run lasting at least
    ``min_run`` seconds and the rounds together at least ``span`` seconds
    (:data:`SPREAD_SECONDS` where the spread is reported; module doc)."""
    each = [feeds] * len(runs) if isinstance(feeds, Mapping) else list(feeds)
    if len(each) != len(runs):
        raise ValueError(f"{len(runs)} runs but {len(each)} feeds")
    calls = [_calls_per_run(run, f, min_run) for run, f in zip(runs, each, strict=True)]
    times: list[list[float]] = [[] for _ in runs]
    began = time.perf_counter() if span > 0 else 0.0
    r = 0
    while runs and r < _MAX_ROUNDS and (
            r < rounds or (span > 0 and time.perf_counter() - began < span)):
        offset = OFFSETS[r % len(OFFSETS)]
        placed = {id(f): placed_at(f, offset) for f in each}
        shift = r % len(runs)
        for i in [*range(shift, len(runs)), *range(shift)]:
            run, its = runs[i], placed[id(each[i])]
            start = time.perf_counter()
            for _ in range(calls[i]):
                run(its)
            times[i].append((time.perf_counter() - start) / calls[i])
        r += 1
    return tuple(Timing(seconds=float(np.median(seconds)), low=min(seconds), high=max(seconds),
                        runs=len(seconds), calls=n)
                 for seconds, n in zip(times, calls, strict=True))


def placed_at(feeds: Feeds, offset: int) -> dict[str, np.ndarray]:
    """Copies of ``feeds`` whose data start ``offset`` bytes into a memory page (arrays of
    Python objects, such as strings, as they are)."""
    placed = {}
    for name, array in feeds.items():
        array = np.asarray(array)
        if array.dtype.hasobject:
            placed[name] = array
            continue
        buffer = np.empty(array.nbytes + _PAGE, np.uint8)
        start = (offset - buffer.ctypes.data) % _PAGE
        copy = buffer[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
        copy[...] = array
        placed[name] = copy
    return placed


def _calls_per_run(run: Callable[[Feeds], object], feeds: Feeds, min_run: float) -> int:
    """Warm ``run`` up, time one call, and return how many calls make a run of ``min_run``."""
    run(feeds)
    start = time.perf_counter()
    run(feeds)
    took = time.perf_counter() - start
    if took >= min_run:
        return 1
    return min(_MAX_CALLS, math.ceil(min_run / max(took, 1e-9)))
