"""Load-time rewrites: each one keeps the model's outputs (checked with float ONNX Runtime)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper, parser

from mpsearch.graph import load_model
from mpsearch.runtime import create_session

_RNG = np.random.default_rng(0)
_W = numpy_helper.from_array(_RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")

# The exporter pattern of EfficientNet/TF "same" padding: pads computed from constants.
_PAD_THEN_CONV = """
<ir_version: 8, opset_import: ["" : 17]>
agraph (float[N, 3, 8, 8] x) => (float[N, 4, 4, 4] y) {{
    begin = Constant <value = int64[4] {{0, 0, 0, 1}}> ()
    end = Constant <value = int64[4] {{0, 0, 1, 0}}> ()
    pads = Concat <axis = 0> (begin, end)
    {value}
    padded = Pad <mode = "{mode}"> (x, pads{value_input})
    y = Conv <strides = [2, 2], pads = [1, 0, 0, 1]> (padded, w)
    {extra}
}}
"""


def _model(text: str, *initializers: onnx.TensorProto) -> onnx.ModelProto:
    model = parser.parse_model(text)
    model.graph.initializer.extend(initializers)
    onnx.checker.check_model(model)
    return model


def _pad_conv(mode: str = "constant", value: float | None = None,
              extra: str = "") -> onnx.ModelProto:
    value_line = "" if value is None else f"v = Constant <value = float {{{value}}}> ()"
    text = _PAD_THEN_CONV.format(mode=mode, value=value_line,
                                 value_input="" if value is None else ", v", extra=extra)
    return _model(text, _W)


def _outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return create_session(model).run(feeds)


def _assert_same_outputs(original: onnx.ModelProto, rewritten: onnx.ModelProto,
                         feeds: dict[str, np.ndarray]) -> None:
    expected, actual = _outputs(original, feeds), _outputs(rewritten, feeds)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=1e-5, atol=1e-5)


def _op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_constant_pad_folds_and_fuses_into_conv() -> None:
    original = _pad_conv(value=0.0)
    graph = load_model(original)
    assert _op_types(graph.model) == ["Conv"]
    conv = graph.model.graph.node[0]
    assert conv.input[0] == "x"
    pads = next(a for a in conv.attribute if a.name == "pads")
    assert list(pads.ints) == [1, 1, 1, 1]  # the Conv's [1, 0, 0, 1] plus the Pad's [0, 1, 1, 0]
    assert any("folded" in c for c in graph.changes)
    assert any("fused 1 zero Pad" in c for c in graph.changes)
    assert {t.name for t in graph.model.graph.initializer} == {"w"}
    _assert_same_outputs(original, graph.model,
                         {"x": _RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)})


@pytest.mark.parametrize(
    ("mode", "value", "extra"),
    [("reflect", None, ""), ("constant", 1.5, ""),
     ("constant", None, "r = Relu (padded)")],
    ids=["reflect", "nonzero-value", "read-by-relu-too"],
)
def test_pads_that_are_not_zero_padding_of_convs_stay(mode: str, value: float | None,
                                                       extra: str) -> None:
    original = _pad_conv(mode, value, extra)
    if extra:  # a second, non-Conv reader of the padded tensor, visible as a graph output
        original.graph.output.append(helper.make_tensor_value_info("r", 1, None))
    graph = load_model(original)
    assert "Pad" in _op_types(graph.model)
    assert not any("fused" in c for c in graph.changes)
    _assert_same_outputs(original, graph.model,
                         {"x": _RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)})


def test_channel_padding_is_not_fused() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[1, 2, 8, 8] x) => (float[1, 4, 6, 6] y) {
        pads = Constant <value = int64[8] {0, 1, 0, 0, 0, 0, 0, 0}> ()
        padded = Pad (x, pads)
        y = Conv (padded, w)
    }
    """
    original = _model(text, _W)
    graph = load_model(original)
    assert _op_types(graph.model) == ["Pad", "Conv"]
    _assert_same_outputs(original, graph.model,
                         {"x": _RNG.standard_normal((1, 2, 8, 8)).astype(np.float32)})


def test_transposed_weight_becomes_an_initializer_of_the_matmul() -> None:
    weight = numpy_helper.from_array(_RNG.standard_normal((5, 3)).astype(np.float32), "wt")
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[N, 3] x) => (float[N, 5] y) {
        w = Transpose <perm = [1, 0]> (wt)
        y = MatMul (x, w)
    }
    """
    original = _model(text, weight)
    graph = load_model(original)
    matmul = graph.nodes[graph.model.graph.node[0].name]
    assert matmul.op_type == "MatMul" and matmul.weights == ("w",)
    assert graph.initializers["w"].shape == (3, 5)
    _assert_same_outputs(original, graph.model,
                         {"x": _RNG.standard_normal((4, 3)).astype(np.float32)})


def test_folding_keeps_initializers_read_inside_subgraphs() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    agraph (float[2] x, bool c) => (float[2] y) {
        two = Constant <value = float[2] {2.0, 2.0}> ()
        four = Add (two, two)
        y = If (c) <
            then_branch = g1 () => (float[2] a) { a = Mul (x, four) },
            else_branch = g2 () => (float[2] b) { b = Mul (x, two) }
        >
    }
    """
    original = _model(text)
    graph = load_model(original)
    assert {"two", "four"} <= {t.name for t in graph.model.graph.initializer}
    assert _op_types(graph.model) == ["If"]
    for flag in (True, False):
        _assert_same_outputs(original, graph.model,
                             {"x": np.array([1.0, -3.0], np.float32), "c": np.array(flag)})


def _constant_of_shape(elements: int) -> onnx.ModelProto:
    """x + max(ConstantOfShape([elements])): a few bytes of file, ``4 * elements`` when folded."""
    return _model(f"""
<ir_version: 8, opset_import: ["" : 17]>
bomb (float[N, 4] x) => (float[N, 4] y) {{
    shape = Constant <value = int64[1] {{{elements}}}> ()
    big = ConstantOfShape <value = float[1] {{1.0}}> (shape)
    top = ReduceMax <keepdims = 1> (big)
    y = Add (x, top)
}}
""")


def test_folding_leaves_a_large_constant_to_the_runtime() -> None:
    """96 MiB is over FOLD_MAX_BYTES (64 MiB): left unfolded, and the model still runs."""
    graph = load_model(_constant_of_shape(24 << 20))
    assert [n.op_type for n in graph.model.graph.node] == ["ConstantOfShape", "ReduceMax", "Add"]
    assert not any("folded" in c for c in graph.changes)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(create_session(graph.model).run({"x": x})["y"], x + 1)


def test_constant_of_shape_bomb_is_refused_without_allocating() -> None:
    import tracemalloc

    from mpsearch.errors import ModelError

    tracemalloc.start()
    with pytest.raises(ModelError) as caught:
        load_model(_constant_of_shape(1 << 30))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 16 << 20
    assert str(caught.value) == (
        "ONNX graph 'bomb': node 'ConstantOfShape_1' (ConstantOfShape) would compute a 4.0 GiB "
        "tensor from 8 bytes of constants (limit 1 GiB); the file is malformed or hostile, "
        "re-export the model")
