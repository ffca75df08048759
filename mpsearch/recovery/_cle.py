"""Cross-layer equalization (Nagel et al., "Data-Free Quantization", ICCV 2019): a pure graph
transformation ``ModelGraph -> ModelGraph``.

Contract
--------
Consumes a normalized :class:`~mpsearch.graph.ModelGraph` (batch norms already folded into the
convolutions, as exporters do); produces a new one whose FP32 outputs equal the input's up to
float rounding, and whose Conv -> (Relu | Clip(0, hi) | nothing) -> Conv chains have equalized
per-channel weight ranges. For each such pair (the first Conv's output and the activation's
output each read by exactly one node, weights and bias used by no other node), output channel
``i`` of the first Conv is divided by ``s_i`` and input channel ``i`` of the second multiplied by
it, with the paper's ``s_i = sqrt(r1_i * r2_i) / r2_i`` (``r`` = max |w| of the channel); this
is exact because Relu is positively homogeneous. Grouped and depthwise Convs (MobileNetV2's
expand -> depthwise -> project blocks) are handled through their group structure. The pairs are
equalized in rounds until the scales settle (a chain shares its middle Conv between two pairs).

Clip(0, hi) (Relu6) is not positively homogeneous: after scaling, channel ``i`` must clip at
``hi / s_i``. ``clip`` chooses what happens:

* ``"exact"``: the Clip's bound becomes the largest per-channel threshold, followed by a
  ``Min`` with the per-channel thresholds (a [C, 1, ...] constant); FP32 outputs are unchanged
  (the first Conv's output is still quantized on a bounded range). The Min runs in float.
* ``"skip"`` (default): pairs through a bounded Clip are left alone; only the pairs where
  scaling is exact as it stands are equalized.
* ``"relu"``: the Clip becomes a Relu, as AIMET and the paper do for MobileNetV2 (Relu6 ->
  Relu); FP32 outputs change wherever an activation exceeded ``hi``.

:func:`equalization_pairs` reports the pairs and, as data, each near-miss with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from onnx import helper, numpy_helper

from mpsearch._names import Namer
from mpsearch.errors import ModelError
from mpsearch.graph import ModelGraph, Node, load_model
from mpsearch.recovery._rewrite import with_weights

__all__ = ["CLIP_POLICIES", "Pair", "Skipped", "equalization_pairs", "equalize"]

logger = logging.getLogger(__name__)

CLIP_POLICIES = ("exact", "skip", "relu")
_ACTIVATIONS = frozenset({"Relu", "Clip"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Pair:
    """Two Convs equalized together, with the Relu/Clip between them (None: nothing)."""

    first: str
    second: str
    activation: str | None
    clip_max: float | None = None  # the Clip's upper bound, when it has one


@dataclass(frozen=True, slots=True, kw_only=True)
class Skipped:
    """A Conv -> ... -> Conv chain that is not equalized, and why."""

    first: str
    second: str
    reason: str


def _bound(graph: ModelGraph, node: Node, index: int) -> float | None:
    """A Clip bound as a float (None when absent); raises ValueError when not a constant."""
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    value = graph.initializers.get(node.inputs[index])
    if value is None or value.size != 1:
        raise ValueError("bound computed at run time")
    return float(value.reshape(()))


def _only_reader(graph: ModelGraph, tensor: str) -> Node | None:
    readers = graph.consumers(tensor)
    if len(readers) != 1 or any(o.name == tensor for o in graph.outputs):
        return None
    return graph.nodes[readers[0]]


def _conv_weight(graph: ModelGraph, node: Node) -> str | None:
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    weight = node.inputs[1]
    array = graph.initializers.get(weight)
    return weight if array is not None and array.dtype == np.float32 else None


def _check_pair(graph: ModelGraph, first: Node, act: Node | None, second: Node,
                clip: str) -> str | None:
    """Why (first, act, second) cannot be equalized, or None when it can."""
    w1, w2 = _conv_weight(graph, first), _conv_weight(graph, second)
    if w2 is None:
        return "the second Conv's weight is not a float initializer"
    assert w1 is not None  # the caller starts from a Conv with a weight
    shared = [t for t in (w1, w2, *first.inputs[2:3]) if t and len(graph.consumers(t)) != 1]
    if shared:
        return f"tensor '{shared[0]}' is read by other nodes too"
    if len(first.inputs) > 2 and first.inputs[2] and first.inputs[2] not in graph.initializers:
        return "the first Conv's bias is not an initializer"
    channels = graph.initializers[w1].shape[0]
    group = int(second.attributes.get("group", 1))
    if graph.initializers[w2].shape[1] * group != channels:
        return "the channel counts of the two Convs do not match"
    if act is not None and act.op_type == "Clip":
        try:
            low, high = _bound(graph, act, 1), _bound(graph, act, 2)
        except ValueError:
            return "the Clip bounds are computed at run time"
        if low != 0.0:
            return f"Clip min is {low}, not 0: scaling would change it per channel"
        if high is not None and clip == "skip":
            return f"Clip max {high} would become per-channel (clip policy 'skip')"
    return None


def equalization_pairs(graph: ModelGraph, *, clip: str = "skip"
                       ) -> tuple[tuple[Pair, ...], tuple[Skipped, ...]]:
    """The Conv pairs :func:`equalize` scales, and the chains it leaves alone with the reason."""
    if clip not in CLIP_POLICIES:
        raise ModelError(f"cross-layer equalization: clip policy '{clip}' is unknown; use one "
                         f"of {', '.join(CLIP_POLICIES)}")
    pairs, skipped = [], []
    for first in graph.nodes.values():
        if _conv_weight(graph, first) is None:
            continue
        reader = _only_reader(graph, first.outputs[0])
        act = None
        if reader is not None and reader.op_type in _ACTIVATIONS and reader.domain == "":
            act, reader = reader, _only_reader(graph, reader.outputs[0])
        if reader is None or reader.op_type != "Conv":
            continue
        if reader.inputs[0] != (act.outputs[0] if act else first.outputs[0]):
            continue  # the chain feeds the second Conv's weight, not its data
        reason = _check_pair(graph, first, act, reader, clip)
        if reason is not None:
            skipped.append(Skipped(first=first.name, second=reader.name, reason=reason))
            continue
        high = _bound(graph, act, 2) if act is not None and act.op_type == "Clip" else None
        pairs.append(Pair(first=first.name, second=reader.name,
                          activation=None if act is None else act.name, clip_max=high))
    return tuple(pairs), tuple(skipped)


def _input_ranges(weight: np.ndarray, group: int) -> np.ndarray:
    """max |w| per input channel of a (grouped) Conv weight [Cout, Cin/group, ...]."""
    cout, cin_g = weight.shape[0], weight.shape[1]
    grouped = np.abs(weight).reshape(group, cout // group, cin_g, -1)
    ranges: np.ndarray = grouped.max(axis=(1, 3)).reshape(-1)
    return ranges


def _scale_inputs(weight: np.ndarray, group: int, s: np.ndarray) -> np.ndarray:
    cout, cin_g = weight.shape[0], weight.shape[1]
    grouped = weight.reshape(group, cout // group, cin_g, -1) * s.reshape(group, 1, cin_g, 1)
    scaled: np.ndarray = grouped.reshape(weight.shape)
    return scaled


def equalize(graph: ModelGraph, *, clip: str = "skip", rounds: int = 20,
             tolerance: float = 1e-4) -> ModelGraph:
    """``graph`` with every pair of :func:`equalization_pairs` equalized (see the module
    docstring for the contract); ``graph`` itself when there is no pair."""
    pairs, skipped = equalization_pairs(graph, clip=clip)
    for skip in skipped:
        logger.debug("CLE skips %s -> %s: %s", skip.first, skip.second, skip.reason)
    if not pairs:
        return graph
    arrays: dict[str, np.ndarray] = {}
    thresholds: dict[str, np.ndarray] = {}

    def array(name: str) -> np.ndarray:
        if name not in arrays:
            arrays[name] = graph.initializers[name].astype(np.float64)
        return arrays[name]

    for _ in range(rounds):
        largest = 0.0
        for pair in pairs:
            first, second = graph.nodes[pair.first], graph.nodes[pair.second]
            w1, w2 = array(first.inputs[1]), array(second.inputs[1])
            group = int(second.attributes.get("group", 1))
            r1 = np.abs(w1).reshape(w1.shape[0], -1).max(axis=1)
            r2 = _input_ranges(w2, group)
            ok = (r1 > 0) & (r2 > 0)
            s = np.where(ok, np.sqrt(np.where(ok, r1 * r2, 1.0)) / np.where(ok, r2, 1.0), 1.0)
            arrays[first.inputs[1]] = w1 / s.reshape(-1, *([1] * (w1.ndim - 1)))
            if len(first.inputs) > 2 and first.inputs[2]:
                arrays[first.inputs[2]] = array(first.inputs[2]) / s
            arrays[second.inputs[1]] = _scale_inputs(w2, group, s)
            if pair.clip_max is not None and pair.activation is not None:
                start = np.full(s.shape, pair.clip_max, np.float64)
                thresholds[pair.activation] = thresholds.get(pair.activation, start) / s
            largest = max(largest, float(np.abs(np.log(s)).max()))
        if largest < tolerance:
            break
    return _rebuild(graph, pairs, arrays, thresholds, clip)


def _rebuild(graph: ModelGraph, pairs: tuple[Pair, ...], arrays: Mapping[str, np.ndarray],
             thresholds: Mapping[str, np.ndarray], clip: str) -> ModelGraph:
    model = with_weights(graph, arrays)
    clips = {p.activation for p in pairs if p.clip_max is not None}
    namer = Namer.of_model(model)
    nodes = []
    for proto in model.graph.node:
        if proto.name not in clips:
            nodes.append(proto)
            continue
        if clip == "relu":
            nodes.append(helper.make_node("Relu", [proto.input[0]], [proto.output[0]],
                                          name=proto.name))
            continue
        limit = thresholds[proto.name].astype(np.float32)
        low, high, per_channel, minimum = (namer.fresh(f"{proto.name}__cle_{n}")
                                           for n in ("lo", "hi", "max", "min"))
        clipped = namer.fresh(f"{proto.output[0]}__cle")
        rank = len(graph.shapes.get(proto.output[0]) or (0, 0, 0, 0))
        model.graph.initializer.extend([
            numpy_helper.from_array(np.array(0.0, np.float32), low),
            numpy_helper.from_array(np.array(limit.max(), np.float32), high),
            numpy_helper.from_array(limit.reshape(-1, *([1] * max(rank - 2, 0))), per_channel)])
        nodes.append(helper.make_node("Clip", [proto.input[0], low, high],
                                      [clipped], name=proto.name))
        nodes.append(helper.make_node("Min", [clipped, per_channel],
                                      [proto.output[0]], name=minimum))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    changed = load_model(model)
    note = (f"cross-layer equalization: {len(pairs)} Conv pairs (clip policy '{clip}', "
            f"{len(clips)} Clips {'made per-channel' if clip == 'exact' else 'made Relu'})")
    return replace(changed, path=graph.path, changes=(*graph.changes, note))
