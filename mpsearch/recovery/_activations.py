"""One FP32 ONNX Runtime pass that reduces chosen activation tensors batch by batch.

Consumes a :class:`~mpsearch.graph.ModelGraph`, a :class:`~mpsearch.data.Dataset`, the tensors
to expose and two functions: ``reduce`` (one, or one per tensor) maps one batch's value of a
tensor to a summary (a sum over the first axis, a per-channel maximum, a Gram matrix) and
``combine`` merges two summaries. Produces the merged summary of each tensor, the rows each
tensor's summary covers (its first axis summed over batches: the samples for batch-first
tensors, samples x steps for a sequence model's ``[steps x batch, features]`` Gemm input) and
the number of samples, holding one batch at a time. A model whose batch is fixed runs in
batches of that size, so no tensor is split. The recovery statistics (bias correction's
:func:`~mpsearch.recovery.input_means`, SmoothQuant's :func:`~mpsearch.recovery.channel_maxima`,
GPTQ's :func:`~mpsearch.recovery.input_hessians`) are all computed through it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mpsearch.data import Dataset
from mpsearch.graph import ModelGraph
from mpsearch.runtime import create_session

__all__ = ["Reduce", "Reduced", "reduce_activations"]

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
    names the session in errors."""
    session = create_session(graph.model, threads=threads, extra_outputs=tensors, label=label)
    summaries: dict[str, np.ndarray] = {}
    rows = dict.fromkeys(tensors, 0)
    samples = 0
    for feeds in data.batches(session.fixed_batch or batch_size):
        values = session.run(feeds, tensors)
        for name in tensors:
            value = values[name]
            part = reduce[name](value) if isinstance(reduce, Mapping) else reduce(value)
            summaries[name] = combine(summaries[name], part) if name in summaries else part
            rows[name] += int(value.shape[0]) if value.ndim else 1
        samples += len(next(iter(feeds.values()))) if feeds else 0
    return Reduced(summaries=summaries, rows=rows, samples=samples)
