"""GPTQ's gain per layer: the SQNR of a layer's own output under its weight's rounding.

Consumes the graph, its :class:`~mpsearch.recovery.InputHessians` (``H = sum x x^T`` of the
vectors each weight multiplies, on the calibration split) and two QDQ builds of the same
assignment, one rounded to nearest and one by GPTQ; produces, per node with a Hessian,
``10 log10(tr(W H W^T) / tr(dW H dW^T))`` for each build (``dW``: its dequantized weight less
the float one) and their difference. No pass is run: the Hessians are GPTQ's own.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from mpsearch.graph import ModelGraph
from mpsearch.recovery._bias_correction import _dequantize
from mpsearch.recovery._gptq import InputHessians, weight_rows

__all__ = ["layer_gains"]


def layer_gains(graph: ModelGraph, hessians: InputHessians, rtn: onnx.ModelProto,
                gptq: onnx.ModelProto) -> dict[str, dict[str, float]]:
    """Node -> SQNR (dB) of its own output under its weight's rounding in the QDQ model
    ``rtn`` (round to nearest) and ``gptq``, and the difference (``gain``)."""
    rtn_w, gptq_w = _weights_of(rtn), _weights_of(gptq)
    out: dict[str, dict[str, float]] = {}
    for name, h in hessians.hessians.items():
        node = graph.nodes.get(name)
        if node is None or len(node.inputs) < 2 or name not in rtn_w or name not in gptq_w:
            continue
        w = graph.initializers.get(node.inputs[1])
        rows = None if w is None else weight_rows(node, w.astype(np.float64))
        if rows is None or rows.shape[-1] != h.shape[-1]:
            continue
        signal = _energy(rows, h)
        row: dict[str, float] = {}
        for label, quantized in (("rtn", rtn_w[name]), ("gptq", gptq_w[name])):
            q = weight_rows(node, quantized)
            if q is None or q.shape != rows.shape:
                break
            d = q - rows
            noise = _energy(d, h)
            row[label] = 10 * math.log10(signal / noise) if noise > 0 < signal else math.inf
        if len(row) == 2:
            row["gain"] = row["gptq"] - row["rtn"]
            out[name] = row
    return out


def _energy(rows: np.ndarray, hessian: np.ndarray) -> float:
    """``sum_g tr(W_g H_g W_g^T)`` of ``rows`` [G, O, K] and ``hessian`` [G, K, K], as one
    batched matrix product (a three-operand einsum loops over every index without BLAS)."""
    return float(np.sum(np.matmul(rows, hessian) * rows))


def _weights_of(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Node name -> its dequantized weight (input 1) in a QDQ ``model``."""
    inits = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    out: dict[str, np.ndarray] = {}
    for proto in model.graph.node:
        if len(proto.input) < 2:
            continue
        dq = producers.get(proto.input[1])
        if dq is not None and dq.op_type == "DequantizeLinear":
            value = _dequantize(inits, dq)
            if value is not None:
                out[proto.name] = value
    return out
