"""One FP32 ONNX Runtime pass that reduces chosen activation tensors batch by batch.

Consumes a :class:`~mpsearch.graph.ModelGraph`, a :class:`~mpsearch.data.Dataset`, the tensors
to expose and two functions: ``reduce`` maps one batch's value of a tensor to a summary (a sum
over the batch axis, a per-channel maximum) and ``combine`` merges two summaries. Produces the
merged summary of each tensor and the number of samples seen, holding one batch at a time. The
recovery statistics (bias correction's :func:`~mpsearch.recovery.input_means`, SmoothQuant's
:func:`~mpsearch.recovery.channel_maxima`) are both computed through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mpsearch.data import Dataset
from mpsearch.graph import ModelGraph
from mpsearch.runtime import create_session

__all__ = ["reduce_activations"]

Reduce = Callable[[np.ndarray], np.ndarray]
Combine = Callable[[np.ndarray, np.ndarray], np.ndarray]


def reduce_activations(graph: ModelGraph, data: Dataset, tensors: Sequence[str], *,
                       reduce: Reduce, combine: Combine, batch_size: int = 16, threads: int = 2,
                       label: str) -> tuple[dict[str, np.ndarray], int]:
    """``{tensor: combine(... reduce(batch value) ...)}`` over every batch of ``data``, and the
    sample count; ``label`` names the session in errors."""
    session = create_session(graph.model, threads=threads, extra_outputs=tensors, label=label)
    summaries: dict[str, np.ndarray] = {}
    count = 0
    for feeds in data.batches(batch_size):
        values = session.run(feeds, tensors)
        for name in tensors:
            part = reduce(values[name])
            summaries[name] = combine(summaries[name], part) if name in summaries else part
        count += len(next(iter(values.values()))) if values else 0
    return summaries, count
