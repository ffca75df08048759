"""Prefix reuse: run only the part of a candidate that differs from the FP32 model.

Consumes the FP32 :class:`~mpsearch.graph.ModelGraph`, one batch of samples and a built
candidate; produces, for a candidate, the sub-model of what it changes. A configuration that
quantizes one node leaves every node upstream of it (and beside it) in FP32: those nodes
compute exactly what the FP32 model computes. :class:`FloatPrefix` runs the FP32 model once on
the batch and keeps tensors within a memory budget (weighted nodes' outputs, then the tensors
quantizable nodes read, the smallest first: block outputs, a transformer's residual stream);
:meth:`FloatPrefix.cut` then finds a candidate's changed nodes (a node differs from the FP32
node of the same outputs, or reads a tensor that does) and returns the model of those nodes
and of the FP32 nodes between them and the nearest kept tensors, fed with those, or says the
candidate's output is the FP32 output.

The sub-model's values are the candidate's up to float rounding: ONNX Runtime may fuse FP32
nodes differently when some of their tensors are outputs (a fused LayerNorm, a MatMul and Add
into one kernel). The search measures this way only on its sensitivity samples (the analysis
rows, the group costs, and a trial's first race stage when the trial changes a small part of
the model); every front point is re-measured whole on held-out data.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from mpsearch.evaluate import activation_budget
from mpsearch.graph import ModelGraph
from mpsearch.runtime import Session, create_session

__all__ = ["PREFIX_SHARE", "RUN_AT_MOST", "Cut", "FloatPrefix", "run_in_chunks"]

logger = logging.getLogger(__name__)

#: The share of the activation budget (:func:`mpsearch.evaluate.activation_budget`) the kept
#: FP32 tensors may take (which: :meth:`FloatPrefix._wanted`); the evaluation batch takes
#: another share (:data:`mpsearch.evaluate.EVALUATION_SHARE`).
PREFIX_SHARE = 0.25
#: A candidate whose changed part (with the FP32 nodes it recomputes) is more than this share
#: of its nodes runs whole: a second session would cost more than the nodes it skips.
RUN_AT_MOST = 0.8


@dataclass(frozen=True, slots=True)
class Cut:
    """The part of a candidate to run: ``model`` holds its ``nodes`` (the changed ones and the
    FP32 nodes back to kept tensors) and reads ``feeds`` (kept FP32 tensors, graph inputs);
    ``model`` is None when the wanted output reads nothing changed (it is the FP32 output)."""

    model: onnx.ModelProto | None
    feeds: Mapping[str, np.ndarray]
    nodes: int


def run_in_chunks(session: Session, feeds: Mapping[str, np.ndarray], outputs: list[str],
                  rows: int) -> dict[str, np.ndarray]:
    """``session``'s ``outputs`` on batch-first ``feeds``, ``rows`` samples a run (so one
    run's working memory stays that of an evaluation batch), concatenated."""
    total = len(next(iter(feeds.values()))) if feeds else 0
    if total <= rows:
        return session.run(feeds, outputs)
    parts = [session.run({k: v[start:start + rows] for k, v in feeds.items()}, outputs)
             for start in range(0, total, rows)]
    return {name: np.concatenate([p[name] for p in parts]) for name in outputs}


class FloatPrefix:
    """FP32 tensors of ``graph`` on the samples of ``feeds`` within ``budget`` bytes (None:
    :data:`PREFIX_SHARE` of the activation budget), computed ``rows`` samples a run, and the
    cut of a candidate built from ``graph`` down to what it changes."""

    def __init__(self, graph: ModelGraph, feeds: Mapping[str, np.ndarray], *, threads: int = 2,
                 budget: int | None = None, rows: int | None = None) -> None:
        budget = int(PREFIX_SHARE * activation_budget()) if budget is None else budget
        self.graph = graph
        self.rows = len(next(iter(feeds.values()))) if feeds else 0
        self._fp32 = {node.output[0]: node for node in graph.model.graph.node if node.output}
        self._initializers = {t.name: t for t in graph.model.graph.initializer}
        probe = {name: value[:2] for name, value in feeds.items()}
        wanted = self._wanted(probe, threads, budget)
        self.kept: dict[str, np.ndarray] = dict(feeds)
        if wanted:  # a session exposing only these: ORT fuses the rest as in the reference
            session = create_session(graph.model, threads=threads, extra_outputs=wanted,
                                     label=f"{graph.name} (kept FP32 tensors)")
            self.kept.update(run_in_chunks(session, feeds, wanted, rows or self.rows))
        logger.debug("prefix reuse: %d FP32 tensors kept (%.0f MB) for %d samples",
                     len(wanted), sum(v.nbytes for v in self.kept.values()) / 2**20, self.rows)

    def _wanted(self, probe: Mapping[str, np.ndarray], threads: int, budget: int) -> list[str]:
        """The tensors to keep while their bytes fit ``budget``: first the outputs of weighted
        nodes (a candidate then recomputes no Conv or MatMul upstream of what it changes),
        then the tensors quantizable nodes read (a one-node candidate starts at its node),
        then the rest, the smallest first in each: a network's narrow tensors (block outputs,
        a transformer's residual stream) cut it into short spans. Sizes are weighed on one
        sample with every activation exposed (as calibration weighs one). Only tensors with one
        row per sample (one row for one sample, two for two: ``probe`` holds up to two) are
        kept, since kept tensors are fed and sliced a batch of samples at a time: a Reshape
        that folds the batch into another axis ([-1, 2]) has two rows a sample, and a tensor
        built from the input's shape alone (a detector's anchor grid, [1, 2, 2100]) one row
        for any batch."""
        graph = self.graph
        activations = [o for name in graph.order for o in graph.proto(name).output if o]
        session = create_session(graph.model, threads=threads, extra_outputs=activations,
                                 label=graph.name)
        count = len(next(iter(probe.values()))) if probe else 0
        many = session.run(probe, activations)
        one = many if count < 2 else session.run({k: v[:1] for k, v in probe.items()},
                                                 activations)
        sizes = {name: one[name].nbytes * self.rows for name, value in many.items()
                 if isinstance(value, np.ndarray) and value.ndim and len(value) == count
                 and len(one[name]) == 1}
        quantizable = graph.quantizable_nodes()
        heavy = {t for node in quantizable if node.weights for t in node.outputs}
        read = {t for node in quantizable for t in node.activation_inputs}
        chosen, used = [], 0
        for name in sorted(sizes, key=lambda t: (t not in heavy, t not in read, sizes[t], t)):
            if used + sizes[name] > budget:
                continue  # a smaller one may still fit
            chosen.append(name)
            used += sizes[name]
        return chosen

    def cut(self, candidate: onnx.ModelProto, output: str) -> Cut | None:
        """The part of ``candidate`` to run for ``output``: its nodes that differ from the FP32
        model and the FP32 nodes between them and the nearest kept tensors. None when that is
        most of the model (run it whole) or a node has a subgraph."""
        graph = candidate.graph
        clean: set[str] = {i.name for i in graph.input} | {""}
        for tensor in graph.initializer:
            original = self._initializers.get(tensor.name)
            # a build keeps an unchanged float initializer's name (or emits its stand-in)
            if original is not None and (tensor.data_location == onnx.TensorProto.EXTERNAL
                                         or tensor == original):
                clean.add(tensor.name)
        changed: list[int] = []
        producer: dict[str, int] = {}
        for index, node in enumerate(graph.node):
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                   for a in node.attribute):
                return None  # outer-scope reads are not tracked
            producer.update(dict.fromkeys(node.output, index))
            fp32 = self._fp32.get(node.output[0]) if node.output else None
            if fp32 is not None and node == fp32 and all(t in clean for t in node.input):
                clean.update(node.output)
            else:
                changed.append(index)
        if output in clean:
            return Cut(model=None, feeds={}, nodes=0)
        run = set(changed)
        pending = [t for i in changed for t in graph.node[i].input]
        while pending:  # FP32 nodes back to the kept tensors
            tensor = pending.pop()
            source = producer.get(tensor)
            if source is None or source in run or tensor in self.kept:
                continue
            run.add(source)
            pending.extend(graph.node[source].input)
        if len(run) > RUN_AT_MOST * len(graph.node):
            return None
        nodes = [graph.node[i] for i in sorted(run)]
        produced = {t for node in nodes for t in node.output}
        read = set(t for node in nodes for t in node.input if t)
        boundary = sorted(t for t in read if t not in produced and t in self.kept)
        values = [helper.make_tensor_value_info(  # batch-first: any number of samples a run
            t, helper.np_dtype_to_tensor_dtype(self.kept[t].dtype),
            ["batch", *self.kept[t].shape[1:]]) for t in boundary]
        sub = helper.make_graph(
            nodes, f"{graph.name}-changed", values, [o for o in graph.output if o.name == output],
            initializer=[t for t in graph.initializer if t.name in read])
        model = helper.make_model(sub, opset_imports=list(candidate.opset_import),
                                  ir_version=candidate.ir_version,
                                  producer_name=candidate.producer_name)
        return Cut(model=model, feeds={t: self.kept[t] for t in boundary}, nodes=len(nodes))

