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
are all computed through it; :func:`sum_together` runs several additive ones in one pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mpsearch.calibration import auto_batch
from mpsearch.data import Dataset
from mpsearch.graph import ModelGraph
from mpsearch.runtime import create_session

__all__ = ["REDUCE_BUDGET", "Reduce", "Reduced", "reduce_activations", "sum_together"]

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


def sum_together(graph: ModelGraph, data: Dataset, parts: Sequence[Mapping[str, Reduce]], *,
                 batch_size: int = 16, threads: int = 2, label: str) -> list[Reduced]:
    """Several statistics whose summaries add up over batches (``combine`` is ``+``), each a
    reduce per tensor, in one pass of :func:`reduce_activations`: a tensor two of them read
    is exposed once, its summaries joined into one array and split again after the pass.
    One :class:`Reduced` per part, in order."""
    readers = {t: [i for i, part in enumerate(parts) if t in part]
               for t in sorted({t for part in parts for t in part})}
    sizes: dict[str, list[tuple[int, tuple[int, ...]]]] = {}

    def joined(tensor: str) -> Reduce:
        def reduce(value: np.ndarray) -> np.ndarray:
            pieces = [np.asarray(parts[i][tensor](value), np.float64) for i in readers[tensor]]
            sizes.setdefault(tensor, [(piece.size, piece.shape) for piece in pieces])
            if len(pieces) == 1:  # no copy of a lone summary (a Hessian can be large)
                return pieces[0].reshape(-1)
            return np.concatenate([piece.reshape(-1) for piece in pieces])
        return reduce

    reduced = reduce_activations(graph, data, list(readers),
                                 reduce={t: joined(t) for t in readers}, combine=np.add,
                                 batch_size=batch_size, threads=threads, label=label)
    out = [Reduced(summaries={}, rows={}, samples=reduced.samples) for _ in parts]
    for tensor, owners in readers.items():
        if tensor not in reduced.summaries:
            continue
        offset = 0
        for owner, (size, shape) in zip(owners, sizes[tensor], strict=True):
            out[owner].summaries[tensor] = reduced.summaries[tensor][offset:offset + size
                                                                     ].reshape(shape)
            out[owner].rows[tensor] = reduced.rows[tensor]
            offset += size
    return out
