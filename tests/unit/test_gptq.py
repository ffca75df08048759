"""GPTQ weight rounding (mpsearch.recovery._gptq): the Hessians against explicit input windows,
the rounding against the textbook sequential updates, and the builds it makes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mpsearch.assignment import uniform_assignment
from mpsearch.data import Dataset
from mpsearch.errors import QuantizationError
from mpsearch.graph import load_model
from mpsearch.pipeline import prepare_inputs
from mpsearch.quantize import Quantizer, code_range
from mpsearch.recovery import (
    CorrectedQuantizer,
    InputHessians,
    gptq_codes,
    gptq_factor,
    input_hessians,
    round_weight,
)
from mpsearch.recovery._gptq import BLOCK, DAMPING, MIN_SAMPLES, VECTORS_PER_DIMENSION
from mpsearch.runtime import create_session


def _model(nodes: list[onnx.NodeProto], arrays: dict[str, np.ndarray],
           inputs: list[tuple[str, list[int | str]]], outputs: list[str]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in arrays.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _window_gram(x: np.ndarray, kernel: tuple[int, ...], stride: int, pad: int,
                 dilation: int, group: int) -> np.ndarray:
    """[group, K, K]: sum over samples and output positions of the input window (one group's
    channels, then the kernel taps, row-major) times itself, by explicit loops."""
    rank = len(kernel)
    padded = np.pad(x.astype(np.float64), [(0, 0), (0, 0), *[(pad, pad)] * rank])
    outs = [(padded.shape[2 + i] - dilation * (k - 1) - 1) // stride + 1
            for i, k in enumerate(kernel)]
    per = x.shape[1] // group
    size = per * int(np.prod(kernel))
    gram = np.zeros((group, size, size))
    for n in range(x.shape[0]):
        for position in np.ndindex(*outs):
            window = padded[(n, slice(None), *(
                slice(p * stride, p * stride + dilation * (k - 1) + 1, dilation)
                for p, k in zip(position, kernel, strict=True)))]
            for g in range(group):
                vector = window[g * per:(g + 1) * per].reshape(-1)
                gram[g] += np.outer(vector, vector)
    return gram


@pytest.mark.parametrize(("kernel", "stride", "pad", "dilation", "group"),
                         [((3, 3), 1, 1, 1, 1), ((3, 3), 2, 1, 1, 1), ((3, 3), 2, 0, 2, 2),
                          ((3, 3), 1, 1, 1, 4), ((1, 1), 1, 0, 1, 1), ((5,), 2, 2, 1, 2)])
def test_conv_hessians_are_the_sums_of_their_input_windows(
        kernel: tuple[int, ...], stride: int, pad: int, dilation: int, group: int) -> None:
    rng = np.random.default_rng(len(kernel) + stride + 10 * pad + 100 * dilation + group)
    spatial = (9, 7)[:len(kernel)] if len(kernel) == 2 else (17,)
    x = rng.normal(loc=0.4, size=(7, 4, *spatial)).astype(np.float32)
    weight = rng.normal(size=(8, 4 // group, *kernel)).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=group,
                            strides=[stride] * len(kernel), pads=[pad] * 2 * len(kernel),
                            dilations=[dilation] * len(kernel))
    graph = load_model(_model([conv], {"w": weight}, [("x", ["N", 4, *spatial])], ["y"]))
    found = input_hessians(graph, Dataset(inputs={"x": x}, source="t"), samples=5,
                           batch_size=3)
    assert found.samples == 5 and sorted(found.hessians) == ["conv"]
    expected = _window_gram(x[:5], kernel, stride, pad, dilation, group)
    np.testing.assert_allclose(found.hessians["conv"], expected, rtol=2e-5, atol=1e-3)


def test_a_conv_with_many_positions_stops_summing_after_its_minimum_samples() -> None:
    """[N, 2, 48, 48] through a 3x3 Conv: 2304 windows of 18 dimensions a sample, so the sum
    holds VECTORS_PER_DIMENSION windows per dimension after two samples and stops at
    MIN_SAMPLES; a Gemm behind it sums every sample."""
    rng = np.random.default_rng(8)
    arrays = {"w": rng.normal(size=(1, 2, 3, 3)).astype(np.float32),
              "shape": np.array([-1, 48 * 48], np.int64),
              "g": rng.normal(size=(3, 48 * 48)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4),
             helper.make_node("Reshape", ["c", "shape"], ["rows"], name="rows"),
             helper.make_node("Gemm", ["rows", "g"], ["y"], name="gemm", transB=1)]
    graph = load_model(_model(nodes, arrays, [("x", ["N", 2, 48, 48])], ["y"]))
    x = rng.normal(size=(40, 2, 48, 48)).astype(np.float32)
    found = input_hessians(graph, Dataset(inputs={"x": x}, source="t"), samples=40,
                           batch_size=12)
    assert VECTORS_PER_DIMENSION * 18 <= 2 * 48 * 48 and MIN_SAMPLES < 40
    expected = _window_gram(x[:MIN_SAMPLES], (3, 3), 1, 1, 1, 1)
    np.testing.assert_allclose(found.hessians["conv"], expected, rtol=2e-5, atol=1e-3)
    session = create_session(graph.model, extra_outputs=["c"])
    rows = session.run({"x": x}, ["c"])["c"].reshape(40, -1).astype(np.float64)
    np.testing.assert_allclose(found.hessians["gemm"][0], rows.T @ rows, rtol=1e-4, atol=1e-3)


def test_gemm_and_matmul_hessians_are_gram_matrices_of_their_input_rows() -> None:
    """A MatMul reading [N, T, K] sums over every row of it; two MatMuls reading one tensor
    share one Hessian; a Gemm with transB = 0 gets its own; a weight two nodes read gets none."""
    rng = np.random.default_rng(5)
    arrays = {"q": rng.normal(size=(6, 4)).astype(np.float32),
              "k": rng.normal(size=(6, 3)).astype(np.float32),
              "shared": rng.normal(size=(6, 6)).astype(np.float32),
              "g": rng.normal(size=(4, 2)).astype(np.float32),
              "shape": np.array([-1, 4], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "q"], ["yq"], name="mq"),
             helper.make_node("MatMul", ["x", "k"], ["yk"], name="mk"),
             helper.make_node("MatMul", ["x", "shared"], ["s1"], name="s1"),
             helper.make_node("MatMul", ["s1", "shared"], ["s2"], name="s2"),
             helper.make_node("Reshape", ["yq", "shape"], ["rows"], name="rows"),
             helper.make_node("Gemm", ["rows", "g"], ["yg"], name="gemm")]
    graph = load_model(_model(nodes, arrays, [("x", ["N", 5, 6])], ["yk", "s2", "yg"]))
    x = rng.normal(size=(10, 5, 6)).astype(np.float32)
    found = input_hessians(graph, Dataset(inputs={"x": x}, source="t"), batch_size=4)
    assert sorted(found.hessians) == ["gemm", "mk", "mq"]
    flat = x.reshape(-1, 6).astype(np.float64)
    np.testing.assert_allclose(found.hessians["mq"][0], flat.T @ flat, rtol=1e-5)
    assert found.hessians["mq"] is found.hessians["mk"]
    rows = (flat @ arrays["q"]).reshape(-1, 4)
    np.testing.assert_allclose(found.hessians["gemm"][0], rows.T @ rows, rtol=1e-4, atol=1e-3)


def _sequential_gptq(w: np.ndarray, h: np.ndarray, scale: np.ndarray, qmin: int,
                     qmax: int) -> np.ndarray:
    """Textbook OBQ/GPTQ for one group [R, K]: damp, order by the diagonal, then for each
    column round it, spread its error with the inverse Hessian and drop it from the inverse."""
    k = h.shape[0]
    h = h.astype(np.float64).copy()
    h[np.diag(h) <= 0, np.diag(h) <= 0] = 1.0
    h += DAMPING * np.mean(np.diag(h)) * np.eye(k)
    order = np.argsort(-np.diag(h), kind="stable")
    w, inverse = w[:, order].astype(np.float64).copy(), np.linalg.inv(h[np.ix_(order, order)])
    codes = np.zeros_like(w)
    for i in range(k):
        codes[:, i] = np.clip(np.round(w[:, i] / scale), qmin, qmax)
        error = (w[:, i] - codes[:, i] * scale) / inverse[i, i]  # scale: [R]
        w[:, i:] -= np.outer(error, inverse[i, i:])
        inverse -= np.outer(inverse[:, i], inverse[i, :]) / inverse[i, i]
    return codes[:, np.argsort(order)]


def _correlated(rng: np.random.Generator, rows: int, inner: int) -> tuple[np.ndarray, ...]:
    """Inputs [N, K] with strongly correlated columns, a weight [R, K] and its symmetric
    int8 per-row scale."""
    mixing = rng.normal(size=(inner, inner)) + 3.0 * np.eye(inner)
    x = rng.normal(size=(4 * inner, inner)) @ mixing
    w = rng.normal(size=(rows, inner))
    return x, w, np.abs(w).max(axis=1) / 127


def test_gptq_codes_match_the_sequential_updates_across_blocks() -> None:
    rng = np.random.default_rng(11)
    inner = BLOCK + 45  # two blocks: the lazy update between them is exercised
    x, w, scale = _correlated(rng, 6, inner)
    h = x.T @ x
    h[7, :] = h[:, 7] = 0.0  # an input that is always zero
    codes = gptq_codes(w[None], h[None], scale[None], np.zeros((1, 6)), -128, 127)
    np.testing.assert_array_equal(codes[0], _sequential_gptq(w, h, scale, -128, 127))


def test_a_hessian_that_is_not_finite_leaves_the_weight_to_round_to_nearest() -> None:
    node = load_model(_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                             {"w": np.ones((3, 2), np.float32)}, [("x", ["N", 3])],
                             ["y"])).nodes["mm"]
    hessian = np.eye(3)[None]
    hessian[0, 1, 1] = np.inf
    assert round_weight(node, np.ones((3, 2)), hessian, np.full(2, 0.01), np.zeros(2), 1,
                        -128, 127) is None
    assert round_weight(node, np.ones((3, 2)), np.eye(3)[None], np.full(2, 0.01),
                        np.zeros(2), 1, -128, 127) is not None


def test_the_factor_memo_serves_every_grid_and_every_reader_within_its_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two MatMuls reading one tensor share one Hessian: each weight on two grids (7-bit and
    8-bit codes) takes one factorization in all, with the very codes of an unshared one; past
    the budget a factor is computed each time, and release frees the memo."""
    rng = np.random.default_rng(12)
    x, _, _ = _correlated(rng, 1, 24)
    arrays = {"a": rng.normal(size=(24, 5)).astype(np.float32),
              "b": rng.normal(size=(24, 3)).astype(np.float32)}
    graph = load_model(_model([helper.make_node("MatMul", ["x", "a"], ["ya"], name="ma"),
                               helper.make_node("MatMul", ["x", "b"], ["yb"], name="mb")],
                              arrays, [("x", ["N", 24])], ["ya", "yb"]))
    hessian = (x.T @ x)[None]
    memo = InputHessians(model_fingerprint=graph.fingerprint, samples=len(x),
                         hessians={"ma": hessian, "mb": hessian})
    calls: list[int] = []
    factor = gptq_factor

    def counted(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        calls.append(id(h))
        return factor(h)
    monkeypatch.setattr("mpsearch.recovery._gptq.gptq_factor", counted)
    for name, weight in (("ma", "a"), ("mb", "b")):
        array = arrays[weight]
        for qmax in (63, 127):
            scale = np.abs(array).max(axis=0) / qmax
            args = (graph.nodes[name], array, hessian, scale, np.zeros_like(scale), 1,
                    -qmax, qmax)
            shared = round_weight(*args, memo=memo)
            assert shared is not None
            np.testing.assert_array_equal(shared, round_weight(*args))
    assert len(calls) == 1 + 4  # the memo's one, then the four unshared calls
    assert set(memo.factors) == {id(hessian)}
    memo.release_factors()
    assert memo.factors == {}
    monkeypatch.setattr("mpsearch.recovery._gptq.FACTOR_BUDGET_BYTES", 0)
    calls.clear()
    for _ in range(2):
        memo.factor(hessian)
    assert len(calls) == 2 and memo.factors == {}


def test_gptq_with_a_diagonal_hessian_is_round_to_nearest() -> None:
    rng = np.random.default_rng(3)
    w = rng.normal(size=(2, 5, 40))
    scale, zero = np.full((2, 5), 0.02), np.full((2, 5), 3.0)
    hessian = np.stack([np.diag(rng.uniform(0.5, 2.0, 40)) for _ in range(2)])
    codes = gptq_codes(w, hessian, scale, zero, 0, 255)
    np.testing.assert_array_equal(codes, np.clip(np.round(w / scale[..., None]) + 3, 0, 255))


@pytest.mark.parametrize("reduce_range", [False, True])
def test_gptq_lowers_the_layer_output_error_on_correlated_inputs(reduce_range: bool) -> None:
    """Output error ||X (W - W_q)^T|| of GPTQ's codes against round-to-nearest on the same
    grid, codes inside the grid's range (AVX2's reduced [-64, 64] included)."""
    rng = np.random.default_rng(4)
    x, w, scale = _correlated(rng, 32, 96)
    qmin, qmax = code_range("int8", reduce_range=reduce_range)
    scale = scale * (127 / qmax)
    nearest = np.clip(np.round(w / scale[:, None]), qmin, qmax)
    codes = gptq_codes(w[None], (x.T @ x)[None], scale[None], np.zeros((1, 32)), qmin,
                       qmax)[0]
    assert codes.min() >= qmin and codes.max() <= qmax
    assert np.array_equal(codes, np.round(codes))

    def error(c: np.ndarray) -> float:
        return float(np.linalg.norm(x @ (w - c * scale[:, None]).T))
    assert error(codes) < 0.75 * error(nearest), (error(codes), error(nearest))  # >= 2.5 dB


def _sqnr(reference: np.ndarray, value: np.ndarray) -> float:
    noise = float(np.sum((reference.astype(np.float64) - value) ** 2))
    return 10 * np.log10(float(np.sum(reference.astype(np.float64) ** 2)) / noise)


def test_gptq_builds_keep_the_plain_grid_and_raise_the_output_sqnr(fixtures_dir: Path,
                                                                  digits: Dataset) -> None:
    """The fixture MobileNetV2 at A16W8 (x86 ORT's int16: 8-bit weights, 16-bit
    activations, so weight rounding is the error that matters): the corrected build has the
    plain build's nodes, scales and zero points; its 8-bit weight codes move, stay in range and
    raise the output SQNR against FP32 on data the Hessians never saw; a16w16's 16-bit codes
    are the plain ones."""
    prepared = prepare_inputs(fixtures_dir / "mobilenetv2.onnx", "x86_ort", digits,
                              calibration_samples=128, gptq=True)
    graph, profile = prepared.graph, prepared.profile
    assert prepared.hessians is not None and len(prepared.hessians.hessians) == 18
    ours, plain = prepared.quantizer, Quantizer(graph, prepared.table, profile)
    assert isinstance(ours, CorrectedQuantizer)
    int16 = uniform_assignment(graph, profile, "int16")
    built, reference = ours.build(int16), plain.build(int16)
    assert [n.op_type for n in built.graph.node] == [n.op_type for n in reference.graph.node]
    codes = {t.name: numpy_helper.to_array(t) for t in built.graph.initializer}
    plain_codes = {t.name: numpy_helper.to_array(t) for t in reference.graph.initializer}
    moved = [n for n in codes if not np.array_equal(codes[n], plain_codes[n])]
    assert len(moved) == 18 and all(n.endswith("__i8c0_q") or n.endswith("__i8c1_q")
                                    for n in moved)
    assert all(codes[n].min() >= -128 and codes[n].max() <= 127 for n in moved)
    batch = next(iter(prepared.validation.batches(len(prepared.validation))))
    output = graph.outputs[0].name
    fp32 = create_session(graph.model).run(batch)[output]
    gains = [_sqnr(fp32, create_session(m).run(batch)[output]) for m in (built, reference)]
    assert gains[0] > gains[1] + 3.0, gains
    a16w16 = uniform_assignment(graph, profile, "a16w16")
    wide = {t.name: numpy_helper.to_array(t) for t in ours.build(a16w16).graph.initializer}
    wide_plain = {t.name: numpy_helper.to_array(t)
                  for t in plain.build(a16w16).graph.initializer}
    assert all(np.array_equal(wide[n], wide_plain[n]) for n in wide if "__i16c" in n)


def test_corrected_quantizer_checks_the_hessians_belong_to_the_graph(fixtures_dir: Path,
                                                                     digits: Dataset) -> None:
    prepared = prepare_inputs(fixtures_dir / "mobilenetv2.onnx", "x86_ort", digits,
                              calibration_samples=32)
    stale = InputHessians(model_fingerprint="0" * 16, samples=1, hessians={})
    with pytest.raises(QuantizationError, match="the input Hessians are of model 0{16}"):
        CorrectedQuantizer(prepared.graph, prepared.table, prepared.profile, hessians=stale)
