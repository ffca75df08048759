"""GELU's erf form in our QDQ export, found so a target can run it as one GELU operator.

PyTorch exports ``nn.GELU()`` as ``Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5``. Neither
TFLite nor the Qualcomm HTP has an integer Erf, and both have GELU: :func:`find_gelu` finds the
five nodes (and the Q/DQ pairs between them) so the Vela writer emits one TFLite GELU and the
QNN adapter one ``Gelu`` node, from ``x``'s grid to the last Mul's grid, as ONNX Runtime's own
QNN preprocessing fuses it. The fused operator rounds once where ONNX Runtime's QDQ chain rounds
four times, so the two differ by design, within a few output steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

__all__ = ["Gelu", "find_gelu"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Gelu:
    """One matched GELU: its input tensor, the tensor its last Mul writes, the nodes it
    replaces (the Div first) and the Q/DQ nodes between them."""

    x: str
    output: str
    nodes: tuple[str, ...]
    skipped: tuple[str, ...]


def _constant(name: str, producers: Mapping[str, onnx.NodeProto],
              inits: Mapping[str, np.ndarray]) -> float | None:
    if name in inits and inits[name].size == 1:
        return float(inits[name].reshape(-1)[0])
    node = producers.get(name)
    if node is None or node.op_type != "DequantizeLinear" or node.input[0] not in inits:
        return None
    codes, scale = inits[node.input[0]], inits[node.input[1]]
    zero = inits[node.input[2]] if len(node.input) > 2 else np.zeros(1)
    if codes.size != 1:
        return None
    return float((float(codes.reshape(-1)[0]) - float(zero.reshape(-1)[0]))
                 * float(scale.reshape(-1)[0]))


def find_gelu(model: onnx.ModelProto, inits: Mapping[str, np.ndarray]) -> list[Gelu]:
    """Every GELU erf pattern in ``model`` (each intermediate read by the pattern alone)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for t in n.input:
            consumers.setdefault(t, []).append(n)

    def through(tensor: str, passed: list[str]) -> onnx.NodeProto | None:
        """The one compute node reading ``tensor``, past a Q -> DQ pair."""
        readers = consumers.get(tensor, [])
        while len(readers) == 1 and readers[0].op_type in ("QuantizeLinear",
                                                           "DequantizeLinear"):
            passed.append(readers[0].name)
            readers = consumers.get(readers[0].output[0], [])
        return readers[0] if len(readers) == 1 else None

    def outside(node: onnx.NodeProto, passed: list[str]) -> str:
        """``node``'s input not produced by the pattern's own Q/DQ nodes (its constant)."""
        for t in node.input:
            made = producers.get(t)
            if made is None or made.name not in passed:
                return str(t)
        return ""

    def near(name: str, value: float) -> bool:
        got = _constant(name, producers, inits)
        return got is not None and abs(got - value) <= 2e-3 * abs(value)

    found = []
    for erf in model.graph.node:
        if erf.op_type != "Erf":
            continue
        passed = list[str]()
        div = producers.get(erf.input[0])
        while (div is not None and div.op_type in ("QuantizeLinear", "DequantizeLinear")
               and len(consumers.get(div.output[0], [])) == 1):  # Div -> Q -> DQ -> Erf
            passed.append(div.name)
            div = producers.get(div.input[0])
        if div is None or div.op_type != "Div" or not near(div.input[1], math.sqrt(2)):
            continue
        x = str(div.input[0])
        if len(consumers.get(div.output[0], [])) != 1:
            continue
        add = through(erf.output[0], passed)
        if add is None or add.op_type != "Add" or not near(outside(add, passed), 1.0):
            continue
        mul = through(add.output[0], passed)
        if mul is None or mul.op_type != "Mul" or x not in mul.input:
            continue
        half = through(mul.output[0], passed)
        if half is None or half.op_type != "Mul" or not near(outside(half, passed), 0.5):
            continue
        found.append(Gelu(x=x, output=half.output[0], skipped=tuple(passed),
                          nodes=(div.name, erf.name, add.name, mul.name, half.name)))
    return found

