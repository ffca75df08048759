"""The toolkit's view of our graph: its verbose layer table parsed, mapped back to our nodes.

``parse_layers`` reads the "Network Layer Information Table" RKNN-Toolkit2 prints on a verbose
build (layer type, dtype, NPU or CPU, estimated cycles); ``place`` maps its rows back to the
nodes of our QDQ export as :class:`~mpsearch.targets.Placement`; ``cost_of`` sums the figures;
``plain_float`` undoes our float16 emulation, which the toolkit does itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from mpsearch.errors import TargetError
from mpsearch.targets._base import ACCELERATOR, CPU, Placement

__all__ = ["Layer", "cost_of", "parse_layers", "place", "plain_float"]

_PRECISION = {"INT8": "int8", "UINT8": "uint8", "INT16": "int16", "FLOAT16": "fp16",
              "FLOAT": "fp32", "FLOAT32": "fp32", "INT32": "int32", "INT4": "int4"}
_UNPLACED = frozenset({"QuantizeLinear", "DequantizeLinear", "Constant", "Identity"})
_ROW = re.compile(r"RKNN: \[[^\]]*\]\s+(\d+)\s+(\S+)\s+([A-Z0-9]+)\s+([A-Z]+\S*)\s+\S+\s+\S+\s+"
                  r"(\d+)/(\d+)/(\d+)\s+(\d+)\s+(\S.*?)\s*$")
_MEMORY = re.compile(r"Total (Internal|Weight) Memory Size: ([\d.]+)\s*([KMG]?B)")
_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


@dataclass(frozen=True, slots=True, kw_only=True)
class Layer:
    """One row of the toolkit's Network Layer Information Table."""

    index: int
    op: str           # the toolkit's layer type (fused names such as ConvRelu)
    dtype: str        # DataType column: INT8, FLOAT16, ...
    target: str       # Target column: NPU or CPU
    ddr_cycles: int
    npu_cycles: int
    cycles: int
    rw_kb: int
    name: str         # FullName after "OpType:", e.g. "/fc/Gemm#2"


def parse_layers(log: str) -> tuple[Layer, ...]:
    """The layers of the last "Network Layer Information Table" in a verbose build log."""
    start = log.rfind("Network Layer Information Table")
    if start < 0:
        return ()
    layers: list[Layer] = []
    for line in log[start:].splitlines()[1:]:
        match = _ROW.search(line)
        if match is None:
            if layers and "-----" in line:
                break
            continue
        idx, op, dtype, target, ddr, npu, total, rw, full = match.groups()
        name = full.split(":", 1)[1] if ":" in full else full
        layers.append(Layer(index=int(idx), op=op, dtype=dtype, target=target,
                            ddr_cycles=int(ddr), npu_cycles=int(npu), cycles=int(total),
                            rw_kb=int(rw), name=name.strip()))
    return tuple(layers)


def _base(name: str) -> str:
    """A layer's name without the toolkit's suffixes: ``#N...`` (a node split in layers) and
    ``_2conv``/``_2sl_2sp``/``_2sdpa``... (a node rewritten as another op)."""
    return re.sub(r"(#\d+.*|(_2[a-z]+\d*)+)$", "", name)


def _reason(layer: Layer, log: str) -> str:
    said = [line.split("]", 1)[-1].strip() for line in log.splitlines()
            if ("W RKNN" in line or "E RKNN" in line) and layer.name in line]
    if said:
        return "; ".join(dict.fromkeys(said))[:400]
    return f"RKNN-Toolkit2 placed this {layer.op} layer ({layer.dtype}) on the CPU"


def _placement(node: str, layer: Layer, log: str, how: str = "",
               own: bool = True) -> Placement:
    """``node`` on ``layer``; ``own``: the layer is the node's own (it carries the cycles),
    not one the node was fused into."""
    cpu = layer.target.upper().startswith("CPU")
    reason = _reason(layer, log) if cpu else how
    return Placement(node=node, unit=CPU if cpu else ACCELERATOR,
                     precision=_PRECISION.get(layer.dtype, layer.dtype.lower()), reason=reason,
                     cycles=float(layer.cycles) if own else None)


def _cast_to(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "to"), -1)


def _fp16_casts(graph: onnx.GraphProto) -> set[str]:
    """Cast nodes that emulate float16: to float16, back from a float16 Cast, or widening a
    float16-stored weight."""
    to16 = {n.output[0] for n in graph.node if n.op_type == "Cast"
            and _cast_to(n) == onnx.TensorProto.FLOAT16}
    to16 |= {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT16}
    return {n.name for n in graph.node if n.op_type == "Cast"
            and (n.output[0] in to16 or (n.input and n.input[0] in to16))}


def plain_float(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with our float16 emulation undone: float16-stored weights widened by a Cast
    become float32 initializers and float32 -> float16 -> float32 Cast pairs go. The toolkit
    runs every float layer in FP16 itself, and rejects float16 weights behind a Cast."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {i.name: i for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    rename: dict[str, str] = {}
    drop: set[int] = set()
    keep: list[onnx.NodeProto] = []
    for n in graph.node:
        if n.op_type != "Cast" or _cast_to(n) != onnx.TensorProto.FLOAT:
            continue
        source = inits.get(n.input[0])
        if source is not None and source.data_type == onnx.TensorProto.FLOAT16:
            wide = onnx.numpy_helper.from_array(
                onnx.numpy_helper.to_array(source).astype(np.float32), n.output[0])
            graph.initializer.append(wide)
            drop.add(id(n))
            continue
        half = next((m for m in graph.node if n.input[0] in m.output), None)
        if (half is not None and half.op_type == "Cast" and _cast_to(half) == onnx.TensorProto.
                FLOAT16 and all(c.op_type == "Cast" for c in consumers.get(half.output[0], []))):
            drop.add(id(n))
            if n.output[0] in outputs:
                keep.append(onnx.helper.make_node("Identity", [half.input[0]], [n.output[0]],
                                                  name=n.name))
            else:
                rename[n.output[0]] = half.input[0]
    nodes = [n for n in graph.node if id(n) not in drop] + keep
    for n in nodes:
        for k, name in enumerate(n.input):
            n.input[k] = rename.get(name, name)
    used = {name for n in nodes for name in n.input}
    dead = {id(n) for n in nodes if n.op_type == "Cast"
            and _cast_to(n) == onnx.TensorProto.FLOAT16 and not used & set(n.output)}
    del graph.node[:]
    graph.node.extend(n for n in nodes if id(n) not in dead)
    live = used | outputs
    kept = [i for i in graph.initializer if i.name in live]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return out


def place(model: onnx.ModelProto, layers: Sequence[Layer], log: str = "") -> tuple[Placement, ...]:
    """Each compute node of ``model`` (not Q/DQ, not a float16-emulating Cast) with the layer
    the toolkit built for it: by name, else by the first layer named after one of its output
    tensors; a node the toolkit fused away takes the placement of its nearest placed producer
    (else consumer), with the layer it was folded into as the reason."""
    graph = model.graph
    skip = _fp16_casts(graph) | {n.name for n in graph.node if n.op_type in _UNPLACED}
    real = [layer for layer in layers if layer.op not in ("InputOperator", "OutputOperator")]
    by_name: dict[str, Layer] = {}
    for layer in real:
        by_name.setdefault(_base(layer.name), layer)
    found: dict[str, tuple[Layer, str]] = {}
    for node in graph.node:
        if node.name in skip:
            continue
        if node.name in by_name:
            found[node.name] = (by_name[node.name], "")
            continue
        for out in node.output:
            hit = next((la for la in real if out and la.name.startswith(out)
                        and la.name[len(out):len(out) + 1] in ("", "_", "-", "#")), None)
            if hit is not None:
                found[node.name] = (hit, f"rewritten by the toolkit as layer {hit.name}")
                break
    producer = {out: n for n in graph.node for out in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)

    def nearest(node: onnx.NodeProto) -> tuple[Layer, str] | None:
        for walk in ("up", "down"):
            seen, frontier = {node.name}, [node]
            while frontier:
                nxt: list[onnx.NodeProto] = []
                for n in frontier:
                    near = ([producer[i] for i in n.input if i in producer] if walk == "up"
                            else [c for o in n.output for c in consumers.get(o, [])])
                    for m in near:
                        if m.name in found:
                            return found[m.name]
                        if m.name not in seen:
                            seen.add(m.name)
                            nxt.append(m)
                frontier = nxt
        return None

    placements: list[Placement] = []
    claimed: set[str] = set()  # layers whose cycles a node already carries
    for node in graph.node:
        if node.name in skip:
            continue
        entry = found.get(node.name)
        own = entry is not None and entry[0].name not in claimed
        if entry is None:
            near = nearest(node)
            if near is None:
                raise TargetError(f"RKNN build of {graph.name or 'the model'}: node "
                                  f"{node.name!r} matches no layer of the toolkit's table")
            entry = (near[0], f"fused by the toolkit into layer {near[0].name}")
        if own:
            claimed.add(entry[0].name)
        placements.append(_placement(node.name, entry[0], log, entry[1], own))
    return tuple(placements)


def cost_of(layers: Sequence[Layer], log: str) -> dict[str, float]:
    """The toolkit's own figures: estimated cycles (sum over layers), DDR/NPU cycles,
    layer counts per unit and the memory sizes it reports."""
    cost: dict[str, float] = {
        "cycles": float(sum(la.cycles for la in layers)),
        "ddr_cycles": float(sum(la.ddr_cycles for la in layers)),
        "npu_cycles": float(sum(la.npu_cycles for la in layers)),
        "rw_kb": float(sum(la.rw_kb for la in layers)),
        "npu_layers": float(sum(la.target.startswith("NPU") for la in layers)),
        "cpu_layers": float(sum(la.target.startswith("CPU") and la.op not in
                                ("InputOperator", "OutputOperator") for la in layers)),
    }
    for kind, value, unit in _MEMORY.findall(log):
        cost[f"{kind.lower()}_memory_bytes"] = float(value) * _UNITS[unit]
    return cost
