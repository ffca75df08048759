"""Op x format probes: does the toolchain run what a profile claims?

Consumes a profile (its ``toolchain``, formats and op rules); for each probed op type builds
a tiny one-op float model, quantizes it with our own builder at each of the profile's formats
(under a copy of the profile whose rule for that op allows every format, so a format the
profile leaves out is probed too), compiles it with the toolchain and compares: where the
toolchain places the op and in which precision against what the profile claims, and the
toolchain's output against ONNX Runtime's CPU EP on the same QDQ model. Produces one
:class:`ProbeResult` per (op, format).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mpsearch.assignment import make_assignment
from mpsearch.calibration import calibrate
from mpsearch.data import Dataset
from mpsearch.errors import MpsearchError, ProfileError
from mpsearch.graph import load_model
from mpsearch.profiles import HardwareProfile, OpRule, runs_fused_int8
from mpsearch.quantize import Quantizer
from mpsearch.runtime import create_session
from mpsearch.targets._base import ACCELERATOR, Toolchain

__all__ = ["PROBES", "SKIPPED", "WITHHELD", "ChainResult", "ProbeResult", "chain_model",
           "check_chains", "check_profile", "probe_model"]

OPSET = 20
SHAPE = (1, 4, 8, 8)
SKIPPED = "skipped"
#: The claim for a format the profile withholds with a reason (it fails in context): any
#: outcome of the one-op probe agrees, and the reason is shown.
WITHHELD = "withheld"
#: Largest |toolchain - ORT CPU| of a probe, over the ORT output's range, that still agrees.
TOLERANCE = 0.05

_Spec = tuple[dict[str, object], list[np.ndarray | tuple[str, np.ndarray]]]


#: Input shapes of probes that do not take the default one.
_SHAPES = {"Gemm": (1, 8), "Squeeze": (1, 4, 1, 8)}


def _w(*shape: int) -> np.ndarray:
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


def _i(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


#: op type -> (attributes, extra inputs after x: arrays become initializers).
PROBES: dict[str, Callable[[], _Spec]] = {
    "Conv": lambda: ({"pads": [1, 1, 1, 1]}, [_w(4, 4, 3, 3), _w(4)]),
    "ConvTranspose": lambda: ({"strides": [2, 2]}, [_w(4, 4, 2, 2), _w(4)]),
    "MatMul": lambda: ({}, [_w(8, 8)]),
    "Gemm": lambda: ({"transB": 1}, [_w(8, 8), _w(8)]),
    **{op: (lambda: ({}, [_w(*SHAPE)])) for op in ("Add", "Sub", "Mul", "Max", "Min")},
    "Div": lambda: ({}, [np.abs(_w(*SHAPE)) + 0.5]),
    **{op: (lambda: ({}, [])) for op in ("Sigmoid", "Tanh", "HardSigmoid", "Relu", "HardSwish",
                                         "Erf", "Gelu", "GlobalAveragePool", "Identity")},
    "LeakyRelu": lambda: ({"alpha": 0.1}, []),
    "Softmax": lambda: ({"axis": -1}, []),
    "Clip": lambda: ({}, [np.array(-1.0, np.float32), np.array(1.0, np.float32)]),
    "PRelu": lambda: ({}, [np.abs(_w(4, 1, 1)) * 0.1]),
    "Concat": lambda: ({"axis": 1}, [_w(*SHAPE)]),
    "AveragePool": lambda: ({"kernel_shape": [2, 2], "strides": [2, 2]}, []),
    "MaxPool": lambda: ({"kernel_shape": [2, 2], "strides": [2, 2]}, []),
    "LayerNormalization": lambda: ({"axis": -1}, [np.abs(_w(8)) + 0.5, _w(8)]),
    "InstanceNormalization": lambda: ({}, [np.abs(_w(4)) + 0.5, _w(4)]),
    "BatchNormalization": lambda: ({}, [np.abs(_w(4)) + 0.5, _w(4), _w(4),
                                        np.abs(_w(4)) + 0.5]),
    "Resize": lambda: ({"mode": "nearest"}, [("", np.zeros(0, np.float32)),
                                             np.array([1, 1, 2, 2], np.float32)]),
    "ReduceMean": lambda: ({"keepdims": 1}, [_i(-1)]),
    "ReduceSum": lambda: ({"keepdims": 1}, [_i(-1)]),
    "Pow": lambda: ({}, [np.array(2.0, np.float32)]),
    **{op: (lambda: ({}, [])) for op in ("Exp", "Abs", "Neg")},
    "Pad": lambda: ({}, [_i(0, 0, 1, 1, 0, 0, 1, 1)]),
    "Reshape": lambda: ({}, [_i(1, 4, 64)]),
    "Flatten": lambda: ({"axis": 1}, []),
    "Transpose": lambda: ({"perm": [0, 2, 3, 1]}, []),
    "Squeeze": lambda: ({}, [_i(2)]),
    "Unsqueeze": lambda: ({}, [_i(1)]),
    "Gather": lambda: ({"axis": 1}, [_i(0, 2)]),
    "Slice": lambda: ({}, [_i(0), _i(4), _i(3)]),
    "Split": lambda: ({"axis": 1, "num_outputs": 2}, []),
    "DepthToSpace": lambda: ({"blocksize": 2}, []),
    "SpaceToDepth": lambda: ({"blocksize": 2}, []),
    "Where": lambda: ({}, [("cond", _w(*SHAPE) > 0), _w(*SHAPE)]),
}


def probe_model(op_type: str) -> onnx.ModelProto:
    """A float model of one ``op_type`` node named ``probe`` reading input ``x`` (1x4x8x8)."""
    attrs, extras = PROBES[op_type]()
    inputs, inits = ["x"], []
    for k, extra in enumerate(extras):
        name, value = extra if isinstance(extra, tuple) else (f"c{k}", extra)
        if not name:  # an omitted optional input
            inputs.append("")
            continue
        inits.append(numpy_helper.from_array(value, name))
        inputs.append(name)
    if op_type == "Where":  # the condition comes first
        inputs = [inputs[1], "x", inputs[2]]
    outputs = ["y", "y2"] if op_type == "Split" else ["y"]
    node = helper.make_node(op_type, inputs, outputs, name="probe", **attrs)  # type: ignore[arg-type]
    shape = list(_SHAPES.get(op_type, SHAPE))
    graph = helper.make_graph(
        [node], f"probe_{op_type}", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    return onnx.shape_inference.infer_shapes(model)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    """One (op, format) probe: the profile's claim, the toolchain's placement and precision
    (with its reason when not on the accelerator), the output error against ONNX Runtime's
    CPU EP (max |difference| over the output range) and whether it all agrees."""

    op_type: str
    format: str
    claimed: str        # "accelerator", "cpu", "no" (not offered) or "withheld" (with a reason)
    unit: str           # the toolchain's: "accelerator", "cpu", "error" or "skipped"
    precision: str
    expected: str       # the precision the format's activations call for
    error: float | None
    reason: str = ""

    @property
    def agrees(self) -> bool:
        """The toolchain does what the profile claims: runs the op on the accelerator in the
        format's precision, as ONNX Runtime computes it (within :data:`TOLERANCE`), when the
        profile offers the format there; does not when the profile says the CPU or does not
        offer it. A toolchain error (the model does not compile) agrees only with a format the
        profile does not offer; a probe our
        builder cannot make (``skipped``) checks nothing."""
        if self.unit == SKIPPED or self.claimed == WITHHELD:
            return True
        if self.unit == "error":  # the toolchain cannot take the model at all
            return self.claimed == "no"
        if self.claimed == "no":
            return self.unit != ACCELERATOR or self.precision != self.expected
        if self.claimed == "cpu":
            return self.unit != ACCELERATOR
        return (self.unit == ACCELERATOR and self.precision == self.expected
                and self.error is not None and self.error <= TOLERANCE)


def _expected(profile: HardwareProfile, fmt: str) -> str:
    """The precision the target computes ``fmt`` in (its ``runs_as`` format's)."""
    dtype = profile.format(profile.computed_as(fmt)).activation.dtype
    return {"float16": "fp16", "float32": "fp32"}.get(dtype, f"int{8 if '8' in dtype else 16}")


def _claim(profile: HardwareProfile, op_type: str, fmt: str) -> str:
    rule = profile.op_rule(op_type)
    if rule is not None and fmt in rule.withheld:
        return WITHHELD
    if fmt not in profile.formats_for(op_type):
        return "no"
    if rule is not None and rule.on_cpu is not None:
        return "cpu"
    return "cpu" if profile.format(fmt).executes == "cpu_fallback" else ACCELERATOR


def check_profile(profile: HardwareProfile, tool: Toolchain, *,
                  ops: Sequence[str] | None = None,
                  progress: Callable[[str], None] | None = None) -> tuple[ProbeResult, ...]:
    """Probe ``ops`` (default: every op the profile lists that has a probe, and Erf) at every
    format of ``profile`` with ``tool`` (its settings from the profile). ``ops`` is taken once
    each; an op type without a probe is a :class:`ProfileError` listing those with one."""
    settings = {} if profile.toolchain is None else dict(profile.toolchain.settings)
    names = (list(dict.fromkeys(ops)) if ops is not None
             else [o for o in profile.op_rules if o in PROBES])
    unknown = [o for o in names if o not in PROBES]
    if unknown:
        shown = unknown[0] if len(unknown[0]) <= 60 else unknown[0][:60] + "..."
        raise ProfileError(f"{profile.name}: no probe for op type '{shown}'"
                           f"{f' (and {len(unknown) - 1} more)' if len(unknown) > 1 else ''}; "
                           f"pick from {', '.join(sorted(PROBES))}")
    if ops is None and "Erf" not in names:
        names.append("Erf")
    results: list[ProbeResult] = []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="mpsearch-probe-") as tmp:
        for op_type in names:
            graph = load_model(probe_model(op_type))
            shape = _SHAPES.get(op_type, SHAPE)
            x = rng.standard_normal((16, *shape[1:])).astype(np.float32)
            table = calibrate(graph, Dataset(inputs={"x": x}))
            relaxed = dataclasses.replace(profile, op_rules={
                **profile.op_rules, op_type: dataclasses.replace(
                    profile.op_rules.get(op_type) or OpRule(op_type=op_type, formats=()),
                    formats=tuple(profile.formats))})
            quantizer = Quantizer(graph, table, relaxed)
            for fmt in profile.formats:
                if progress is not None:
                    progress(f"{op_type} {fmt}")
                results.append(_probe(quantizer, tool, op_type, fmt, profile, settings, x,
                                      Path(tmp) / f"{op_type}_{fmt}"))
    return tuple(results)


def _probe(quantizer: Quantizer, tool: Toolchain, op_type: str, fmt: str,
           profile: HardwareProfile, settings: Mapping[str, object], x: np.ndarray,
           workdir: Path) -> ProbeResult:
    claimed, expected = _claim(profile, op_type, fmt), _expected(profile, fmt)
    rule = profile.op_rule(op_type)
    if claimed == WITHHELD and rule is not None:
        withheld = rule.withheld[fmt]
        result = _run_probe(quantizer, tool, op_type, fmt, claimed, expected, settings, x,
                            workdir)
        return dataclasses.replace(result, reason=f"withheld: {withheld}; {result.reason}"[:300])
    return _run_probe(quantizer, tool, op_type, fmt, claimed, expected, settings, x, workdir)


def _run_probe(quantizer: Quantizer, tool: Toolchain, op_type: str, fmt: str, claimed: str,
               expected: str, settings: Mapping[str, object], x: np.ndarray,
               workdir: Path) -> ProbeResult:
    try:
        model = quantizer.build(make_assignment(quantizer.graph, quantizer.profile,
                                                {"probe": fmt}))
    except MpsearchError as e:  # our builder cannot make it: nothing to ask the toolchain
        return ProbeResult(op_type=op_type, format=fmt, claimed=claimed, unit=SKIPPED,
                           precision="-", expected=expected, error=None,
                           reason=f"not built: {e}"[:300])
    try:
        compiled = tool.compile(model, workdir, calibration=[{"x": x[:1]}], settings=settings)
    except MpsearchError as e:
        return ProbeResult(op_type=op_type, format=fmt, claimed=claimed, unit="error",
                           precision="-", expected=expected, error=None, reason=str(e)[:300])
    if not any(n.name == "probe" for n in model.graph.node):
        return ProbeResult(op_type=op_type, format=fmt, claimed=claimed, unit=SKIPPED,
                           precision="-", expected=expected, error=None,
                           reason="not built: our builder folds it into the QuantizeLinear "
                                  "before it")
    placed = [p for p in compiled.placements if p.node == "probe"]
    unit = placed[0].unit if placed else "cpu"
    precision = placed[0].precision if placed else "-"
    reason = placed[0].reason if placed else "the node is not in the compiled model"
    try:
        fused = runs_fused_int8(quantizer.profile)
        reference = create_session(model, fused_int8=fused).run({"x": x})
        target = np.concatenate([tool.run(compiled, {"x": x[i:i + 1]})[0]
                                 for i in range(len(x))])
    except MpsearchError as e:
        return ProbeResult(op_type=op_type, format=fmt, claimed=claimed, unit="error",
                           precision=precision, expected=expected, error=None,
                           reason=f"compiled, but running it failed: {e}"[:300])
    ref = reference[model.graph.output[0].name].astype(np.float64)
    span = float(ref.max() - ref.min()) or 1.0
    error = float(np.abs(target.astype(np.float64) - ref).max()) / span
    return ProbeResult(op_type=op_type, format=fmt, claimed=claimed, unit=unit,
                       precision=precision, expected=expected, error=error, reason=reason)


def chain_model(op_type: str) -> onnx.ModelProto:
    """:func:`probe_model` between two nodes of its own: ``pre`` (Mul by 1.25) makes the
    probe's input and ``post`` (Mul by 0.8) reads its output, so each can be given a format
    of its own (the probe's input and output formats)."""
    model = probe_model(op_type)
    graph = model.graph
    graph.input[0].name = "x0"
    graph.initializer.extend([numpy_helper.from_array(np.array(1.25, np.float32), "k_pre"),
                              numpy_helper.from_array(np.array(0.8, np.float32), "k_post")])
    graph.node.insert(0, helper.make_node("Mul", ["x0", "k_pre"], ["x"], name="pre"))
    graph.node.append(helper.make_node("Mul", ["y", "k_post"], ["z"], name="post"))
    graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    del graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ChainResult:
    """One (op, input format, output format) chain: its error against ONNX Runtime's CPU EP
    (None when it did not build, compile or run: ``reason`` says which)."""

    op_type: str
    before: str
    after: str
    unit: str
    error: float | None
    reason: str = ""

    @property
    def agrees(self) -> bool:
        """Built and within :data:`TOLERANCE`, or not built by our builder (nothing to ask)."""
        if self.unit == SKIPPED:
            return True
        return self.error is not None and self.error <= TOLERANCE


def check_chains(profile: HardwareProfile, tool: Toolchain, ops: Sequence[str], *,
                 progress: Callable[[str], None] | None = None) -> tuple[ChainResult, ...]:
    """Every op of ``ops`` in the profile's default (float) format between a producer and a
    consumer in every pair of the profile's formats: what the toolchain's writer emits for an
    input of one format and an output of another, against ONNX Runtime."""
    settings = {} if profile.toolchain is None else dict(profile.toolchain.settings)
    every = tuple(profile.formats)
    results: list[ChainResult] = []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="mpsearch-chain-") as tmp:
        for op_type in ops:
            graph = load_model(chain_model(op_type))
            shape = _SHAPES.get(op_type, SHAPE)
            x = rng.standard_normal((8, *shape[1:])).astype(np.float32)
            relaxed = dataclasses.replace(profile, op_rules={
                **profile.op_rules, "Mul": OpRule(op_type="Mul", formats=every),
                op_type: OpRule(op_type=op_type, formats=every)})
            quantizer = Quantizer(graph, calibrate(graph, Dataset(inputs={"x0": x})), relaxed)
            for before in every:
                for after in every:
                    if progress is not None:
                        progress(f"{op_type} {before}>{after}")
                    results.append(_chain(quantizer, tool, op_type, before, after, settings,
                                          x, Path(tmp) / f"{op_type}_{before}_{after}"))
    return tuple(results)


def _chain(quantizer: Quantizer, tool: Toolchain, op_type: str, before: str, after: str,
           settings: Mapping[str, object], x: np.ndarray, workdir: Path) -> ChainResult:
    common = {"op_type": op_type, "before": before, "after": after}
    try:
        model = quantizer.build(make_assignment(quantizer.graph, quantizer.profile, {
            "pre": before, "probe": quantizer.profile.default_format, "post": after}))
    except MpsearchError as e:
        return ChainResult(**common, unit=SKIPPED, error=None, reason=f"not built: {e}"[:300])
    try:
        compiled = tool.compile(model, workdir, calibration=[{"x0": x[:1]}], settings=settings)
        target = np.concatenate([tool.run(compiled, {"x0": x[i:i + 1]})[0]
                                 for i in range(len(x))])
    except MpsearchError as e:
        return ChainResult(**common, unit="error", error=None, reason=str(e)[:300])
    placed = [p for p in compiled.placements if p.node == "probe"]
    ref = create_session(model, fused_int8=runs_fused_int8(quantizer.profile)).run(
        {"x0": x})["z"].astype(np.float64)
    span = float(ref.max() - ref.min()) or 1.0
    return ChainResult(**common, unit=placed[0].unit if placed else "-",
                       error=float(np.abs(target.astype(np.float64) - ref).max()) / span,
                       reason=placed[0].reason if placed else "")
