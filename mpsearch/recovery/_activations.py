"""One FP32 ONNX Runtime pass that reduces chosen activation tensors batch by batch.

Consumes a :class:`~mpsearch.graph.ModelGraph`, a :class:`~mpsearch.data.Dataset`, the tensors
to expose and two functions: ``reduce`` (one, or one per tensor) maps one batch's value of a
tensor to a summary (a sum over the first axis, a per-channel maximum, a Gram matrix) and
``combine`` merges two summaries. Produces the merged summary of each tensor, the rows each
tensor's summary covers (its first axis summed over batches: the samples for batch-first
tensors, samples x steps for a sequence model's ``[steps x batch, features]`` Gemm input) and
the number of samples, holding one batch at a time: the first sample runs alone, its exposed
activations are weighed, and the rest runs in batches that fit :data:`REDUCE_BUDGET` bytes (the
reductions' own temporaries, such as a Conv's input windows, grow with the batch too). A model
whose batch is fixed runs in batches of that size, so no tensor is split. The recovery
statistics (bias correction's :func:`~mpsearch.recovery.input_means`, SmoothQuant's
:func:`~mpsearch.recovery.channel_maxima`, GPTQ's :func:`~mpsearch.recovery.input_hessians`)
are all computed through it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mpsearch.calibration import auto_batch
from mpsearch.data import Dataset
from mpsearch.graph import ModelGraph
from mpsearch.runtime import create_session

__all__ = ["REDUCE_BUDGET", "Reduce", "Reduced", "reduce_activations"]

#: Bytes of exposed activations one batch of :func:`reduce_activations` may hold.
REDUCE_BUDGET = 64 << 20

Reduce = Callable[[np.ndarray], np.ndarray]
Combine = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True, kw_only=True)
class Reduced:
    """What :func:`reduce_activations` returns (see the module docstring)."""

    summaries: dict[str, np.ndarray]
    rows: dict[str, int]
    samples: int


def reduce_activations(graph: ModelGraph, data: Dataset, tensors: Sequence[str], *,
                       reduce: Reduce | Mapping[str, Reduce], combine: Combine,
                       batch_size: int = 16, threads: int = 2,
                       label: str) -> Reduced:
    """``{tensor: combine(... reduce(batch value) ...)}`` over every batch of ``data``, with
    the rows and samples it covers; ``reduce`` may be one function per tensor; ``label``
    names the session in errors. ``batch_size`` caps the batch the memory budget chooses."""
    session = create_session(graph.model, threads=threads, extra_outputs=tensors, label=label,
                             arena=False)
    summaries: dict[str, np.ndarray] = {}
    rows = dict.fromkeys(tensors, 0)
    samples = 0

    def run(feeds: Mapping[str, np.ndarray]) -> int:
        nonlocal samples
        values = session.run(feeds, tensors)
        for name in tensors:
            value = values[name]
            part = reduce[name](value) if isinstance(reduce, Mapping) else reduce(value)
            summaries[name] = combine(summaries[name], part) if name in summaries else part
            rows[name] += int(value.shape[0]) if value.ndim else 1
        samples += len(next(iter(feeds.values()))) if feeds else 0
        return sum(int(v.nbytes) for v in values.values())

    if session.fixed_batch:
        for feeds in data.batches(session.fixed_batch):
            run(feeds)
    elif len(data):
        per_sample = run(next(data.batches(1)))
        size = min(batch_size, auto_batch(per_sample, REDUCE_BUDGET))
        for feeds in data.batches(size, start=1):
            run(feeds)
    return Reduced(summaries=summaries, rows=rows, samples=samples)
