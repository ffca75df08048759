"""Hardware profiles: what a target can run, in which numeric formats, and at what cost.

Consumes a YAML profile (a path, or the name of a shipped profile in ``hw_profiles/``);
produces a frozen :class:`HardwareProfile` that later stages query: the formats allowed for a
node (:meth:`HardwareProfile.formats_for_node`), what a format means in dtypes
(:meth:`HardwareProfile.format`, :meth:`HardwareProfile.weight_format`), the relative cost of a
node in a format (:meth:`HardwareProfile.relative_cost`) and the memory budget.

Costs are relative: each format's ``relative_cost`` is its compute time per MAC relative to the
profile's ``cost_reference`` format (cost 1.0; normally ``fp32``, or ``int8`` on targets where
float runs off the accelerator). ``None`` everywhere means "unknown", never zero.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from mpsearch._yaml import suggest
from mpsearch.errors import ProfileError
from mpsearch.profiles._weight_only import WeightOnly

__all__ = [
    "ACTIVATION_DTYPES",
    "BIAS_DTYPES",
    "EXECUTES",
    "FALLBACKS",
    "GRANULARITIES",
    "RUNTIMES",
    "SCALES",
    "SCHEMA_VERSION",
    "WEIGHT_DTYPES",
    "Format",
    "HardwareProfile",
    "NodeLike",
    "OpRule",
    "TensorFormat",
    "ToolchainRef",
    "list_profiles",
    "load_profile",
    "validate_profile_file",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
ACTIVATION_DTYPES = ("int8", "uint8", "int16", "uint16", "float32", "float16")
WEIGHT_DTYPES = ACTIVATION_DTYPES
BIAS_DTYPES = ("int32", "float32", "float16")
GRANULARITIES = ("per_tensor", "per_channel")
SCALES = ("float", "pow2")
EXECUTES = ("accelerator", "cpu_fallback", "emulated")
FALLBACKS = ("per_op", "after_first_unsupported", "error")
#: Runtimes a profile may name as the target's own (``runtime``): its latency can then be
#: measured on a host of the same kind instead of estimated.
RUNTIMES = ("onnxruntime-cpu",)
#: Target toolchains a profile may name (``toolchain.name``), with the settings each takes
#: (mpsearch/targets/: qnn = onnxruntime-qnn's HTP emulator, rknn = rknn-toolkit2's simulator,
#: vela = Arm's Ethos-U compiler).
TOOLCHAIN_SETTINGS: Mapping[str, tuple[str, ...]] = {
    "qnn": ("htp_arch", "soc_model", "offload_graph_io_quantization"),
    "rknn": ("target_platform",),
    "vela": ("accelerator_config", "system_config", "memory_mode"),
}
#: QNN HTP architectures (``htp_arch``) and SoCs (``soc_model``: QNN's number -> (name, its
#: HTP architecture)), as Qualcomm's QNN SDK numbers them (ExecuTorch's Qualcomm backend,
#: backends/qualcomm/serialization/qc_schema.py); 0 is QNN's unknown SoC, the EP's default.
#: A number outside them makes the emulator model another chip, or none.
QNN_HTP_ARCHS = (68, 69, 73, 75, 79, 81)
QNN_SOC_MODELS: Mapping[int, tuple[str, int | None]] = MappingProxyType({
    0: ("unknown SoC", None), 30: ("SM8350", 68), 36: ("SM8450", 69), 39: ("SA8295", 68),
    42: ("SM8475", 69),
    43: ("SM8550", 73), 45: ("SXR1230P", 73), 46: ("SSG2115P", 73), 52: ("SA8255", 73),
    53: ("SXR2230P", 69), 57: ("SM8650", 75), 58: ("SSG2125P", 73), 62: ("SA8540", 68),
    69: ("SM8750", 79), 72: ("SA8797", 81), 75: ("SXR2330P", 79), 77: ("QCS9100", 73),
    87: ("SM8850", 81), 93: ("QCM6490", 68), 95: ("SAR2230P", 81), 96: ("SW6100", 81),
    97: ("SM8845", 81)})
#: Vela's ``--accelerator-config`` values (ethos-u-vela 5.2.0).
VELA_ACCELERATORS = ("ethos-u55-32", "ethos-u55-64", "ethos-u55-128", "ethos-u55-256",
                     "ethos-u65-256", "ethos-u65-512", "ethos-u85-128", "ethos-u85-256",
                     "ethos-u85-512", "ethos-u85-1024", "ethos-u85-2048")


def toolchain_setting_problem(toolchain: str, settings: Mapping[str, object]) -> str | None:
    """Why ``settings`` of ``toolchain`` name a chip or configuration the toolchain does not
    know (``toolchain.<key> ...``), else None: QNN's ``htp_arch`` and ``soc_model`` (and that
    they agree), Vela's ``accelerator_config``."""
    if toolchain == "vela":
        value = settings.get("accelerator_config")
        if value is not None and value not in VELA_ACCELERATORS:
            return (f"toolchain.accelerator_config must be one of {', '.join(VELA_ACCELERATORS)}"
                    f", got {value!r}")
        return None
    if toolchain != "qnn":
        return None
    known = {"htp_arch": QNN_HTP_ARCHS, "soc_model": tuple(QNN_SOC_MODELS)}
    numbers: dict[str, int] = {}
    for key, choices in known.items():
        value = settings.get(key)
        if value is None:
            continue
        number = _whole_number(value)
        if number is None or number not in choices:
            return (f"toolchain.{key} must be one of {', '.join(map(str, choices))}, got "
                    f"{value!r}")
        numbers[key] = number
    name, arch = QNN_SOC_MODELS.get(numbers.get("soc_model", 0), ("", None))
    if "htp_arch" in numbers and arch is not None and arch != numbers["htp_arch"]:
        return (f"toolchain.soc_model {numbers['soc_model']} ({name}) has HTP v{arch}, not "
                f"htp_arch {numbers['htp_arch']}; give one of them, or both of one chip")
    return None


def _whole_number(value: object) -> int | None:
    """``value`` as an int when it is one (or a string of digits), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None

_INT_DTYPES = ("int8", "uint8", "int16", "uint16")
_BITS = {"int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "float16": 16, "float32": 32}
# Natural output-channel axis of the weight, by op type (Gemm depends on transB).
_NATURAL_AXIS = {"Conv": 0, "ConvTranspose": 1, "MatMul": -1}


def _frozen_map(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return value if isinstance(value, MappingProxyType) else MappingProxyType(dict(value))


def _check_choice(owner: str, name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ProfileError(f"{owner}.{name} must be one of {', '.join(choices)}, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorFormat:
    """How one tensor (activation or weight) is stored.

    ``symmetric``: the range is centred on zero, so the zero-point is fixed: 0 for signed
    dtypes, the midpoint (128, 32768) for unsigned ones, as ONNX Runtime's quantizer does.
    ``axis`` overrides the op's natural output-channel axis for per-channel quantization.
    ``narrow_range`` drops the most negative code of a signed type ([-127, 127] for int8, as
    TensorRT and LiteRT weights use); ONNX Runtime's default is the full range [-128, 127].
    ``reduce_range`` halves the range as ONNX Runtime's quantizer does (int8 weights in
    [-64, 64], uint8 in [0, 127]; ``narrow_range`` then drops nothing): ONNX Runtime's advice for
    x86 CPUs without VNNI, whose VPMADDUBSW adds pairs of u8 x s8 products into a saturating
    int16 (2 * 255 * 64 = 32640 fits).
    """

    dtype: str
    symmetric: bool = False
    granularity: str = "per_tensor"
    axis: int | None = None
    scale: str = "float"
    narrow_range: bool = False
    reduce_range: bool = False

    def __post_init__(self) -> None:
        _check_choice("TensorFormat", "dtype", self.dtype, ACTIVATION_DTYPES)
        _check_choice("TensorFormat", "granularity", self.granularity, GRANULARITIES)
        _check_choice("TensorFormat", "scale", self.scale, SCALES)

    @property
    def bits(self) -> int:
        """Storage width: 8, 16 or 32."""
        return _BITS[self.dtype]

    @property
    def is_float(self) -> bool:
        """True for float16/float32 (not quantized)."""
        return self.dtype.startswith("float")

    @property
    def is_signed(self) -> bool:
        """True for int8/int16 (and floats)."""
        return not self.dtype.startswith("uint")

    @property
    def qmin(self) -> int:
        """Smallest integer code (raises ProfileError for float dtypes)."""
        self._require_int()
        if not self.is_signed:
            return 0
        if self.reduce_range:
            return -(1 << (self._bits - 1))
        return -(1 << (self._bits - 1)) + (1 if self.narrow_range else 0)

    @property
    def qmax(self) -> int:
        """Largest integer code (raises ProfileError for float dtypes)."""
        self._require_int()
        if not self.is_signed:
            return (1 << self._bits) - 1
        return (1 << (self._bits - 1)) - (0 if self.reduce_range else 1)

    @property
    def _bits(self) -> int:
        return self.bits - 1 if self.reduce_range else self.bits

    def _require_int(self) -> None:
        if self.is_float:
            raise ProfileError(f"dtype {self.dtype} has no integer range; it is not quantized")

    def to_dict(self) -> dict[str, Any]:
        """YAML/JSON form, as a profile file writes it."""
        if self.is_float:
            return {"dtype": self.dtype}
        return {"dtype": self.dtype, "symmetric": self.symmetric,
                "granularity": self.granularity, "axis": self.axis, "scale": self.scale,
                "narrow_range": self.narrow_range, "reduce_range": self.reduce_range}


@dataclass(frozen=True, slots=True, kw_only=True)
class Format:
    """One option the search may assign to a node, e.g. ``int8`` = W8A8.

    ``executes``: ``accelerator`` (native), ``cpu_fallback`` (runs off the accelerator) or
    ``emulated`` (Q/DQ around a float kernel, e.g. int16 on the ORT CPU EP).
    ``relative_cost``: compute time per MAC relative to the profile's ``cost_reference``
    (None = unknown).
    ``runs_as``: another format of the profile whose numerics the target really computes
    this one with (the HTP and RKNN run float32 nodes in float16); the search then scores
    nodes of this format as that one (None = as declared).
    """

    name: str
    activation: TensorFormat
    weight: TensorFormat
    bias: str
    executes: str
    relative_cost: float | None
    runs_as: str | None = None

    def __post_init__(self) -> None:
        _check_choice(f"Format {self.name}", "bias", self.bias, BIAS_DTYPES)
        _check_choice(f"Format {self.name}", "executes", self.executes, EXECUTES)

    @property
    def is_float(self) -> bool:
        """True when neither activations nor weights are quantized (e.g. fp32, fp16)."""
        return self.activation.is_float and self.weight.is_float

    @property
    def rank(self) -> int:
        """Sort key for the search's ordered encoding: int8 < int16 < fp16 < fp32."""
        return 10_000 * self.is_float + 100 * self.activation.bits + self.weight.bits

    def to_dict(self) -> dict[str, Any]:
        """YAML/JSON form, as a profile file writes it (without the name)."""
        out = {"activation": self.activation.to_dict(), "weight": self.weight.to_dict(),
               "bias": self.bias, "executes": self.executes,
               "relative_cost": self.relative_cost}
        return out if self.runs_as is None else {**out, "runs_as": self.runs_as}


@dataclass(frozen=True, slots=True, kw_only=True)
class OpRule:
    """What one ONNX op type may take on a target.

    ``fixed_qparams`` maps an activation dtype (or a format name that is not a dtype name) to
    the (scale, zero_point) the target imposes on the op's output (16-bit Sigmoid on HTP).
    ``cost`` overrides a format's ``relative_cost`` for this op (None = unknown).
    ``on_cpu``: why the target's toolchain runs this op on its host CPU in every format it
    takes (e.g. the QNN EP has no Erf); None when the formats' ``executes`` say where.
    ``withheld`` maps a format the toolchain takes for the op alone, but which the profile
    does not offer, to why (it fails in context: RKNN's INT8 Softmax inside attention).
    """

    op_type: str
    formats: tuple[str, ...]
    weight_granularity: str | None = None
    weight_axis: int | None = None
    fixed_qparams: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    same_input_precision: bool = False
    same_input_scale: bool = False
    cost: Mapping[str, float | None] = field(default_factory=dict)
    on_cpu: str | None = None
    withheld: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "formats", tuple(self.formats))
        object.__setattr__(self, "withheld", _frozen_map(self.withheld))
        object.__setattr__(self, "fixed_qparams", _frozen_map(self.fixed_qparams))
        object.__setattr__(self, "cost", _frozen_map(self.cost))

    def qparams_for(self, fmt: Format) -> tuple[float, int] | None:
        """The fixed (scale, zero_point) for ``fmt``: by activation dtype, then format name.

        A key spelled like an integer dtype (``int16``) always means the dtype, even when a
        format has the same name; other keys are format names.
        """
        found = self.fixed_qparams.get(fmt.activation.dtype)
        if found is None and fmt.name not in _INT_DTYPES:
            found = self.fixed_qparams.get(fmt.name)
        return found

    def to_dict(self) -> dict[str, Any]:
        """YAML/JSON form, as a profile file writes it (without the op type)."""
        out: dict[str, Any] = {
            "formats": list(self.formats), "weight_granularity": self.weight_granularity,
            "weight_axis": self.weight_axis,
            "fixed_qparams": {k: list(v) for k, v in self.fixed_qparams.items()},
            "same_input_precision": self.same_input_precision,
            "same_input_scale": self.same_input_scale, "cost": dict(self.cost),
            "on_cpu": self.on_cpu, "withheld": dict(self.withheld)}
        return {k: v for k, v in out.items() if v is not None and v is not False and v != {}}


class NodeLike(Protocol):
    """What :meth:`HardwareProfile.formats_for_node` needs from a graph node."""

    @property
    def op_type(self) -> str: ...

    @property
    def quantizable(self) -> bool: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolchainRef:
    """The vendor toolchain that checks a profile (``toolchain:`` in the YAML): its name in
    :data:`TOOLCHAIN_SETTINGS` and the settings it is run with (chip generation, platform,
    accelerator configuration). ``tolerance``: how far a verified point's target metric may
    lie from its ONNX Runtime metric (None: the default, one point for proportion metrics)."""

    name: str
    settings: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    tolerance: float | None = None

    def __post_init__(self) -> None:
        _check_choice("toolchain", "name", self.name, tuple(TOOLCHAIN_SETTINGS))
        unknown = sorted(set(self.settings) - set(TOOLCHAIN_SETTINGS[self.name]))
        if unknown:
            raise ProfileError(f"toolchain {self.name}: unknown setting(s) {unknown}; known: "
                               f"{', '.join(TOOLCHAIN_SETTINGS[self.name])}")
        problem = toolchain_setting_problem(self.name, self.settings)
        if problem is not None:
            raise ProfileError(problem)
        object.__setattr__(self, "settings", _frozen_map(self.settings))
        if self.tolerance is not None and not (
                isinstance(self.tolerance, (int, float)) and 0 <= self.tolerance < math.inf):
            raise ProfileError(f"toolchain {self.name}: tolerance must be a number >= 0, got "
                               f"{self.tolerance!r}")

    def to_dict(self) -> dict[str, Any]:
        tolerance = {} if self.tolerance is None else {"tolerance": self.tolerance}
        return {"name": self.name, **self.settings, **tolerance}


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareProfile:
    """A target: its formats, per-op rules, fallback behaviour and cost model.

    ``fallback``: ``per_op`` (an unsupported op or format runs on the CPU),
    ``after_first_unsupported`` (Edge TPU: everything after the first unsupported op runs on the
    CPU) or ``error`` (the op lists are complete; anything else fails to compile).
    ``transition_cost`` is the cost of one precision change per tensor element, in the units of
    :meth:`relative_cost`.
    ``memory_budget_bytes`` bounds the bytes of weights kept on the accelerator.
    ``runtime`` names the target's runtime when a host can run it as the target does
    (``onnxruntime-cpu``: ONNX Runtime's CPU execution provider on an x86 CPU), so latency is
    timed rather than estimated (:func:`mpsearch.profiles.measures_latency`); None otherwise.
    ``toolchain`` names the vendor toolchain that can compile, place and emulate the target's
    models (:mod:`mpsearch.targets`), with its settings; None when there is none on the index.
    ``weight_only`` lists the weight-only block formats (decoder LLMs) the target's kernel runs
    (:mod:`mpsearch.profiles._weight_only`); None when it has none.
    """

    name: str
    description: str
    versions: str
    sources: tuple[str, ...]
    formats: Mapping[str, Format]
    default_format: str
    cost_reference: str
    op_rules: Mapping[str, OpRule]
    fallback: str
    unlisted_ops: tuple[str, ...]
    transition_cost: float | None
    memory_budget_bytes: int | None
    unknowns: tuple[str, ...] = ()
    runtime: str | None = None
    toolchain: ToolchainRef | None = None
    weight_only: WeightOnly | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        _check_choice(f"profile {self.name}", "fallback", self.fallback, FALLBACKS)
        if self.runtime is not None:
            _check_choice(f"profile {self.name}", "runtime", self.runtime, RUNTIMES)
        used = [n for rule in self.op_rules.values() for n in rule.formats]
        for name in (self.default_format, self.cost_reference, *self.unlisted_ops, *used):
            if name not in self.formats:
                raise ProfileError(f"profile {self.name}: format '{name}' is not defined; "
                                   f"defined: {', '.join(sorted(self.formats))}")
        object.__setattr__(self, "formats", _frozen_map(self.formats))
        object.__setattr__(self, "op_rules", _frozen_map(self.op_rules))

    # -- formats ---------------------------------------------------------------------------
    def format(self, name: str) -> Format:
        """The format called ``name``; ProfileError naming the valid ones otherwise."""
        try:
            return self.formats[name]
        except KeyError:
            raise ProfileError(f"profile {self.name} has no format '{name}'"
                               f"{suggest(name, self.formats)}") from None

    def computed_as(self, name: str) -> str:
        """The format whose numerics the target computes ``name`` with: its ``runs_as``, else
        itself."""
        return self.format(name).runs_as or name

    def _by_rank(self, names: Iterable[str]) -> tuple[str, ...]:
        unique = set(names)
        return tuple(sorted(unique, key=lambda n: (self.formats[n].rank, n)))

    def size_limit(self, max_size_bytes: int | None, use_memory_budget: bool) -> int | None:
        """The weight size limit a configuration must meet: ``max_size_bytes`` (None: none) and,
        when ``use_memory_budget``, this target's memory budget, whichever is smaller."""
        budget = self.memory_budget_bytes if use_memory_budget else None
        if budget is None:
            return max_size_bytes
        return budget if max_size_bytes is None else min(max_size_bytes, budget)

    def lowest_formats(self) -> tuple[str, ...]:
        """The defined formats of the lowest rank (several when they tie), by name."""
        lowest = min(f.rank for f in self.formats.values())
        return tuple(sorted(n for n, f in self.formats.items() if f.rank == lowest))

    def op_rule(self, op_type: str) -> OpRule | None:
        """The rule for ``op_type``, or None when the op is not listed."""
        return self.op_rules.get(op_type)

    def formats_for(self, op_type: str) -> tuple[str, ...]:
        """Format names ``op_type`` may take, ordered by rank.

        Listed ops take their rule's formats, others ``unlisted_ops``; unless ``fallback`` is
        ``error`` the float ``default_format`` is always added. May be empty for an ``error``
        profile (the op cannot run on this target).
        """
        rule = self.op_rules.get(op_type)
        names = list(rule.formats if rule is not None else self.unlisted_ops)
        if self.fallback != "error":
            names.append(self.default_format)
        return self._by_rank(names)

    def formats_for_node(self, node: NodeLike) -> tuple[str, ...]:
        """Formats for one graph node; a non-quantizable node gets only float formats.

        Raises ProfileError when the node's op cannot run on this target at all.
        """
        names = self.formats_for(node.op_type)
        if not node.quantizable:
            floats = [n for n in names if self.formats[n].is_float]
            names = (self.default_format,) if self.default_format in floats else tuple(floats)
        if not names:
            what = "op" if node.quantizable else "non-quantizable op"
            raise ProfileError(
                f"profile {self.name}: {what} {node.op_type} has no allowed format and fallback "
                f"is 'error'; add an op_rules entry or pick another profile")
        return names

    def weight_format(self, op_type: str, format_name: str) -> TensorFormat:
        """The weight format of ``format_name`` with the op's granularity/axis rules applied.

        A format that names its own ``axis`` keeps it: the rule's ``weight_axis`` sets the axis
        of the formats that leave it to the op (so a Gather rule can store tables one scale a
        column and still offer a format with one scale a row)."""
        weight = self.format(format_name).weight
        rule = self.op_rules.get(op_type)
        if rule is None or weight.is_float:
            return weight
        if rule.weight_granularity is not None:
            weight = replace(weight, granularity=rule.weight_granularity)
        if rule.weight_axis is not None and weight.axis is None:
            weight = replace(weight, axis=rule.weight_axis)
        return weight

    def weight_axis(
        self, op_type: str, attrs: Mapping[str, Any], *, weight_rank: int | None = None
    ) -> int:
        """Per-channel axis of the weight of an ``op_type`` node with ONNX attributes ``attrs``.

        Order: the op rule's ``weight_axis``, then the natural output-channel axis (Conv 0,
        ConvTranspose 1, Gemm transB=1 -> 0 else 1, MatMul last = -1, Gather its ``axis``: one
        scale per gathered row; other ops 0). A negative
        axis is made positive when ``weight_rank`` is given.
        """
        rule = self.op_rules.get(op_type)
        if rule is not None and rule.weight_axis is not None:
            axis = rule.weight_axis
        elif op_type == "Gemm":
            axis = 0 if int(attrs.get("transB", 0)) else 1
        elif op_type in ("Gather", "GatherElements"):
            axis = int(attrs.get("axis", 0))
        else:
            axis = _NATURAL_AXIS.get(op_type, 0)
        if axis < 0 and weight_rank is not None:
            axis += weight_rank
        return axis

    def fixed_qparams(self, op_type: str, format_name: str) -> tuple[float, int] | None:
        """(scale, zero_point) the target imposes on ``op_type``'s output in this format."""
        fmt = self.format(format_name)
        rule = self.op_rules.get(op_type)
        return None if rule is None or fmt.activation.is_float else rule.qparams_for(fmt)

    # -- costs -----------------------------------------------------------------------------
    def format_cost(self, op_type: str, format_name: str) -> float | None:
        """Cost per MAC of ``op_type`` in ``format_name`` (op override first); None = unknown."""
        fmt = self.format(format_name)
        if format_name not in self.formats_for(op_type):
            raise ProfileError(
                f"profile {self.name}: format '{format_name}' is not allowed for {op_type}; "
                f"allowed: {', '.join(self.formats_for(op_type)) or 'none'}")
        rule = self.op_rules.get(op_type)
        if rule is not None and format_name in rule.cost:
            return rule.cost[format_name]
        return fmt.relative_cost

    def relative_cost(self, op_type: str, format_name: str, macs: float) -> float | None:
        """``macs`` times the format's cost for this op; None when the cost is unknown."""
        cost = self.format_cost(op_type, format_name)
        return None if cost is None else macs * cost

    def to_dict(self) -> dict[str, Any]:
        """The resolved profile as a schema-1 mapping (loadable again; ``path`` left out)."""
        return {
            "schema": SCHEMA_VERSION, "name": self.name, "description": self.description,
            "versions": self.versions, "sources": list(self.sources),
            "formats": {n: f.to_dict() for n, f in self.formats.items()},
            "default_format": self.default_format, "cost_reference": self.cost_reference,
            "fallback": self.fallback, "unlisted_ops": list(self.unlisted_ops),
            "op_rules": {op: r.to_dict() for op, r in self.op_rules.items()},
            "transition_cost": self.transition_cost,
            "memory_budget_bytes": self.memory_budget_bytes, "unknowns": list(self.unknowns),
            **({"runtime": self.runtime} if self.runtime is not None else {}),
            **({"toolchain": self.toolchain.to_dict()} if self.toolchain is not None else {}),
            **({"weight_only": self.weight_only.to_dict()}
               if self.weight_only is not None else {}),
        }


# -- loading -------------------------------------------------------------------------------
def list_profiles() -> tuple[str, ...]:
    """Names of the shipped profiles (top-level ``hw_profiles/``, then package data), sorted."""
    from mpsearch.profiles import (
        _schema as _profile_schema,  # local import: the schema builds this module's types
    )

    return _profile_schema.list_shipped()


def load_profile(name_or_path: str | os.PathLike[str]) -> HardwareProfile:
    """Load and validate a profile from a YAML path or a shipped profile name (``x86_ort``)."""
    from mpsearch.profiles import _schema as _profile_schema

    path = _profile_schema.resolve_profile(name_or_path)
    profile = _profile_schema.read_profile(path)
    logger.debug("loaded hardware profile %s from %s", profile.name, path)
    return profile


def validate_profile_file(path: str | os.PathLike[str]) -> HardwareProfile:
    """Load ``path`` as a profile file (for ``mpsearch profiles validate``)."""
    return load_profile(Path(path))
