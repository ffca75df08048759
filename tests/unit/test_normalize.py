"""Load-time rewrites: each one keeps the model's outputs (checked with float ONNX Runtime)."""

from __future__ import annotations

from pathlib import Path

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


# Paddle-style opset-12 export: every node unnamed, a Constant-held weight, and the four ops
# whose attributes the 12 -> 13 converter turns into inputs (it adds unnamed Constant nodes).
_OPSET12 = """
<ir_version: 7, opset_import: ["" : 12]>
agraph (float[N, 3, 8, 8] x) => (float[N, 10] y) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w)
    r = Relu (c)
    s1, s2 = Split <axis = 1, split = [2, 2]> (r)
    a = Add (s1, s2)
    red = ReduceSum <axes = [3], keepdims = 0> (a)
    u = Unsqueeze <axes = [1]> (red)
    q = Squeeze <axes = [1]> (u)
    f = Flatten (q)
    fc = Constant <value = float[10, 16] {FC}> ()
    y = Gemm <transB = 1> (f, fc)
}
"""


def _opset12_model() -> onnx.ModelProto:
    fc = ", ".join(f"{v:.4f}" for v in _RNG.standard_normal(160) * 0.25)
    return _model(_OPSET12.replace("FC", fc), _W)


def test_opset12_export_with_unnamed_nodes_loads_valid_and_runs_the_same() -> None:
    original = _opset12_model()
    assert not any(n.name for n in original.graph.node)
    graph = load_model(original)
    assert graph.opset == 13 and "upgraded opset 12 -> 13" in graph.changes
    names = [n.name for n in graph.model.graph.node]
    assert len(names) == len(set(names)) == len(graph.nodes)
    assert "" not in names
    assert list(graph.order) == names  # the file is in topological order
    onnx.checker.check_model(graph.model, full_check=True)
    assert [graph.nodes[n].op_type for n in graph.order] == [
        "Conv", "Relu", "Split", "Add", "ReduceSum", "Unsqueeze", "Squeeze", "Flatten", "Gemm"]
    assert graph.nodes[graph.order[-1]].weights == ("fc",)
    _assert_same_outputs(original, graph.model,
                         {"x": _RNG.standard_normal((3, 3, 8, 8)).astype(np.float32)})


def test_unnamed_nodes_added_by_a_rewrite_are_named_and_sorted() -> None:
    from mpsearch import _normalize

    model = _opset12_model()
    last = model.graph.node[-1]
    model.graph.node.remove(last)
    model.graph.node.insert(0, last)  # a reader before its producers
    model.graph.node[1].name = model.graph.node[2].name = "dup"
    changes: list[str] = []
    _normalize.name_nodes(model, changes)
    _normalize.sort_nodes(model, changes)
    names = [n.name for n in model.graph.node]
    assert len(set(names)) == len(names) and names.count("dup") == 1
    assert model.graph.node[-1].op_type == "Gemm"
    assert changes == ["named 9 unnamed or duplicate nodes", "sorted the nodes topologically"]
    onnx.checker.check_model(model)


def test_a_real_cycle_is_reported_with_a_node_on_it() -> None:
    from mpsearch.errors import ModelError

    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["b"], ["a"], name="first"),
         helper.make_node("Relu", ["a"], ["b"], name="second")],
        "loop", [helper.make_tensor_value_info("x", 1, [1])],
        [helper.make_tensor_value_info("b", 1, [1])]))
    with pytest.raises(ModelError, match="has a cycle .node 'first' .Relu. is on a cycle"):
        load_model(model)


@pytest.mark.slow
def test_opset12_export_quantizes_to_int8_in_ort_and_searches(tmp_path: Path) -> None:
    import mpsearch
    from mpsearch.data import Dataset
    from mpsearch.pipeline import search_run
    from mpsearch.spec import load_spec

    original = _opset12_model()
    graph = load_model(original)
    x = np.random.default_rng(1).standard_normal((128, 3, 8, 8)).astype(np.float32)
    profile = mpsearch.load_profile("x86_ort_auto")  # ORT's int8 kernels exact on this CPU
    table = mpsearch.calibrate(graph, Dataset(inputs={"x": x}))
    int8 = mpsearch.uniform_assignment(graph, profile, "int8")
    assert sorted(graph.nodes[n].op_type for n, f in int8.items() if f == "int8") == [
        "Add", "Conv", "Gemm", "Relu"]
    quantized = mpsearch.build_qdq(graph, table, profile, int8)
    onnx.checker.check_model(quantized)
    reference = _outputs(original, {"x": x})["y"]
    output = _outputs(quantized, {"x": x})["y"]
    # measured: max error 1.3 % of the output range, top-1 agreement 125/128
    assert np.abs(output - reference).max() <= 0.02 * np.ptp(reference)
    assert (output.argmax(1) == reference.argmax(1)).mean() >= 0.95

    onnx.save(original, tmp_path / "opset12.onnx")
    np.savez(tmp_path / "data.npz", x=x)
    (tmp_path / "spec.yaml").write_text(
        f"model: {tmp_path / 'opset12.onnx'}\nprofile: x86_ort_auto\n"
        f"data: {{source: {tmp_path / 'data.npz'}, calibration: 64, held_out: 0.5}}\n"
        "metric: agreement\nbudget: {trials: 4}\nevaluation: {sensitivity_samples: 32}\n"
        "seed: 0\n")
    run = search_run(load_spec(tmp_path / "spec.yaml"), tmp_path / "run")
    assert run.front.points
    assert min(p.size for p in run.front.points) == mpsearch.model_size(graph, profile, int8)


def test_a_negative_dim_value_is_a_dynamic_dimension() -> None:
    # Paddle2ONNX writes a dynamic batch as dim_value -1 (PP-OCR's direction classifier)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [-1, 3])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [-1, 3])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "paddle", [x], [y]),
        opset_imports=[helper.make_opsetid("", 13)])
    graph = load_model(model)
    assert graph.inputs[0].shape == (None, 3)
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


def _conv_bn(*, group: int = 1, conv_bias: bool = True, shared_weight: bool = False,
             conv_output_read: bool = False, training: bool = False) -> onnx.ModelProto:
    """x[N,4,6,6] -> Conv(4->4, 3x3, groups) -> BatchNormalization -> y, with the variants the
    folding must refuse or handle (another reader of the Conv output, a weight shared with a
    second Conv, training mode)."""
    rng = np.random.default_rng(3)
    arrays = {"w": rng.normal(size=(4, 4 // group, 3, 3)),
              "b": rng.normal(size=4),
              "scale": rng.uniform(0.5, 2.0, 4), "beta": rng.normal(size=4),
              "mean": rng.normal(size=4), "var": rng.uniform(0.1, 3.0, 4)}
    conv_inputs = ["x", "w", "b"] if conv_bias else ["x", "w"]
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], name="conv", pads=[1] * 4,
                              group=group),
             helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"],
                              ["y", "running_mean", "running_var"] if training else ["y"],
                              name="bn", epsilon=1e-3,
                              **({"training_mode": 1} if training else {}))]
    outputs = [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]
    if shared_weight:
        nodes.append(helper.make_node("Conv", ["x", "w"], ["z"], name="other", pads=[1] * 4,
                                      group=group))
        outputs.append(helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None))
    if conv_output_read:
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="relu"))
        outputs.append(helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "conv_bn", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                         ["N", 4, 6, 6])], outputs,
        initializer=[numpy_helper.from_array(v.astype(np.float32), k)
                     for k, v in arrays.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


@pytest.mark.parametrize(("group", "conv_bias", "shared_weight"),
                         [(1, True, False), (1, False, False), (4, True, False),
                          (2, False, True)])
def test_batch_norm_folds_into_the_conv_before_it(group: int, conv_bias: bool,
                                                  shared_weight: bool) -> None:
    model = _conv_bn(group=group, conv_bias=conv_bias, shared_weight=shared_weight)
    graph = load_model(model)
    assert "BatchNormalization" not in _op_types(graph.model)
    assert any("folded 1 BatchNormalization" in c for c in graph.changes)
    conv = graph.nodes["conv"]
    assert conv.outputs == ("y",) and len(conv.inputs) == 3
    # the folded weight is W * scale / sqrt(var + eps) per output channel, in float64
    init = {t.name: numpy_helper.to_array(t).astype(np.float64)
            for t in model.graph.initializer}
    factor = init["scale"] / np.sqrt(init["var"] + 1e-3)
    np.testing.assert_allclose(graph.initializers[conv.inputs[1]],
                               init["w"] * factor[:, None, None, None], rtol=1e-6)
    bias = init["b"] if conv_bias else 0.0
    np.testing.assert_allclose(graph.initializers[conv.inputs[2]],
                               (bias - init["mean"]) * factor + init["beta"], rtol=1e-6,
                               atol=1e-7)
    if shared_weight:  # the other Conv still reads the original weight
        assert graph.nodes["other"].inputs[1] == "w" and conv.inputs[1] != "w"
    x = np.random.default_rng(4).normal(size=(3, 4, 6, 6)).astype(np.float32)
    _assert_same_outputs(model, graph.model, {"x": x})


@pytest.mark.parametrize("variant", ["conv_output_read", "training"])
def test_batch_norm_that_cannot_fold_stays(variant: str) -> None:
    model = _conv_bn(**{variant: True})
    graph = load_model(model)
    assert "BatchNormalization" in _op_types(graph.model)
    assert not any("BatchNormalization" in c for c in graph.changes)


@pytest.mark.parametrize(("trans_b", "bias"), [(1, True), (0, True), (1, False)])
def test_batch_norm_after_a_linear_layer_folds_into_the_gemm(trans_b: int, bias: bool) -> None:
    """PyTorch's Linear -> BatchNorm1d: the Gemm's output channels are B's rows (transB) or
    columns; a Gemm with alpha or beta != 1 is left alone."""
    rng = np.random.default_rng(7)
    w = rng.normal(size=(5, 3) if trans_b else (3, 5))
    arrays = {"w": w, "c": rng.normal(size=5), "scale": rng.uniform(0.5, 2, 5),
              "beta": rng.normal(size=5), "mean": rng.normal(size=5),
              "var": rng.uniform(0.1, 3, 5)}
    gemm_inputs = ["x", "w", "c"] if bias else ["x", "w"]
    graph = helper.make_graph(
        [helper.make_node("Gemm", gemm_inputs, ["g"], name="fc", transB=trans_b),
         helper.make_node("BatchNormalization", ["g", "scale", "beta", "mean", "var"], ["y"],
                          name="bn")],
        "fc_bn", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 5])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k)
                     for k, v in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    folded = load_model(model)
    assert _op_types(folded.model) == ["Gemm"]
    x = np.random.default_rng(8).normal(size=(6, 3)).astype(np.float32)
    _assert_same_outputs(model, folded.model, {"x": x})
    scaled = onnx.ModelProto()
    scaled.CopyFrom(model)
    scaled.graph.node[0].attribute.append(helper.make_attribute("alpha", 0.5))
    assert "BatchNormalization" in _op_types(load_model(scaled).model)
