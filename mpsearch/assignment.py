"""Per-node precision assignments: validation, model size and estimated latency without building.

Consumes a :class:`~mpsearch.graph.ModelGraph`, a :class:`~mpsearch.profiles.HardwareProfile` and
a mapping ``node name -> format name``; produces a validated, complete :class:`Assignment`
(every node gets a format; unassigned nodes take the profile's float format), its model size in
bytes (exactly what the exported QDQ file's initializers hold) and its latency estimated from the
profile's cost model.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from mpsearch._io import load_json
from mpsearch.errors import QuantizationError
from mpsearch.graph import ModelGraph, Node
from mpsearch.profiles import Format, HardwareProfile, TensorFormat
from mpsearch.summary import ModelSummary

__all__ = [
    "Assignment",
    "assignment_key",
    "ActivationSpec",
    "NodePlan",
    "plan_nodes",
    "estimate_latency",
    "latency_unknown_reason",
    "load_assignment",
    "make_assignment",
    "model_size",
    "table_format",
    "uniform_assignment",
    "why_float",
]

_BYTES = {"int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "float32": 4,
          "float16": 2}


def assignment_key(formats: Mapping[str, str]) -> str:
    """The one stable key of a node -> format mapping: a short hash of its sorted items, so
    equal mappings share a key whatever their order (the search's and the measurer's caches,
    and ``cache/measurements.json``, are keyed by it)."""
    text = json.dumps(sorted(formats.items()), separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class Assignment(Mapping[str, str]):
    """A complete node -> format mapping, validated against a graph and a profile."""

    formats: Mapping[str, str]

    def __getitem__(self, node: str) -> str:
        return self.formats[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self.formats)

    def __len__(self) -> int:
        return len(self.formats)

    def key(self) -> str:
        """:func:`assignment_key` of the whole mapping (results are cached by it)."""
        return assignment_key(self.formats)

    def to_dict(self) -> dict[str, str]:
        return dict(self.formats)


@dataclass(frozen=True, slots=True)
class ActivationSpec:
    """How one activation tensor is quantized where a node reads or writes it.

    ``range_of`` names the tensor whose calibrated range sets the scale (the tensor itself, or
    the node's output when the profile makes the node's inputs share one scale); ``fixed`` is
    the (scale, zero_point) a profile imposes. Hashable: equal specs share one Q/DQ pair.
    """

    dtype: str
    symmetric: bool
    scale: str
    range_of: str
    fixed: tuple[float, int] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodePlan:
    """What quantizing one node stores and inserts (shared by the builder and the size)."""

    node: Node
    fmt: Format
    inputs: tuple[tuple[str, ActivationSpec], ...]
    constants: tuple[tuple[str, ActivationSpec], ...]
    weights: tuple[tuple[str, TensorFormat], ...]
    bias: str | None
    outputs: tuple[tuple[str, ActivationSpec], ...]
    clamped_by_q: bool = False  # a Relu/Clip whose input's QuantizeLinear already clamps


def make_assignment(
    graph: ModelGraph, profile: HardwareProfile, formats: Mapping[str, str]
) -> Assignment:
    """Validate ``formats`` (node -> format) and complete it with the float format.

    Raises :class:`QuantizationError` for an unknown node or a format the profile forbids there.
    """
    unknown = [n for n in formats if n not in graph.nodes]
    if unknown:
        hint = difflib.get_close_matches(unknown[0], list(graph.nodes), n=1)
        did_you_mean = f"; did you mean '{hint[0]}'?" if hint else ""
        raise QuantizationError(
            f"assignment names {len(unknown)} node(s) not in {graph.name}: "
            f"'{unknown[0]}'{did_you_mean} (see `mpsearch summary` for node names)"
        )
    complete: dict[str, str] = {}
    for name, node in graph.nodes.items():
        allowed = profile.formats_for_node(node)
        chosen = formats.get(name, profile.default_format)
        if chosen not in allowed:
            raise QuantizationError(
                f"profile '{profile.name}' does not allow format '{chosen}' for {node.op_type} "
                f"node '{name}'; allowed: {', '.join(allowed)}"
            )
        complete[name] = chosen
    return Assignment(MappingProxyType(complete))


def uniform_assignment(graph: ModelGraph, profile: HardwareProfile, fmt: str) -> Assignment:
    """Every node that allows ``fmt`` gets it; the others keep the float format."""
    profile.format(fmt)  # raises a clear error for an unknown format name
    formats = {n.name: fmt for n in graph.nodes.values() if fmt in profile.formats_for_node(n)}
    return make_assignment(graph, profile, formats)


def table_format(graph: ModelGraph, profile: HardwareProfile, fmt: str) -> bool:
    """True when ``fmt`` is another way to store ``graph``'s embedding tables (x86's
    ``int8_rows``), not a precision of the model: only weight-only nodes take it, and a format
    of the same rank is taken by those and more. It has no uniform baseline of its own."""
    def takers(name: str) -> set[str]:
        return {n.name for n in graph.quantizable_nodes() if name in profile.formats_for_node(n)}

    mine = takers(fmt)
    if not mine or not all(graph.nodes[n].weight_only for n in mine):
        return False
    rank = profile.format(fmt).rank
    return any(mine < takers(other) for other, f in profile.formats.items()
               if other != fmt and f.rank == rank)


def why_float(graph: ModelGraph, profile: HardwareProfile) -> dict[str, str]:
    """Node -> why it stays float on ``profile`` whatever the assignment: the graph's reason
    (data movement, no quantized kernel, control flow, ...) or the profile's (no integer format
    for the op). Nodes that some format quantizes are not listed."""
    reasons: dict[str, str] = {}
    for name, node in graph.nodes.items():
        if not node.quantizable:
            reasons[name] = node.reason
        elif all(_float_format(profile.format(f)) for f in profile.formats_for_node(node)):
            reasons[name] = f"profile '{profile.name}' has no integer format for {node.op_type}"
    return reasons


def _float_format(fmt: Format) -> bool:
    return not _is_quantized(fmt)


def load_assignment(
    path: str | os.PathLike[str], graph: ModelGraph, profile: HardwareProfile
) -> Assignment:
    """Read a JSON object ``{node: format}`` (or ``{"assignment": {...}}``) and validate it."""
    fix = 'write it as {"node name": "format"}'
    try:
        data = load_json(path, QuantizationError, fix=fix)
    except FileNotFoundError as e:
        raise QuantizationError(f"{path}: cannot read the assignment JSON (no such file); "
                                f"{fix}") from e
    if isinstance(data, dict) and isinstance(data.get("assignment"), dict):
        data = data["assignment"]
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise QuantizationError(f"{path}: the assignment must be a JSON object mapping node "
                                "names to format names")
    return make_assignment(graph, profile, data)


def _is_quantized(fmt: Format) -> bool:
    return not (fmt.activation.dtype == "float32" and fmt.weight.dtype == "float32")


_CLAMPS = frozenset({"Relu", "Clip"})


def _range_source(graph: ModelGraph, tensor: str) -> str:
    """The tensor whose calibrated range quantizes ``tensor``: the output of the Relu or Clip
    that is its only reader (ORT's quantizer does the same), else the tensor itself.

    Quantizing a Conv output on the Relu's range makes the Q do the clamping: Relu(clip(x)) =
    clip(Relu(x)) on that range, no grid is spent on values the Relu discards, and the
    producer and the Relu share one Q/DQ pair that ORT folds into its integer kernels."""
    readers = graph.consumers(tensor)
    if len(readers) != 1 or any(o.name == tensor for o in graph.outputs):
        return tensor
    reader = graph.nodes[readers[0]]
    if reader.op_type not in _CLAMPS or not reader.quantizable or reader.inputs[0] != tensor:
        return tensor
    return reader.outputs[0]


def _clamped_by_q(
    graph: ModelGraph, node: Node, inputs: Sequence[tuple[str, ActivationSpec]],
    outputs: Sequence[tuple[str, ActivationSpec]],
) -> bool:
    """True when a Relu/Clip needs no kernel: its input is quantized on its own output's range
    with an asymmetric integer grid, whose QuantizeLinear clamps exactly as the op does (the
    grid always contains 0, so this needs Clip bounds min <= 0 <= max). A float16 Cast round
    trip clamps nothing, so float formats always keep the op."""
    if node.op_type not in _CLAMPS or len(inputs) != 1 or len(outputs) != 1:
        return False
    (_, spec_in), (_, spec_out) = inputs[0], outputs[0]
    if spec_in != spec_out or spec_in.symmetric or _float(spec_in):
        return False
    names = [t for t in node.inputs[1:3] if t]
    if any(t not in graph.initializers or graph.initializers[t].size != 1 for t in names):
        return False  # bounds computed at run time
    bounds = [graph.initializers[t] for t in names]
    low = float(bounds[0]) if len(bounds) > 0 and node.inputs[1] else -np.inf
    high = float(bounds[-1]) if len(node.inputs) > 2 and node.inputs[2] else np.inf
    return low <= 0.0 <= high


def plan_nodes(
    graph: ModelGraph, profile: HardwareProfile, assignment: Mapping[str, str]
) -> tuple[NodePlan, ...]:
    """The quantized nodes of ``assignment`` in topological order, with what each stores.

    A format the profile says ``runs_as`` another is planned as that one (fp32 as fp16 on the
    HTP), so the model built, scored and sized is what the target computes."""
    plans = []
    for node in graph.nodes.values():
        fmt = profile.format(profile.computed_as(
            assignment.get(node.name, profile.default_format)))
        if not node.quantizable or not _is_quantized(fmt):
            continue
        rule = profile.op_rule(node.op_type)
        act = fmt.activation
        shared = rule is not None and rule.same_input_scale and bool(node.outputs)
        inputs, constants = [], []
        # float32 activations with stored-smaller weights (fp16 weights): a weight-only format
        weight_only = node.weight_only or act.dtype == "float32"
        for tensor in node.activation_inputs if act.dtype != "float32" else ():
            source = node.outputs[0] if shared else _range_source(graph, tensor)
            spec = ActivationSpec(act.dtype, act.symmetric, act.scale, source)
            if tensor in graph.initializers:
                if graph.initializers[tensor].dtype == np.float32:
                    constants.append((tensor, spec))
            elif graph.is_float(tensor):
                inputs.append((tensor, spec))
        fixed = profile.fixed_qparams(node.op_type, fmt.name)
        outputs = () if weight_only else tuple(  # a weight-only output stays float
            (t, ActivationSpec(act.dtype, act.symmetric, act.scale,
                               t if fixed else _range_source(graph, t), fixed))
            for t in node.outputs if t and graph.is_float(t)
        )
        weight_fmt = profile.weight_format(node.op_type, fmt.name)
        clamped = _clamped_by_q(graph, node, inputs, outputs)
        plans.append(NodePlan(
            node=node, fmt=fmt, inputs=tuple(inputs), constants=tuple(constants),
            weights=tuple((w, weight_fmt) for w in node.weights),
            bias=node.bias if fmt.bias == "int32" and node.weights else None,
            outputs=() if clamped else outputs, clamped_by_q=clamped,
        ))
    return tuple(plans)


def weight_channels(
    graph: ModelGraph, profile: HardwareProfile, node: Node, weight: str, fmt: TensorFormat
) -> tuple[int, int | None]:
    """(number of scales, axis or None) used to store ``weight`` of ``node`` in ``fmt``."""
    array = graph.initializers[weight]
    if fmt.is_float or fmt.granularity != "per_channel" or array.ndim < 2:
        return 1, None
    axis = fmt.axis if fmt.axis is not None else profile.weight_axis(
        node.op_type, node.attributes, weight_rank=array.ndim)
    axis %= array.ndim
    return int(array.shape[axis]), axis


#: Ops whose float weight ONNX Runtime quantizes to per-tensor int8 when their first input comes
#: from a DequantizeLinear with one scale (its ``WeightBiasQuantization`` optimization, at the
#: basic level, so in every session with optimizations on).
WEIGHT_QUANTIZED_AFTER_DQ = frozenset({"Conv", "ConvTranspose", "Gemm"})
#: Ops ONNX Runtime moves a per-tensor DequantizeLinear across (QDQ propagation): their output
#: carries their first input's values on the same grid.
GRID_PRESERVING = frozenset({"MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice"})


def float_weight_channels(graph: ModelGraph, node: Node,
                          plan: NodePlan | None = None) -> tuple[int, int] | None:
    """(axis, size) of the first input's channel axis of a float Conv, ConvTranspose or Gemm
    with a float initializer weight, unplanned or ``plan``-ned in a format that reads float32
    activations as they are (fp16w: its float16 weight is a Cast that ONNX Runtime folds into a
    float initializer at load): where such a node reads a quantized tensor (directly or through
    :data:`GRID_PRESERVING` ops), the QDQ model gives it a DequantizeLinear with the scale
    repeated along that axis, so ONNX Runtime leaves its weight float (see
    :data:`WEIGHT_QUANTIZED_AFTER_DQ`). None for any other node."""
    if (node.op_type not in WEIGHT_QUANTIZED_AFTER_DQ or node.domain not in ("", "ai.onnx")
            or len(node.inputs) < 2
            or (plan is not None and plan.fmt.activation.dtype != "float32")):
        return None
    weight = graph.initializers.get(node.inputs[1])
    if weight is None or weight.dtype != np.float32 or weight.ndim < 2:
        return None
    attrs = node.attributes
    if node.op_type == "Conv":
        return 1, int(weight.shape[1]) * int(attrs.get("group", 1))
    if node.op_type == "ConvTranspose":
        return 1, int(weight.shape[0])
    k = int(weight.shape[1] if attrs.get("transB", 0) else weight.shape[0])
    return (0 if attrs.get("transA", 0) else 1), k


def model_size(graph: ModelGraph, profile: HardwareProfile, assignment: Mapping[str, str]) -> int:
    """Bytes of the initializers of the QDQ model ``assignment`` builds (without building it)."""
    plans = plan_nodes(graph, profile, assignment)
    planned = {p.node.name: p for p in plans}
    stored: dict[object, int] = {}
    carried: dict[str, ActivationSpec] = {}  # tensor -> the grid every reader sees it on
    float_used: set[str] = set()
    for node in graph.nodes.values():
        plan = planned.get(node.name)
        replaced: set[str] = set()
        if (per_axis := float_weight_channels(graph, node, plan)) is not None:
            read = carried.get(node.inputs[0])
            if read is not None and not _float(read):  # its own per-axis DequantizeLinear
                stored[(node.inputs[0], read, per_axis[0])] = per_axis[1] * (
                    4 + _BYTES[read.dtype])
        if plan is not None:
            per_tensor = False  # a per-tensor weight's bias has one scale and zero point
            for weight, fmt in plan.weights:
                channels, axis = weight_channels(graph, profile, node, weight, fmt)
                size = graph.initializers[weight].size * _BYTES[fmt.dtype]
                extra = 0 if fmt.is_float else channels * (4 + _BYTES[fmt.dtype])
                stored[(weight, fmt, axis)] = size + extra
                per_tensor = axis is None and not fmt.is_float
            for tensor, spec in plan.constants:
                size = graph.initializers[tensor].size * _BYTES[spec.dtype]
                stored[(tensor, spec)] = size + (0 if _float(spec) else 4 + _BYTES[spec.dtype])
            if plan.bias is not None:
                count = graph.initializers[plan.bias].size
                stored[(plan.bias, node.name)] = count * 4 + (8 if per_tensor else count * 8)
            for tensor, spec in (*plan.inputs, *plan.outputs):
                if carried.get(tensor) != spec:  # a clamped Relu's output needs no new Q/DQ
                    stored[(tensor, spec)] = 0 if _float(spec) else 4 + _BYTES[spec.dtype]
            if plan.clamped_by_q:
                carried[node.outputs[0]] = plan.inputs[0][1]
            carried.update(plan.outputs)
            replaced = {w for w, _ in plan.weights} | {t for t, _ in plan.constants}
            replaced |= {plan.bias} if plan.bias else set()
            if plan.clamped_by_q:  # an Identity replaces it: its Clip bounds are not stored
                replaced |= set(node.inputs[1:])
        elif (node.op_type in GRID_PRESERVING and node.domain in ("", "ai.onnx") and node.inputs
              and node.inputs[0] in carried):
            carried[node.outputs[0]] = carried[node.inputs[0]]
        float_used.update(t for t in node.inputs if t in graph.initializers and t not in replaced)
    floats = sum(int(graph.initializers[t].nbytes) for t in float_used)
    return floats + sum(stored.values())


def _float(spec: ActivationSpec) -> bool:
    return spec.dtype.startswith("float")


def latency_unknown_reason(
    profile: HardwareProfile, op_types: Iterable[str] | None = None
) -> str | None:
    """Why :func:`estimate_latency` cannot rank assignments under ``profile``, or None.

    A format whose ``relative_cost`` is unknown makes the estimate None for every assignment
    that uses it (the default format is used by every node), so a latency objective would fail
    every trial. With ``op_types`` (the model's), an op rule overriding an allowed format's
    cost with unknown counts too.
    """
    unknown = [name for name, fmt in profile.formats.items() if fmt.relative_cost is None]
    for op in sorted(set(op_types or ())):
        rule = profile.op_rule(op)
        unknown += [f"{name} on {op}" for name, cost in (rule.cost.items() if rule else ())
                    if cost is None and name not in unknown and name in profile.formats_for(op)]
    if not unknown:
        return None
    return (f"profile '{profile.name}' has no known relative_cost for {', '.join(unknown)}, so "
            "latency cannot be estimated; drop 'latency' from objectives, or set relative_cost "
            f"(measured on the target) in a profile with 'extends: {profile.name}'")


def estimate_latency(
    graph: ModelGraph,
    summary: ModelSummary,
    profile: HardwareProfile,
    assignment: Mapping[str, str],
) -> float | None:
    """Relative latency from the profile's cost model: sum of FLOPs x format cost, plus a cost
    per precision transition between a producer and a consumer. None where a figure is unknown.
    """
    flops = {row.name: max(row.flops, 1) for row in summary.nodes}
    total = 0.0
    for node in graph.nodes.values():
        name = assignment.get(node.name, profile.default_format)
        cost = profile.relative_cost(node.op_type, name, float(flops.get(node.name, 1)))
        if cost is None:
            return None
        total += cost
    transition = profile.transition_cost
    if transition:
        for node in graph.nodes.values():
            mine = assignment.get(node.name, profile.default_format)
            for tensor in node.outputs:
                for consumer in graph.consumers(tensor):
                    if assignment.get(consumer, profile.default_format) != mine:
                        total += transition * float(np.prod(_known(graph.shapes.get(tensor))))
    return total


def _known(shape: tuple[int | str | None, ...] | None) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d > 0 else 1 for d in (shape or ()))
