"""Model summary: op types, parameters, tensor shapes and MACs/FLOPs per node.

Consumes a :class:`~mpsearch.graph.ModelGraph`; produces a frozen :class:`ModelSummary`.
Symbolic dimensions (a dynamic batch) count as 1. MACs are multiply-accumulates of Conv,
ConvTranspose, Gemm, MatMul (the figure papers publish) and the gates of LSTM, GRU and RNN
(input and recurrent weights, every step); FLOPs are 2 x MACs plus every other
node's arithmetic (one FLOP per output element for element-wise ops, more for Softmax and
normalizations, per kernel window for pooling). Parameters are the float initializers with at
least one axis (0-d constants such as Clip bounds are not parameters).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mpsearch.graph import Dim, ModelGraph, Node

__all__ = ["ModelSummary", "NodeSummary", "format_summary", "summarize"]

_ELEMENTWISE = frozenset(
    {"Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "Clip", "Max", "Min", "Neg", "Abs",
     "Sqrt", "Pow", "Where", "Equal", "Less", "Greater", "PRelu", "Cast"}
)
#: Gates of the recurrent ops, each a product of the step's input and of the last output.
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_FLOPS_PER_ELEMENT = {"Sigmoid": 4, "HardSigmoid": 3, "HardSwish": 4, "Tanh": 4, "Exp": 4,
                      "Erf": 4, "Gelu": 8, "Softmax": 5, "BatchNormalization": 2,
                      "LayerNormalization": 8, "InstanceNormalization": 8}


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSummary:
    name: str
    op_type: str
    input_shapes: tuple[tuple[Dim, ...] | None, ...]
    output_shapes: tuple[tuple[Dim, ...] | None, ...]
    params: int
    macs: int
    flops: int
    quantizable: bool
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSummary:
    model: str
    opset: int
    inputs: tuple[tuple[str, tuple[Dim, ...] | None, str], ...]
    outputs: tuple[tuple[str, tuple[Dim, ...] | None, str], ...]
    op_types: Mapping[str, int]
    nodes: tuple[NodeSummary, ...]
    params: int
    macs: int
    flops: int
    weight_bytes: int
    quantizable: int
    changes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["op_types"] = dict(self.op_types)
        return data


def summarize(graph: ModelGraph) -> ModelSummary:
    """Summarize ``graph``: op histogram, parameters, shapes and MACs/FLOPs per node."""
    counted: set[str] = set()
    rows = []
    for node in graph.nodes.values():
        params = 0
        for tensor in node.inputs:
            array = graph.initializers.get(tensor)
            if array is not None and _is_parameter(array) and tensor not in counted:
                counted.add(tensor)
                params += int(array.size)
        macs, flops = _cost(graph, node)
        rows.append(NodeSummary(
            name=node.name, op_type=node.op_type,
            input_shapes=tuple(graph.shapes.get(t) for t in node.inputs if t),
            output_shapes=tuple(graph.shapes.get(t) for t in node.outputs if t),
            params=params, macs=macs, flops=flops,
            quantizable=node.quantizable, reason=node.reason,
        ))
    float_params = [a for a in graph.initializers.values() if _is_parameter(a)]
    return ModelSummary(
        model=graph.name, opset=graph.opset,
        inputs=tuple((t.name, t.shape, str(t.dtype)) for t in graph.inputs),
        outputs=tuple((t.name, t.shape, str(t.dtype)) for t in graph.outputs),
        op_types=dict(sorted(Counter(n.op_type for n in graph.nodes.values()).items())),
        nodes=tuple(rows),
        params=sum(int(a.size) for a in float_params),
        macs=sum(r.macs for r in rows),
        flops=sum(r.flops for r in rows),
        weight_bytes=sum(int(a.nbytes) for a in graph.initializers.values()),
        quantizable=sum(1 for r in rows if r.quantizable),
        changes=graph.changes,
    )


def _is_parameter(array: np.ndarray) -> bool:
    """Float tensors with at least one axis: exporters never store learned weights as 0-d
    scalars, which are constants such as Clip bounds or an attention's 1/sqrt(d)."""
    return array.dtype.kind == "f" and array.ndim > 0


def _numel(shape: tuple[Dim, ...] | None) -> int:
    if shape is None:
        return 0
    return math.prod(d if isinstance(d, int) and d > 0 else 1 for d in shape)


def _dims(shape: tuple[Dim, ...] | None) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d > 0 else 1 for d in (shape or ()))


def _cost(graph: ModelGraph, node: Node) -> tuple[int, int]:
    """(MACs, FLOPs) of one node."""
    op = node.op_type
    out = _numel(graph.shapes.get(node.outputs[0])) if node.outputs else 0
    first = _numel(graph.shapes.get(node.inputs[0])) if node.inputs else 0
    if op in ("Conv", "ConvTranspose"):
        weight = _dims(graph.shapes.get(node.inputs[1]))
        if len(weight) < 3:
            return 0, 0
        kernel = math.prod(weight[2:])
        if op == "Conv":  # weight: (Cout, Cin/groups, k...)
            macs = out * weight[1] * kernel
        else:  # weight: (Cin, Cout/groups, k...)
            macs = first * weight[1] * kernel
        bias = out if len(node.inputs) > 2 and node.inputs[2] else 0
        return macs, 2 * macs + bias
    if op in ("Gemm", "MatMul"):
        a = _dims(graph.shapes.get(node.inputs[0]))
        if not a:
            return 0, 0
        transposed = op == "Gemm" and bool(node.attributes.get("transA", 0))
        k = a[0] if transposed and len(a) == 2 else a[-1]
        macs = out * k
        bias = out if op == "Gemm" and len(node.inputs) > 2 and node.inputs[2] else 0
        return macs, 2 * macs + bias
    if op in _GATES:  # Y: [seq, directions, batch, hidden]
        x = _dims(graph.shapes.get(node.inputs[0]))
        hidden = int(node.attributes.get("hidden_size", 0) or 0)
        if not x or not hidden:
            return 0, 0
        macs = out * _GATES[op] * (x[-1] + hidden)
        return macs, 2 * macs + out * _GATES[op] * 5  # each gate's bias add and activation
    if op in ("MaxPool", "AveragePool"):
        return 0, out * math.prod(node.attributes.get("kernel_shape", (1,)))
    if op in ("GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceSum", "ReduceMax"):
        return 0, first
    if op == "Resize":
        mode = node.attributes.get("mode", b"nearest")
        return 0, out * (1 if mode in (b"nearest", "nearest") else 4)
    if op in _FLOPS_PER_ELEMENT:
        return 0, out * _FLOPS_PER_ELEMENT[op]
    if op in _ELEMENTWISE:
        return 0, out
    return 0, 0


def _count(value: int) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f}{unit}"
    return str(value)


def format_summary(summary: ModelSummary, top: int = 15) -> str:
    """A human-readable table: totals, op histogram and the heaviest nodes."""
    lines = [
        f"model      {summary.model}  (opset {summary.opset})",
        *(f"input      {n} {list(s) if s else '?'} {d}" for n, s, d in summary.inputs),
        *(f"output     {n} {list(s) if s else '?'} {d}" for n, s, d in summary.outputs),
        f"params     {summary.params:,} ({_count(summary.params)})",
        f"MACs       {summary.macs:,} ({_count(summary.macs)})",
        f"FLOPs      {summary.flops:,} ({_count(summary.flops)})",
        f"nodes      {len(summary.nodes)} ({summary.quantizable} quantizable)",
        "op types   " + ", ".join(f"{op} {n}" for op, n in summary.op_types.items()),
    ]
    lines += [f"normalized {change}" for change in summary.changes]
    heavy = sorted(summary.nodes, key=lambda r: r.flops, reverse=True)[:top]
    total = max(summary.flops, 1)
    lines.append("")
    lines.append(f"{'node':<36} {'op':<18} {'params':>10} {'MACs':>10} {'FLOPs %':>8}  output")
    for row in heavy:
        shape = list(row.output_shapes[0]) if row.output_shapes and row.output_shapes[0] else "?"
        lines.append(f"{row.name[:36]:<36} {row.op_type:<18} {row.params:>10,} "
                     f"{_count(row.macs):>10} {100 * row.flops / total:>7.1f}%  {shape}")
    return "\n".join(lines)
