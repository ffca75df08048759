"""Names a build adds never collide with the model's own (hypothesis): a model whose tensors,
nodes and initializers are named like the generated ones quantizes at every format, runs in
ONNX Runtime, and gives the very outputs of the same model with plain names."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from mpsearch._names import Namer
from mpsearch.assignment import make_assignment, uniform_assignment
from mpsearch.calibration import CalibrationTable, calibrate
from mpsearch.data import Dataset
from mpsearch.graph import ModelGraph, load_model
from mpsearch.profiles import load_profile
from mpsearch.quantize import Quantizer
from mpsearch.recovery import equalize
from mpsearch.runtime import create_session

PROFILE = "x86_ort"
#: Tensors of the chain x -Conv-> t1 -Relu-> t2 -Flatten-> t3 -MatMul-> t4 -Add-> t5 -Relu-> y,
#: then its initializers.
TENSORS = ("x", "t1", "t2", "t3", "t4", "t5", "y")
INITIALIZERS = ("W", "B", "M", "A")
NODES = ("conv", "relu1", "flat", "matmul", "add", "relu2")
#: What the build appends to a name (quantize.py, _normalize.py, recovery/, targets/_qnn.py).
SUFFIXES = ("__raw", "__u8", "__u16", "__u8s", "__i8c0", "__i8c1", "__i8", "__i16c0", "__i32",
            "__f16", "__f16_f32", "__f16_Cast", "__u8_q", "__u8_scale", "__u8_zero", "__u8_Q",
            "__u8_DQ", "__u16_q", "__u8_1", "__i8c0_q", "__i8c0_dq", "__i8c0_DQ", "__i32_q",
            "__i32_dq", "_q", "_dq", "_DQ", "_scale", "_zero", "_2", "_3", "_a1", "_a1_q",
            "_a1_scale", "__clamped_by_q", "__bn_weight", "__cle", "__bc_add", "/gelu", "_h",
            "_Cast16", "_Cast32", "__u16_h")
#: Relative max error (over max |FP32|) against FP32 allowed for each uniform format; measured
#: on this model and data: int8 (u8 activations) 1.5e-2, int16 (A16W8) 7.1e-3, a16w16 7.0e-5,
#: fp16w 2.7e-4 (bound: test_quantize's FP16_REL_ERROR); fp32 and int8_rows (Gather only,
#: nothing here) are the FP32 model itself.
FP32_TOLERANCE = {"int8": 0.03, "int16": 0.015, "a16w16": 5e-4, "fp16w": 5e-3, "fp32": 0.0,
                  "int8_rows": 0.0}

_RNG = np.random.default_rng(0)
_ARRAYS = {"W": _RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
           "B": _RNG.standard_normal(4).astype(np.float32),
           "M": (_RNG.standard_normal((144, 5)) / 12).astype(np.float32),
           "A": _RNG.standard_normal(5).astype(np.float32)}
_X = _RNG.standard_normal((16, 3, 6, 6)).astype(np.float32)


def chain(names: dict[str, str], node_names: Sequence[str]) -> onnx.ModelProto:
    """The Conv/Relu/Flatten/MatMul/Add/Relu chain with ``names`` for its tensors and
    initializers (plain name -> name used) and ``node_names`` for its nodes."""
    n = names.__getitem__
    specs = [("Conv", ["x", "W", "B"], "t1", {"pads": [1, 1, 1, 1]}),
             ("Relu", ["t1"], "t2", {}), ("Flatten", ["t2"], "t3", {}),
             ("MatMul", ["t3", "M"], "t4", {}), ("Add", ["t4", "A"], "t5", {}),
             ("Relu", ["t5"], "y", {})]
    nodes = [helper.make_node(op, [n(i) for i in inputs], [n(out)], name=name, **attrs)
             for (op, inputs, out, attrs), name in zip(specs, node_names, strict=True)]
    graph = helper.make_graph(
        nodes, "names", [helper.make_tensor_value_info(n("x"), TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info(n("y"), TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(a, n(k)) for k, a in _ARRAYS.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


@st.composite
def hostile_names(draw: st.DrawFn) -> tuple[dict[str, str], list[str]]:
    """Distinct tensor and initializer names, each a short base or an earlier-drawn name with
    a generated suffix (in a random order, so a weight's ``__i8c0_dq`` may name a tensor), and
    node names drawn the same way (repeats allowed: the loader renames the later holders)."""
    slots = draw(st.permutations(TENSORS + INITIALIZERS))
    bases = st.sampled_from(("x", "c1", "w", "input", "y"))
    suffix = st.sampled_from(SUFFIXES)
    names: dict[str, str] = {}
    for slot in slots:
        taken = list(names.values())
        if taken and draw(st.booleans()):
            name = draw(st.sampled_from(taken)) + draw(suffix)
        else:
            name = draw(bases) + draw(st.sampled_from(("",) + SUFFIXES))
        while name in taken:
            name += draw(suffix)
        names[slot] = name
    pool = sorted(names.values())
    node_names = [draw(st.sampled_from(pool)) + draw(st.sampled_from(("",) + SUFFIXES))
                  for _ in NODES]
    return names, node_names


@functools.cache
def _plain() -> tuple[ModelGraph, CalibrationTable]:
    graph = load_model(chain({k: k for k in TENSORS + INITIALIZERS}, NODES))
    return graph, calibrate(graph, Dataset(inputs={"x": _X}, labels=None, source="random"))


def _run(model: onnx.ModelProto, x_name: str, y_name: str) -> np.ndarray:
    out: np.ndarray = create_session(model, optimize=False, threads=1).run({x_name: _X})[y_name]
    return out


def _relative(out: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(out - reference).max() / np.abs(reference).max())


@pytest.mark.slow
@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(drawn=hostile_names(), mixed=st.lists(st.integers(0, 5), min_size=6, max_size=6))
def test_generated_names_never_collide(drawn: tuple[dict[str, str], list[str]],
                                       mixed: list[int]) -> None:
    """Every format x86_ort allows (uniform) and one mixed assignment, on a model named like
    the build's own names: the result passes onnx.checker, loads in ONNX Runtime and gives
    the plain-named model's outputs bit for bit, within each format's tolerance of FP32."""
    names, node_names = drawn
    graph = load_model(chain(names, node_names))
    table = calibrate(graph, Dataset(inputs={names["x"]: _X}, labels=None, source="random"))
    plain_graph, plain_table = _plain()
    profile = load_profile(PROFILE)
    fp32 = _run(plain_graph.model, "x", "y")
    quantizer = Quantizer(graph, table, profile)
    plain = Quantizer(plain_graph, plain_table, profile)
    ours_of = dict(zip(plain_graph.order, graph.order, strict=True))  # both in file order
    configs = {f: dict(uniform_assignment(plain_graph, profile, f)) for f in profile.formats}
    configs["mixed"] = {  # each node a format it allows, drawn
        name: allowed[i % len(allowed)] for name, i in zip(plain_graph.order, mixed, strict=True)
        if (allowed := profile.formats_for_node(plain_graph.nodes[name]))}
    for label, formats in configs.items():
        built = quantizer.build(make_assignment(
            graph, profile, {ours_of[k]: v for k, v in formats.items()}))
        onnx.checker.check_model(built, full_check=True)
        out = _run(built, names["x"], names["y"])
        expected = _run(plain.build(make_assignment(plain_graph, profile, formats)), "x", "y")
        np.testing.assert_array_equal(out, expected, err_msg=f"{label}: {names} {node_names}")
        if label in FP32_TOLERANCE:
            assert _relative(out, fp32) <= FP32_TOLERANCE[label], (label, _relative(out, fp32))


def test_a_model_named_like_the_build_quantizes_at_int8_and_int16() -> None:
    """The layout of the report: ``c1__raw``, ``x__u8``, ``W__i8c0_dq`` are the model's own."""
    names = {"x": "x", "t1": "c1", "t2": "c1__raw", "t3": "x__u8", "t4": "W__i8c0_dq",
             "t5": "c1__u8", "y": "y", "W": "W", "B": "B", "M": "x__u8_scale", "A": "W__i8c0_q"}
    graph = load_model(chain(names, ["c1__raw_Q", "c1__u8_DQ", "x__u8_Q", "W__i8c0_DQ", "y",
                                     "c1"]))
    table = calibrate(graph, Dataset(inputs={"x": _X}, labels=None, source="random"))
    plain_graph, plain_table = _plain()
    profile = load_profile(PROFILE)
    fp32 = _run(plain_graph.model, "x", "y")
    for fmt in ("int8", "int16", "a16w16", "fp16w"):
        built = Quantizer(graph, table, profile).build(uniform_assignment(graph, profile, fmt))
        expected = Quantizer(plain_graph, plain_table, profile).build(
            uniform_assignment(plain_graph, profile, fmt))
        out = _run(built, "x", "y")
        np.testing.assert_array_equal(out, _run(expected, "x", "y"), err_msg=fmt)
        assert _relative(out, fp32) <= FP32_TOLERANCE[fmt], (fmt, _relative(out, fp32))
        assert _relative(out, fp32) > 0, fmt  # quantized, not left float


def test_a_subgraph_name_is_taken_too() -> None:
    """A name used only inside an If branch is not handed out at the top level."""
    then = helper.make_graph([helper.make_node("Identity", ["t1"], ["t1__raw"], name="inner")],
                             "then", [], [helper.make_tensor_value_info("t1__raw",
                                                                        TensorProto.FLOAT, None)])
    cond = helper.make_node("If", ["flag"], ["z"], then_branch=then, else_branch=then)
    graph = helper.make_graph([cond], "g", [], [])
    namer = Namer.of_model(graph)
    assert namer.fresh("t1__raw") == "t1__raw_2"
    assert namer.fresh("inner", ("", "_q")) == "inner_2"
    assert namer.fresh("t1__raw", ("", "_q")) == "t1__raw_3"
    child = namer.child()
    assert child.fresh("t1__raw") == "t1__raw_4" and not namer.taken("t1__raw_4")
    assert namer.fresh("t1__raw", avoid=child) == "t1__raw_5"


def _cle_chain(n: dict[str, str]) -> onnx.ModelProto:
    """x -> Conv c1 -> Relu -> depthwise Conv dw -> Clip(0, 6) -> Conv c3 -> y, its tensors
    and the Relu and Clip nodes named by ``n``, channel ranges three decades apart."""
    rng = np.random.default_rng(0)
    spread = np.array([0.01, 0.1, 1.0, 10.0], np.float32)[:, None, None, None]
    arrays = {"c1.w": rng.normal(size=(4, 3, 3, 3)).astype(np.float32) * spread,
              "c1.b": rng.normal(size=4).astype(np.float32) * spread.reshape(-1),
              "dw.w": rng.normal(size=(4, 1, 3, 3)).astype(np.float32) / spread,
              "dw.b": rng.normal(size=4).astype(np.float32),
              "c3.w": rng.normal(size=(2, 4, 1, 1)).astype(np.float32),
              "c3.b": rng.normal(size=2).astype(np.float32),
              n["lo"]: np.array(0.0, np.float32), n["hi"]: np.array(6.0, np.float32)}

    def conv(name: str, x: str, y: str, **attrs: object) -> onnx.NodeProto:
        return helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [y], name=name, **attrs)

    nodes = [conv("c1", "x", n["a"], pads=[1] * 4),
             helper.make_node("Relu", [n["a"]], [n["r"]], name=n["relu"]),
             conv("dw", n["r"], n["d"], pads=[1] * 4, group=4),
             helper.make_node("Clip", [n["d"], n["lo"], n["hi"]], [n["k"]], name=n["clip"]),
             conv("c3", n["k"], "y")]
    model = helper.make_model(helper.make_graph(
        nodes, "cle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 8, 8])],
        [numpy_helper.from_array(v, k) for k, v in arrays.items()]),
        opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_equalization_names_are_fresh() -> None:
    """CLE's exact clip policy adds ``<clip>__cle_lo/hi/max/min`` and ``<output>__cle``: a
    model already using those names equalizes and quantizes to the plain-named model's very
    outputs, and equalization keeps its FP32 outputs."""
    plain = {k: k for k in ("a", "r", "d", "k", "lo", "hi", "relu", "clip")}
    hostile = {"a": "clip__cle_lo", "r": "k__cle", "d": "clip__cle_min", "k": "k",
               "lo": "clip__cle_max", "hi": "clip__cle_hi", "relu": "clip__cle_min",
               "clip": "clip"}
    x = np.random.default_rng(1).standard_normal((8, 3, 8, 8)).astype(np.float32)
    profile = load_profile(PROFILE)
    outputs = []
    for names in (hostile, plain):
        graph = load_model(_cle_chain(names))
        out = equalize(graph, clip="exact")
        assert sorted(n.op_type for n in out.nodes.values()).count("Min") == 1
        onnx.checker.check_model(out.model, full_check=True)
        reference = create_session(graph.model, optimize=False).run({"x": x})["y"]
        equalized = create_session(out.model, optimize=False).run({"x": x})["y"]
        np.testing.assert_allclose(equalized, reference, rtol=1e-5,
                                   atol=1e-5 * float(np.abs(reference).max()))
        table = calibrate(out, Dataset(inputs={"x": x}, labels=None, source="random"))
        built = Quantizer(out, table, profile).build(uniform_assignment(out, profile, "int8"))
        onnx.checker.check_model(built, full_check=True)
        outputs.append(create_session(built, optimize=False, threads=1).run({"x": x})["y"])
    np.testing.assert_array_equal(outputs[0], outputs[1])
