"""Empirical bias correction (mpsearch.recovery._bias_correction), checked against NumPy."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mpsearch.assignment import uniform_assignment
from mpsearch.calibration import calibrate
from mpsearch.data import Dataset
from mpsearch.errors import QuantizationError
from mpsearch.graph import Node, load_model
from mpsearch.pipeline import prepare_inputs
from mpsearch.profiles import load_profile
from mpsearch.quantize import Quantizer
from mpsearch.recovery import (
    CorrectedQuantizer,
    InputMeans,
    conv_tap_means,
    correct_biases,
    input_hessians,
    input_means,
    output_shift,
)
from mpsearch.recovery._auto import _statistics
from mpsearch.runtime import create_session


def _numpy_conv(x: np.ndarray, w: np.ndarray, *, stride: int, pad: int, dilation: int,
                group: int) -> np.ndarray:
    """Direct convolution (no bias), the reference for the tap means."""
    n, c, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    xp = np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, cout, oh, ow))
    per = cout // group
    for o in range(cout):
        g = o // per
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, g * cin_g:(g + 1) * cin_g,
                           i * stride:i * stride + dilation * (kh - 1) + 1:dilation,
                           j * stride:j * stride + dilation * (kw - 1) + 1:dilation]
                out[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3))
    return out


def _node(op: str, **attributes: object) -> Node:
    return Node(name="n", op_type=op, domain="", inputs=("x", "w", "b"), outputs=("y",),
                attributes=MappingProxyType(dict(attributes)))


@pytest.mark.parametrize(("stride", "pad", "dilation", "group"),
                         [(1, 1, 1, 1), (2, 1, 1, 1), (2, 0, 2, 2), (1, 2, 1, 4)])
def test_conv_tap_means_give_the_exact_mean_output_shift(stride: int, pad: int, dilation: int,
                                                         group: int) -> None:
    rng = np.random.default_rng(stride + 10 * pad + 100 * dilation + group)
    x = rng.normal(loc=0.5, size=(5, 4, 9, 7))
    delta = rng.normal(size=(8, 4 // group, 3, 3))
    node = _node("Conv", strides=(stride, stride), pads=(pad,) * 4,
                 dilations=(dilation, dilation), group=group)
    taps = conv_tap_means(x.mean(axis=0), node, (3, 3))
    assert taps is not None and taps.shape == (4, 3, 3)
    expected = _numpy_conv(x, delta, stride=stride, pad=pad, dilation=dilation,
                           group=group).mean(axis=(0, 2, 3))
    np.testing.assert_allclose(output_shift(node, delta, taps), expected, rtol=1e-12,
                               atol=1e-12)


def test_same_upper_auto_pad_matches_explicit_pads() -> None:
    mean = np.random.default_rng(3).normal(size=(2, 6, 6))
    auto = conv_tap_means(mean, _node("Conv", auto_pad=b"SAME_UPPER", strides=(2, 2)), (3, 3))
    explicit = conv_tap_means(mean, _node("Conv", pads=(0, 0, 1, 1), strides=(2, 2)), (3, 3))
    assert auto is not None and explicit is not None
    np.testing.assert_array_equal(auto, explicit)


def test_gemm_shift_is_alpha_mean_times_delta() -> None:
    delta = np.arange(6, dtype=np.float64).reshape(3, 2)  # B is [K=2, N=3] transposed
    mean = np.array([1.0, -2.0])
    shift = output_shift(_node("Gemm", transB=1, alpha=0.5), delta, mean)
    np.testing.assert_allclose(shift, 0.5 * np.array([0 - 2, 2 - 6, 4 - 10]))


def conv_model() -> onnx.ModelProto:
    """x[N,2,6,6] -> Conv(2->3, 3x3, stride 2, pad 1) -> Relu -> Gemm(27->4, transB)."""
    rng = np.random.default_rng(0)
    arrays = {"c.w": rng.normal(size=(3, 2, 3, 3)).astype(np.float32),
              "c.b": rng.normal(size=3).astype(np.float32),
              "shape": np.array([-1, 27], np.int64),
              "g.w": rng.normal(size=(4, 27)).astype(np.float32),
              "g.b": rng.normal(size=4).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "c.w", "c.b"], ["c"], name="conv", strides=[2, 2],
                              pads=[1] * 4, kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "g.w", "g.b"], ["y"], name="gemm", transB=1)]
    graph = helper.make_graph(
        nodes, "cg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[numpy_helper.from_array(v, k) for k, v in arrays.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _data(n: int = 32) -> Dataset:
    x = np.random.default_rng(1).normal(loc=0.3, size=(n, 2, 6, 6)).astype(np.float32)
    return Dataset(inputs={"x": x}, source="test")


def _initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


def test_input_means_match_numpy() -> None:
    graph, data = load_model(conv_model()), _data()
    means = input_means(graph, data, batch_size=7)
    x = data.inputs["x"].astype(np.float64)
    assert means.samples == 32 and sorted(means.taps) == ["conv", "gemm"]
    expected = conv_tap_means(x.mean(axis=0), graph.nodes["conv"], (3, 3))
    np.testing.assert_allclose(means.taps["conv"], expected, rtol=1e-6)
    conv = _numpy_conv(x, graph.initializers["c.w"].astype(np.float64), stride=2, pad=1,
                       dilation=1, group=1) + graph.initializers["c.b"].reshape(1, 3, 1, 1)
    flat = np.maximum(conv, 0.0).reshape(32, 27)
    np.testing.assert_allclose(means.taps["gemm"], flat.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_input_means_of_a_fixed_batch_sequence_gemm_are_per_row() -> None:
    """A recognizer written with batch 1 whose Gemm reads [steps x batch, features] (as
    ddddocr's LSTM head does): the mean is over rows, not samples, and the model runs a
    sample at a time however large the requested batch."""
    rng = np.random.default_rng(2)
    arrays = {"shape": np.array([-1, 3], np.int64),
              "g.w": rng.normal(size=(2, 3)).astype(np.float32),
              "g.b": rng.normal(size=2).astype(np.float32)}
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["rows"], name="rows"),
             helper.make_node("Gemm", ["rows", "g.w", "g.b"], ["y"], name="gemm", transB=1)]
    graph = helper.make_graph(
        nodes, "seq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 2])],
        initializer=[numpy_helper.from_array(v, k) for k, v in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.normal(loc=0.5, size=(6, 5, 3)).astype(np.float32)
    means = input_means(load_model(model), Dataset(inputs={"x": x}, source="t"), batch_size=4)
    assert means.samples == 6
    np.testing.assert_allclose(means.taps["gemm"], x.reshape(-1, 3).mean(axis=0), rtol=1e-6)


def test_corrected_biases_remove_the_mean_shift_of_the_quantized_weights() -> None:
    graph, data = load_model(conv_model()), _data()
    profile = load_profile("x86_ort_avx2")
    table = calibrate(graph, data)
    means = input_means(graph, data)
    plain = Quantizer(graph, table, profile).build(uniform_assignment(graph, profile, "int8"))
    fixed = correct_biases(plain, graph, means)
    for node, weight, bias in (("conv", "c.w__i8c0", "c.b__i32"),
                               ("gemm", "g.w__i8c0", "g.b__i32")):
        codes = _initializer(plain, f"{weight}_q").astype(np.float64)
        scale = _initializer(plain, f"{weight}_scale").astype(np.float64)
        w_q = codes * scale.reshape(-1, *([1] * (codes.ndim - 1)))
        delta = w_q - graph.initializers[node[0] + ".w"]
        shift = output_shift(graph.nodes[node], delta, means.taps[node])
        bias_scale = _initializer(plain, f"{bias}_scale").astype(np.float64)
        before = _initializer(plain, f"{bias}_q").astype(np.float64)
        after = _initializer(fixed, f"{bias}_q")
        assert after.dtype == np.int32
        original = graph.initializers[node[0] + ".b"].astype(np.float64)
        np.testing.assert_array_equal(after, np.round((original - shift) / bias_scale))
        assert np.abs(after - before).max() >= 1  # the shift is visible on the int32 grid
    untouched = {t.name for t in plain.graph.initializer} - {"c.b__i32_q",
                                                             "g.b__i32_q"}
    for name in untouched:
        np.testing.assert_array_equal(_initializer(fixed, name), _initializer(plain, name))


def test_the_shift_memo_gives_the_same_model_and_tells_grids_apart() -> None:
    """A memoized correction equals the computed one, build after build, and a weight on
    another grid (int16) gets a shift of its own."""
    graph, data = load_model(conv_model()), _data()
    profile = load_profile("x86_ort_avx2")
    means = input_means(graph, data)
    quantizer = Quantizer(graph, calibrate(graph, data), profile)
    shifts: dict[tuple[str, bytes], np.ndarray] = {}
    for fmt in ("int8", "int16", "int8"):
        plain = quantizer.build(uniform_assignment(graph, profile, fmt))
        memoized = correct_biases(plain, graph, means, shifts=shifts)
        assert memoized.SerializeToString() == correct_biases(plain, graph,
                                                              means).SerializeToString()
    assert sorted(name for name, _ in shifts) == ["conv", "conv", "gemm", "gemm"]


def test_the_mean_conv_output_with_quantized_weights_matches_fp32() -> None:
    """E[W_q x + b'] == E[W x + b] per channel on the calibration data, up to the bias grid."""
    graph, data = load_model(conv_model()), _data()
    profile = load_profile("x86_ort_avx2")
    means = input_means(graph, data)
    quantizer = Quantizer(graph, calibrate(graph, data), profile)
    fixed = correct_biases(quantizer.build(uniform_assignment(graph, profile, "int8")), graph,
                           means)
    x = data.inputs["x"].astype(np.float64)
    w_q = (_initializer(fixed, "c.w__i8c0_q").astype(np.float64)
           * _initializer(fixed, "c.w__i8c0_scale").reshape(-1, 1, 1, 1))
    bias_scale = _initializer(fixed, "c.b__i32_scale").astype(np.float64)
    b_fixed = _initializer(fixed, "c.b__i32_q") * bias_scale
    ours = _numpy_conv(x, w_q, stride=2, pad=1, dilation=1, group=1).mean(axis=(0, 2, 3))
    fp32 = _numpy_conv(x, graph.initializers["c.w"].astype(np.float64), stride=2, pad=1,
                       dilation=1, group=1).mean(axis=(0, 2, 3))
    error = np.abs(ours + b_fixed - fp32 - graph.initializers["c.b"])
    assert np.all(error <= bias_scale / 2 + 1e-9), (error, bias_scale)
    uncorrected = _initializer(quantizer.build(uniform_assignment(graph, profile, "int8")),
                               "c.b__i32_q") * bias_scale
    assert np.abs(ours + uncorrected - fp32 - graph.initializers["c.b"]).max() > 10 * float(
        bias_scale.max())


def test_one_pass_gives_the_means_and_hessians_of_two() -> None:
    """Small calibration data: bias correction's means and GPTQ's Hessians from one FP32
    pass, each tensor both read exposed once, equal to their own passes'."""
    graph, data = load_model(conv_model()), _data(20)
    means, hessians = _statistics(graph, data, means=True, hessians=True, threads=2)
    assert means is not None and hessians is not None
    alone = input_means(graph, data)
    assert means.samples == alone.samples == 20 and set(means.taps) == {"conv", "gemm"}
    for node, taps in alone.taps.items():
        np.testing.assert_allclose(means.taps[node], taps, rtol=1e-12)
    hessians_alone = input_hessians(graph, data)
    assert hessians.samples == hessians_alone.samples == 20
    assert set(hessians.hessians) == set(hessians_alone.hessians) == {"conv", "gemm"}
    for node, hessian in hessians_alone.hessians.items():
        np.testing.assert_allclose(hessians.hessians[node], hessian, rtol=1e-6)


def test_float_nodes_are_left_alone() -> None:
    graph, data = load_model(conv_model()), _data()
    profile = load_profile("x86_ort_avx2")
    model = Quantizer(graph, calibrate(graph, data), profile).build({})
    fixed = correct_biases(model, graph, input_means(graph, data))
    assert fixed.SerializeToString() == model.SerializeToString()


def test_corrected_quantizer_checks_the_means_belong_to_the_graph() -> None:
    graph, data = load_model(conv_model()), _data()
    stale = InputMeans(model_fingerprint="0" * 16, samples=1, taps={})
    with pytest.raises(QuantizationError, match="the input means are of model 0000000000000000"):
        CorrectedQuantizer(graph, calibrate(graph, data), load_profile("x86_ort_avx2"),
                           means=stale)


def test_pipeline_prepares_corrected_builds_that_ort_runs(fixtures_dir: Path,
                                                          digits: Dataset) -> None:
    prepared = prepare_inputs(fixtures_dir / "mobilenetv2.onnx", "x86_ort_avx2", digits,
                              calibration_samples=64, cle=True, bias_correction=True)
    assert isinstance(prepared.quantizer, CorrectedQuantizer)
    assert prepared.means is not None and prepared.means.samples == 64
    assert len(prepared.means.taps) == 18  # 17 Convs and the Gemm
    model = prepared.quantizer.build(uniform_assignment(prepared.graph, prepared.profile,
                                                          "int8"))
    onnx.checker.check_model(model)
    out = create_session(model).run(next(iter(prepared.validation.batches(8))))
    assert out[prepared.graph.outputs[0].name].shape == (8, 10)


def test_input_means_of_a_model_with_nothing_to_correct_are_empty() -> None:
    model = conv_model()
    model.graph.node[0].input.pop()  # the Conv without a bias, the Gemm reading a Reshape
    model.graph.node[3].input.pop()
    means = input_means(load_model(model), _data(8))
    assert means.samples == 8 and dict(means.taps) == {}
