"""(ModelGraph, CalibrationTable, HardwareProfile, Assignment) -> QDQ ONNX ``ModelProto``.

A pure graph edit over the saved calibration table, never a re-calibration:

* weights are stored quantized (int8/int16 initializers followed by DequantizeLinear),
  per-channel where the format allows it; biases as int32 with scale = input x weight scale;
* a quantized node's activation inputs get QuantizeLinear/DequantizeLinear at its format, and its
  outputs too, so every consumer reads what the target produces; a consumer in another format
  re-quantizes (INT8 -> FP32 reads the INT8 values; INT8 -> INT16 gets its own Q/DQ);
* 16-bit Q/DQ uses the standard ops at opset >= 21, otherwise the ``com.microsoft`` ones;
  float16 formats are emulated with Cast round trips and float16-stored weights.

:class:`Quantizer` caches the quantized weights across assignments, so the search pays for each
(weight, format) once; :func:`build_qdq` is the one-shot form.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mpsearch import kernels
from mpsearch._names import Namer
from mpsearch.assignment import (
    GRID_PRESERVING,
    ActivationSpec,
    NodePlan,
    float_weight_channels,
    plan_nodes,
    weight_channels,
)
from mpsearch.graph import ModelGraph, Node
from mpsearch.profiles import HardwareProfile, TensorFormat

if TYPE_CHECKING:
    from mpsearch.calibration import CalibrationTable

__all__ = ["Quantizer", "build_qdq", "code_range", "qparams"]

logger = logging.getLogger(__name__)

_NP = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16}
#: Short dtype codes in the names of stored and Q/DQ tensors.
_CODE = {"int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16", "int32": "i32",
         "float16": "f16", "bfloat16": "bf16"}
_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}
_MS_DOMAIN = "com.microsoft"


#: Headroom over the int32 bias range when raising a weight scale (ONNX Runtime uses 1.0001).
_BIAS_MARGIN = 1.0001


def qparams(
    lo: np.ndarray | float, hi: np.ndarray | float, dtype: str, *, symmetric: bool,
    scale_form: str = "float", narrow_range: bool = False, reduce_range: bool = False,
    min_scale: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Scale (float32) and zero point (``dtype``) mapping [lo, hi] onto the integer grid.

    The range is widened to contain 0 (ONNX Runtime's rule). Symmetric signed grids put zero at
    0 and use [-qmax, qmax]; symmetric unsigned grids put it at the midpoint. ``reduce_range``
    halves the range as ONNX Runtime's quantizer does (int8 in [-64, 64], uint8 in [0, 127]);
    ``narrow_range`` then has nothing to drop. ``min_scale`` raises the scale where it is
    smaller (a weight whose int32 bias would not fit otherwise).
    """
    qmin, qmax = code_range(dtype, narrow_range=narrow_range, reduce_range=reduce_range)
    lo = np.minimum(np.asarray(lo, dtype=np.float64), 0.0)
    hi = np.maximum(np.asarray(hi, dtype=np.float64), 0.0)
    if symmetric:
        absmax = np.maximum(-lo, hi)
        if qmin < 0:
            scale = absmax / qmax
            zero = np.zeros_like(scale)
        else:
            scale = 2 * absmax / (qmax - qmin)
            zero = np.full_like(scale, (qmax + qmin + 1) // 2)
    else:
        scale = (hi - lo) / (qmax - qmin)
        zero = None
    scale = np.where(scale > 0, scale, 1.0)
    if min_scale is not None:
        scale = np.maximum(scale, min_scale)
    if scale_form == "pow2":
        scale = np.exp2(np.ceil(np.log2(scale)))
    if zero is None:
        zero = np.clip(np.round(qmin - lo / scale), qmin, qmax)
    return scale.astype(np.float32), zero.astype(_NP[dtype])


def code_range(dtype: str, *, narrow_range: bool = False, reduce_range: bool = False
               ) -> tuple[int, int]:
    """(qmin, qmax) of a grid of ``dtype``: :func:`reduced_range` when ``reduce_range``, else
    the type's range without its most negative code when ``narrow_range``."""
    qmin, qmax = reduced_range(dtype) if reduce_range else _RANGE[dtype]
    if narrow_range and qmin < 0 and not reduce_range:
        qmin += 1
    return qmin, qmax


def reduced_range(dtype: str) -> tuple[int, int]:
    """ONNX Runtime's reduced integer range (``quant_utils.ONNX_INT_TYPE_REDUCED_RANGE``):
    signed types keep one bit free on each side, symmetric around 0 (int8: [-64, 64], so a pair
    of u8 x s8 products, 2 * 255 * 64 = 32640, fits VPMADDUBSW's int16), unsigned ones drop the
    top bit (uint8: [0, 127])."""
    qmin, qmax = _RANGE[dtype]
    return (qmin // 2, -(qmin // 2)) if qmin < 0 else (0, qmax // 2)


def _quantize_array(
    array: np.ndarray, scale: np.ndarray, zero: np.ndarray, dtype: str, axis: int | None
) -> np.ndarray:
    qmin, qmax = _RANGE[dtype]
    if array.dtype == np.float32 and scale.dtype == np.float32 and array.size >= _KERNEL_SIZE:
        # the same arithmetic in one parallel pass, without four temporaries of the weight
        return kernels.quantize_codes(array, scale, zero, axis, qmin, qmax, _NP[dtype])
    if axis is not None:
        shape = [1] * array.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    codes = np.round(array / scale) + zero.astype(np.float64)
    clipped: np.ndarray = np.clip(codes, qmin, qmax).astype(_NP[dtype])
    return clipped


#: Weights of at least this many elements are rounded by :func:`mpsearch.kernels.quantize_codes`
#: (below it NumPy is as fast).
_KERNEL_SIZE = 1 << 16


@dataclass(frozen=True, slots=True)
class _Stored:
    """Initializers and one dequantizing node that turn a stored tensor back into float."""

    output: str
    initializers: tuple[TensorProto, ...]
    node: onnx.NodeProto
    scale: np.ndarray


class Quantizer:
    """Builds QDQ models for many assignments of one (graph, table, profile), caching weights."""

    def __init__(
        self, graph: ModelGraph, table: CalibrationTable, profile: HardwareProfile,
        *, method: str | None = None,
    ) -> None:
        self.graph = graph
        self.table = table
        self.profile = profile
        self.method = method
        self._weights: dict[tuple[object, ...], _Stored] = {}
        self._constants: dict[tuple[str, ActivationSpec], _Stored] = {}
        #: Every name of the model and of the stored tensors made so far; a build's own names
        #: live in a child (:attr:`_build_names` while it runs), so none is ever used twice.
        self._names = Namer.of_model(graph.model)
        self._build_names: Namer | None = None
        self._ranges: dict[tuple[str, int, bool], tuple[float, float]] = {}
        self._ms_16bit = graph.opset < 21
        #: Tensors whose name must survive a build: graph outputs and outer-scope names read
        #: inside subgraphs (a clamping op's output is otherwise replaced by its input's DQ).
        self._pinned = frozenset(o.name for o in graph.outputs) | _read_in_subgraphs(
            graph.model.graph)

    # -- parameters -----------------------------------------------------------------------
    def activation_qparams(self, tensor: str, spec: ActivationSpec) -> tuple[float, int]:
        """(scale, zero point) of ``tensor`` quantized as ``spec``."""
        if spec.fixed is not None:
            return float(spec.fixed[0]), int(spec.fixed[1])
        bits = 16 if "16" in spec.dtype else 8
        key = (spec.range_of, bits, spec.symmetric)
        if key not in self._ranges:
            self._ranges[key] = self.table.range(
                spec.range_of, bits=bits, symmetric=spec.symmetric, method=self.method)
        lo, hi = self._ranges[key]
        scale, zero = qparams(lo, hi, spec.dtype, symmetric=spec.symmetric,
                              scale_form=spec.scale)
        return float(scale), int(zero)

    def _domain(self, dtype: str) -> str:
        return _MS_DOMAIN if self._ms_16bit and "16" in dtype else ""

    # -- stored tensors -------------------------------------------------------------------
    def _weight(self, node: Node, weight: str, fmt: TensorFormat,
                min_scale: np.ndarray | None = None) -> _Stored:
        channels, axis = weight_channels(self.graph, self.profile, node, weight, fmt)
        key: tuple[object, ...] = (weight, fmt, axis)  # a table read along two axes: two copies
        if min_scale is not None:  # this node's own copy, scaled so its bias fits int32
            key = (weight, fmt, node.name, min_scale.tobytes())
        if key in self._weights:
            return self._weights[key]
        array = self.graph.initializers[weight]
        if fmt.is_float:
            stored = self._cast_stored(weight, array, fmt.dtype)
        else:
            if axis is None:
                lo, hi = np.array([array.min()]), np.array([array.max()])
            else:
                moved = np.moveaxis(array, axis, 0).reshape(channels, -1)
                lo, hi = moved.min(axis=1), moved.max(axis=1)
            scale, zero = qparams(lo, hi, fmt.dtype, symmetric=fmt.symmetric,
                                  scale_form=fmt.scale, narrow_range=fmt.narrow_range,
                                  reduce_range=fmt.reduce_range, min_scale=min_scale)
            if axis is None:
                scale, zero = scale.reshape(()), zero.reshape(())
            codes = self._weight_codes(node, array, scale, zero, fmt, axis)
            name = f"{weight}__{_CODE[fmt.dtype]}{'' if axis is None else f'c{axis}'}"
            if min_scale is not None:
                name = f"{name}__{node.name}"
            stored = self._dequantized(name, codes, scale, zero, axis, fmt.dtype)
        self._weights[key] = stored
        return stored

    def _weight_codes(self, node: Node, array: np.ndarray, scale: np.ndarray, zero: np.ndarray,
                      fmt: TensorFormat, axis: int | None) -> np.ndarray:
        """``node``'s weight ``array`` on the grid (``scale``, ``zero`` along ``axis``), as
        ``fmt.dtype`` codes: rounded to nearest here; a subclass may round otherwise on the
        same grid (:class:`~mpsearch.recovery.CorrectedQuantizer`)."""
        return _quantize_array(array, scale, zero, fmt.dtype, axis)

    def _fresh(self, want: str, suffixes: tuple[str, ...], *, cached: bool = True) -> str:
        """A stem for a stored tensor's names: ``want``, or ``want_2``, ``want_3``... when the
        model, another stored tensor (two formats with the same weight dtype and axis but other
        grid settings) or the running build has one of stem + ``suffixes``. A tensor made anew
        by each build (not ``cached``, a bias) takes its names in the build's namer."""
        if not cached and self._build_names is not None:
            return self._build_names.fresh(want, suffixes)
        return self._names.fresh(want, suffixes, avoid=self._build_names)

    def _constant(self, tensor: str, spec: ActivationSpec) -> _Stored:
        key = (tensor, spec)
        if key not in self._constants:
            array = self.graph.initializers[tensor]
            if spec.dtype.startswith("float"):
                self._constants[key] = self._cast_stored(tensor, array, spec.dtype)
            else:
                scale, zero = qparams(array.min(), array.max(), spec.dtype,
                                      symmetric=spec.symmetric, scale_form=spec.scale)
                codes = _quantize_array(array, scale, zero, spec.dtype, None)
                self._constants[key] = self._dequantized(
                    f"{tensor}__{_CODE[spec.dtype]}k", codes, scale, zero, None, spec.dtype)
        return self._constants[key]

    def _weight_for_bias(self, node: Node, weight: str, fmt: TensorFormat, bias: str,
                         input_scale: float) -> _Stored:
        """The weight, its scale raised where input x weight scale would be too small for the
        int32 bias (|bias| / scale > 2**31 - 1 would clip it), as ONNX Runtime and TFLite do:
        the rounding of that channel's (tiny) weights coarsens instead of the bias saturating."""
        stored = self._weight(node, weight, fmt)
        if fmt.is_float:
            return stored
        need = np.abs(self.graph.initializers[bias].astype(np.float64)).reshape(-1)
        need = _BIAS_MARGIN * need / (input_scale * float(np.iinfo(np.int32).max))
        if stored.scale.ndim == 0 or need.size != stored.scale.size:
            need = np.asarray(need.max(initial=0.0))
        floor = need.reshape(stored.scale.shape)
        if not np.any(stored.scale.astype(np.float64) < floor):
            return stored
        return self._weight(node, weight, fmt, min_scale=np.maximum(stored.scale, floor))

    def _bias(self, node: Node, bias: str, input_scale: float, weight: _Stored) -> _Stored:
        array = self.graph.initializers[bias].astype(np.float64)
        scale = (input_scale * weight.scale.astype(np.float64)).reshape(-1)
        # a per-tensor weight gets a per-tensor bias: the QNN HTP backend misreads a per-axis
        # bias beside a per-tensor weight (the demo's Gemm: 0.087 on the emulator vs 0.984)
        axis: int | None = None if weight.scale.ndim == 0 else 0
        scale = (scale.reshape(()) if axis is None
                 else np.broadcast_to(scale, array.shape)).astype(np.float32)
        scale = np.where(scale > 0, scale, np.float32(1.0))
        codes = np.clip(np.round(array / scale), -(2**31), 2**31 - 1).astype(np.int32)
        zero = np.zeros(scale.shape, dtype=np.int32)
        # one reader (the usual case): the bias's name is enough; a shared bias gets one
        # copy per node, each on its node's input x weight scale
        owner = "" if len(self.graph.consumers(bias)) == 1 else f"__{node.name}"
        return self._dequantized(f"{bias}{owner}__i32", codes, scale, zero, axis, "int32",
                                 cached=False)

    def _dequantized(
        self, name: str, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray,
        axis: int | None, dtype: str, *, cached: bool = True,
    ) -> _Stored:
        name = self._fresh(name, ("_q", "_scale", "_zero", "_dq", "_DQ"), cached=cached)
        inits = (numpy_helper.from_array(codes, f"{name}_q"),
                 numpy_helper.from_array(np.asarray(scale, np.float32), f"{name}_scale"),
                 numpy_helper.from_array(np.asarray(zero), f"{name}_zero"))
        attrs: dict[str, Any] = {"axis": axis} if axis is not None else {}
        node = helper.make_node("DequantizeLinear", [i.name for i in inits], [f"{name}_dq"],
                                name=f"{name}_DQ", domain=self._domain(dtype), **attrs)
        return _Stored(f"{name}_dq", inits, node, np.asarray(scale, np.float32))

    def _cast_stored(self, name: str, array: np.ndarray, dtype: str) -> _Stored:
        stem = self._fresh(f"{name}__f16", ("", "_f32", "_Cast"))
        half = numpy_helper.from_array(array.astype(np.float16), stem)
        node = helper.make_node("Cast", [half.name], [f"{stem}_f32"],
                                name=f"{stem}_Cast", to=TensorProto.FLOAT)
        return _Stored(f"{stem}_f32", (half,), node, np.ones(1, np.float32))

    # -- the build ------------------------------------------------------------------------
    def build(self, assignment: Mapping[str, str], *,
              stand_ins: Mapping[str, TensorProto] | None = None) -> onnx.ModelProto:
        """The QDQ model of ``assignment`` (node -> format; unlisted nodes stay float).

        ``stand_ins`` replace the graph's float initializers the build keeps unchanged, by
        name (external-data references to a file holding the same bytes:
        :attr:`mpsearch.runtime.SharedWeights.stand_ins`), so a configuration that leaves
        most weights float does not copy them; the model then loads only with that file."""
        plans = plan_nodes(self.graph, self.profile, assignment)
        build = _Build(self, plans)
        self._build_names = build.names
        try:
            return build.model(stand_ins or {})
        finally:
            self._build_names = None


class _Build:
    """One assignment's graph edit (state local to a single build)."""

    def __init__(self, quantizer: Quantizer, plans: tuple[NodePlan, ...]) -> None:
        self.q = quantizer
        self.plans = {p.node.name: p for p in plans}
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, TensorProto] = {}
        self.carries: dict[str, ActivationSpec] = {}  # tensor -> the spec its values are on
        self.qdq: dict[tuple[str, ActivationSpec], str] = {}
        self.emitted: set[str] = set()
        self.aliases: dict[str, str] = {}  # a dropped clamping op's output -> its input's DQ
        self.tags: dict[str, list[str]] = {}  # tensor -> the tags of its Q/DQ pairs so far
        self.uses_ms = False
        self.names = quantizer._names.child()  # this build's names, apart from the cached ones

    def model(self, stand_ins: Mapping[str, TensorProto]) -> onnx.ModelProto:
        graph = self.q.graph
        for name in graph.order:
            proto = graph.proto(name)
            plan = self.plans.get(name)
            if plan is None:
                self.nodes.append(proto)
            else:
                self._quantized(proto, plan)
        self._resolve_aliases()
        self._float_weights_read_per_axis()
        used = {t for n in self.nodes for t in n.input}
        for init in graph.model.graph.initializer:
            if init.name in used and init.name not in self.inits:
                self.inits[init.name] = stand_ins.get(init.name, init)
        return self._assemble(used)

    def _tag(self, tensor: str, spec: ActivationSpec) -> str:
        """A short name part for ``tensor`` on ``spec`` (``u8``, ``i16s``, ``u8p2``), with a
        counter when the tensor already has a pair of that kind on another range."""
        base = _CODE[spec.dtype] + ("s" if spec.symmetric else "") + (
            "p2" if spec.scale == "pow2" else "") + ("fx" if spec.fixed is not None else "")
        taken = self.tags.setdefault(tensor, [])
        tag = base if base not in taken else f"{base}_{len(taken)}"  # len only grows: unique
        taken.append(tag)
        return tag

    def _resolve_aliases(self) -> None:
        """Point every reader of a dropped clamping op's output at the DQ before it (nodes of
        the source graph are copied, not edited)."""
        if not self.aliases:
            return

        def resolve(name: str) -> str:
            while name in self.aliases:
                name = self.aliases[name]
            return name

        for i, node in enumerate(self.nodes):
            if any(t in self.aliases for t in node.input):
                edited = onnx.NodeProto()
                edited.CopyFrom(node)
                edited.input[:] = [resolve(t) for t in node.input]
                self.nodes[i] = edited

    def _float_weights_read_per_axis(self) -> None:
        """A float Conv, ConvTranspose or Gemm (unplanned, or in a float format: float16-stored
        weights are a Cast ONNX Runtime folds to a float initializer at load) that reads a
        quantized tensor, directly or through ops ONNX Runtime moves DequantizeLinear across,
        reads it through its own DequantizeLinear with the scale and zero point repeated along
        the channel axis (the same values; a Q/DQ pair of them where data movement comes
        between, exact as the values are on that grid): ONNX Runtime would otherwise quantize
        its float weight to per-tensor int8
        (:data:`~mpsearch.assignment.WEIGHT_QUANTIZED_AFTER_DQ`)."""
        graph = self.q.graph
        producers = {o: n for n in self.nodes for o in n.output}
        made: dict[tuple[str, int], str] = {}
        out: list[onnx.NodeProto] = []
        for proto in self.nodes:
            node = graph.nodes.get(proto.name)
            channels = None if node is None else float_weight_channels(
                graph, node, self.plans.get(proto.name))
            dq = None if channels is None else self._grid_source(proto.input[0], producers)
            if channels is None or dq is None:
                out.append(proto)
                continue
            axis, size = channels
            key = (proto.input[0], axis)
            if key not in made:
                direct = producers.get(proto.input[0]) is dq
                made[key] = self._per_axis(proto.input[0], dq, direct, axis, size, out)
            edited = onnx.NodeProto()
            edited.CopyFrom(proto)
            edited.input[0] = made[key]
            out.append(edited)
        self.nodes = out

    def _grid_source(self, tensor: str, producers: Mapping[str, onnx.NodeProto]
                     ) -> onnx.NodeProto | None:
        """The per-tensor DequantizeLinear whose values ``tensor`` is (itself, or through
        :data:`~mpsearch.assignment.GRID_PRESERVING` ops), else None."""
        node = producers.get(tensor)
        while (node is not None and node.op_type in GRID_PRESERVING
               and node.domain in ("", "ai.onnx")):
            node = producers.get(node.input[0])
        if node is None or node.op_type != "DequantizeLinear":
            return None
        scale = self.inits.get(node.input[1])
        return node if scale is not None and int(np.prod(scale.dims)) == 1 else None

    def _per_axis(self, tensor: str, dq: onnx.NodeProto, direct: bool, axis: int, size: int,
                  out: list[onnx.NodeProto]) -> str:
        """``tensor`` read through a DequantizeLinear of ``dq``'s scale and zero point repeated
        ``size`` times along ``axis`` (after a QuantizeLinear of the same, unless ``tensor``
        is ``dq``'s own output: ``direct``); appends the nodes to ``out``, returns the name
        read."""
        params = []
        read = self.names.fresh(f"{tensor}_a{axis}", ("", "_scale", "_zero", "_DQ") + (
            () if direct else ("_q", "_Q")))  # one per (tensor, axis): sizes may differ
        for source, part in zip(dq.input[1:3], ("scale", "zero"), strict=False):
            name = f"{read}_{part}"
            value = numpy_helper.to_array(self.inits[source]).reshape(-1)[0]
            self.inits[name] = numpy_helper.from_array(np.full(size, value), name)
            params.append(name)
        codes = dq.input[0]
        if not direct:
            codes = f"{read}_q"
            out.append(helper.make_node("QuantizeLinear", [tensor, *params], [codes],
                                        name=f"{read}_Q", axis=axis, domain=dq.domain))
        out.append(helper.make_node("DequantizeLinear", [codes, *params], [read],
                                    name=f"{read}_DQ", axis=axis, domain=dq.domain))
        return read

    def _emit_stored(self, stored: _Stored) -> str:
        if stored.node.name not in self.emitted:
            self.emitted.add(stored.node.name)
            self.nodes.append(stored.node)
            self.uses_ms |= stored.node.domain == _MS_DOMAIN
            for init in stored.initializers:
                self.inits[init.name] = init
        return stored.output

    def _qdq(self, tensor: str, spec: ActivationSpec, source: str | None = None) -> str:
        """Name of ``tensor`` on the grid of ``spec`` (Q/DQ inserted once per tensor and spec)."""
        if self.carries.get(tensor) == spec and source is None:
            return tensor
        key = (tensor, spec)
        if key in self.qdq:
            return self.qdq[key]
        is_float = spec.dtype.startswith("float")
        stem = self.names.fresh(f"{tensor}__{self._tag(tensor, spec)}", (
            () if source is not None else ("",)) + (
            ("_h", "_Cast16", "_Cast32") if is_float else ("_scale", "_zero", "_q", "_Q", "_DQ")))
        out = tensor if source is not None else stem
        src = source or tensor
        if is_float:
            self.nodes.append(helper.make_node("Cast", [src], [f"{stem}_h"],
                                               name=f"{stem}_Cast16", to=TensorProto.FLOAT16))
            self.nodes.append(helper.make_node("Cast", [f"{stem}_h"], [out],
                                               name=f"{stem}_Cast32", to=TensorProto.FLOAT))
        else:
            scale, zero = self.q.activation_qparams(tensor, spec)
            names = (f"{stem}_scale", f"{stem}_zero")
            self.inits[names[0]] = numpy_helper.from_array(np.array(scale, np.float32), names[0])
            self.inits[names[1]] = numpy_helper.from_array(
                np.array(zero, dtype=_NP[spec.dtype]), names[1])
            domain = self.q._domain(spec.dtype)
            self.uses_ms |= domain == _MS_DOMAIN
            self.nodes.append(helper.make_node(
                "QuantizeLinear", [src, *names], [f"{stem}_q"], name=f"{stem}_Q", domain=domain))
            self.nodes.append(helper.make_node(
                "DequantizeLinear", [f"{stem}_q", *names], [out], name=f"{stem}_DQ",
                domain=domain))
        self.qdq[key] = out
        return out

    def _quantized(self, proto: onnx.NodeProto, plan: NodePlan) -> None:
        replace: dict[str, str] = {}
        for tensor, spec in plan.inputs:
            replace[tensor] = self._qdq(tensor, spec)
        if plan.clamped_by_q:  # the input's Q already clamps: readers take the DQ instead
            (tensor, spec), output = plan.inputs[0], proto.output[0]
            if output in self.q._pinned:
                self.nodes.append(helper.make_node(
                    "Identity", [replace[tensor]], [output],
                    name=self.names.fresh(f"{proto.name}__clamped_by_q")))
            else:
                self.aliases[output] = replace[tensor]
            self.carries[output] = spec
            return
        for tensor, spec in plan.constants:
            replace[tensor] = self._emit_stored(self.q._constant(tensor, spec))
        weight_store = None
        bias = plan.bias if plan.inputs else None  # its scale needs the input's
        scale = self.q.activation_qparams(*plan.inputs[0])[0] if bias is not None else 0.0
        for weight, fmt in plan.weights:
            if bias is not None:
                weight_store = self.q._weight_for_bias(plan.node, weight, fmt, bias, scale)
            else:
                weight_store = self.q._weight(plan.node, weight, fmt)
            replace[weight] = self._emit_stored(weight_store)
        if bias is not None and weight_store is not None:
            replace[bias] = self._emit_stored(self.q._bias(plan.node, bias, scale, weight_store))
        raw = {t: self.names.fresh(f"{t}__raw") for t, _ in plan.outputs}
        node = onnx.NodeProto()
        node.CopyFrom(proto)
        node.input[:] = [replace.get(t, t) for t in proto.input]
        node.output[:] = [raw.get(t, t) for t in proto.output]
        self.nodes.append(node)
        for tensor, spec in plan.outputs:
            self._qdq(tensor, spec, source=raw[tensor])
            self.carries[tensor] = spec

    def _assemble(self, used: set[str]) -> onnx.ModelProto:
        source = self.q.graph.model
        graph = helper.make_graph(
            self.nodes, source.graph.name or "mpsearch", list(source.graph.input),
            list(source.graph.output), initializer=list(self.inits.values()),
        )
        opsets = {o.domain: o.version for o in source.opset_import}
        if self.uses_ms:
            opsets.setdefault(_MS_DOMAIN, 1)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())],
            producer_name="mpsearch", ir_version=source.ir_version,
        )
        return model


def _read_in_subgraphs(graph: onnx.GraphProto) -> frozenset[str]:
    """Names read by the nodes of ``graph``'s subgraphs (If/Loop/Scan bodies), at any depth."""
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            for sub in (attr.g,) if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                names |= {t for n in sub.node for t in n.input} | _read_in_subgraphs(sub)
    return frozenset(names)


def build_qdq(
    graph: ModelGraph, table: CalibrationTable, profile: HardwareProfile,
    assignment: Mapping[str, str], *, method: str | None = None,
) -> onnx.ModelProto:
    """One-shot :meth:`Quantizer.build`."""
    return Quantizer(graph, table, profile, method=method).build(assignment)
