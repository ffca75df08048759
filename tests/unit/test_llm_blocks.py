"""Weight-only block formats: exact sizes, packing, RTN bounds, the search methods on synthetic
weights, and the MatMulNBits export run in ONNX Runtime against x @ dequantize(W)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from mpsearch.errors import DataError, QuantizationError, SpecError
from mpsearch.kernels._kquant import kquant_search, kquant_search_numpy
from mpsearch.llm._export import export_weight_only
from mpsearch.llm._formats import BlockFormat, parse_format, unpack_codes
from mpsearch.llm._gptq import _feeds, collect_hessians, gptq, matmul_weights
from mpsearch.llm._quant import hqq, kquant, rtn, weighted_error
from mpsearch.runtime import create_session

ALL = [f"w{b}b{k}{z}" for b in (2, 4, 8) for k in (32, 64, 128) for z in "saf"]


def test_names_round_trip_and_bad_names() -> None:
    for name in [*ALL, "fp16", "fp32"]:
        assert parse_format(name).name == name
    assert parse_format("w4b32a") == BlockFormat(bits=4, block=32, zero="uint8")
    for bad in ("w3b32a", "w4b48s", "w4b32", "int4", "w4b32x"):
        with pytest.raises(SpecError):
            parse_format(bad)


def test_bits_per_weight_576x1536_exact() -> None:
    # K=576 in, N=1536 out: 18/9/5 blocks (576/128 = 4.5: the last block is padded)
    k, n = 576, 1536
    expected = {"w4b32s": 5.0, "w4b32a": 5.125, "w4b32f": 6.0, "w4b128a": 4 * 5 * 128 / 576
                + (5 * 32 + 3 * 8) / 576, "w2b64s": 2.5, "w2b64a": 2.5 + 3 * 8 / 576,
                "w8b128s": 8 * 640 / 576 + 5 * 32 / 576, "fp16": 16.0, "fp32": 32.0}
    for name, bpw in expected.items():
        assert parse_format(name).bits_per_weight(k, n) == pytest.approx(bpw, abs=1e-12), name


def test_storage_equals_the_packed_tensors() -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((200, 24)).astype(np.float32)  # K not a multiple of blocks
    for name in ALL:
        fmt = parse_format(name)
        q = rtn(weight, fmt)
        packed = q.packed()
        sizes = {key: value.nbytes for key, value in packed.items()}
        assert sizes == fmt.storage(200, 24), name
        assert packed["B"].shape == (24, fmt.n_blocks(200), fmt.block * fmt.bits // 8)
        codes = unpack_codes(packed["B"].reshape(24, -1), fmt.bits)
        np.testing.assert_array_equal(codes, q.codes)


def test_rtn_error_within_half_a_step() -> None:
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((256, 40)) * rng.uniform(0.01, 2, (1, 40))).astype(np.float32)
    for name in ALL:
        fmt = parse_format(name)
        q = rtn(weight, fmt)
        err = np.abs(weight - q.dequantize()).T.reshape(40, -1, fmt.block)
        step = np.abs(q.scales)[:, :, None]
        if fmt.symmetric:
            # the peak maps to -2^(b-1) steps; the other side stops at 2^(b-1) - 1 steps
            values = weight.T.reshape(40, -1, fmt.block) / q.scales[:, :, None]
            inside = values <= fmt.default_zero - 0.5
            assert np.all(err[~inside] <= step.repeat(fmt.block, -1)[~inside] * 1.0001), name
            err = np.where(inside, err, 0.0)
        assert np.all(err <= step * 0.5001 + 1e-7), name


def test_methods_never_worse_than_rtn_on_their_objective() -> None:
    rng = np.random.default_rng(2)
    k, n = 128, 32
    weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    x = rng.standard_normal((512, k)) @ (np.eye(k) + 0.2 * rng.standard_normal((k, k)))
    h = x.T @ x / len(x)
    for name in ("w4b64a", "w2b32f", "w4b128s"):
        fmt = parse_format(name)
        base = weighted_error(weight, rtn(weight, fmt).dequantize(), h)
        diag = weighted_error(weight, rtn(weight, fmt).dequantize(), np.diag(h))
        ks = weighted_error(weight, kquant(weight, fmt, np.diag(h)).dequantize(), np.diag(h))
        g = weighted_error(weight, gptq(weight, fmt, h, act_order=True).dequantize(), h)
        assert ks < diag and g < 0.7 * base, (name, ks / diag, g / base)
        if not fmt.symmetric:
            hq = weighted_error(weight, hqq(weight, fmt, np.diag(h)).dequantize(), np.diag(h))
            assert hq <= diag, name
    with pytest.raises(SpecError, match="asymmetric"):
        hqq(weight, parse_format("w4b32s"))


def _model(k: int, sizes: tuple[int, ...], seed: int) -> tuple[onnx.ModelProto, list[str]]:
    """x [2, 3, k] -> MatMul W0 -> MatMul W1 -> ... -> y, with names that collide with the
    ones the export would pick (W0_Q4, W0_scales, ...)."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev, dims = [], [], "x", (k, *sizes)
    for i in range(len(sizes)):
        w = (rng.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"W{i}"))
        out = f"W{i}_scales" if i == 0 else f"h{i}"  # a tensor named like a fresh scale
        nodes.append(helper.make_node("MatMul", [prev, f"W{i}"], [out], name=f"W{i}_Q4"))
        prev = out
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="W0_MatMulNBits"))
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, k])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3, dims[-1]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), [
        f"W{i}" for i in range(len(sizes))]


@pytest.mark.parametrize("level, tol", [(1, 2e-5), (4, 3e-2)])
def test_export_runs_in_ort_and_matches_dequantized(level: int, tol: float) -> None:
    model, names = _model(200, (96, 64, 48, 40), seed=3)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    h = np.eye(96)
    choices = {names[0]: rtn(weights[names[0]], parse_format("w4b32a")),
               names[1]: gptq(weights[names[1]], parse_format("w2b64s"), h),
               names[2]: parse_format("w8b128a"),
               names[3]: parse_format("fp16")}
    out = export_weight_only(model, choices, accuracy_level=level)
    onnx.checker.check_model(out)
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("MatMulNBits") == 3 and ops.count("Cast") == 1
    assert not {"W0", "W1", "W2"} & {t.name for t in out.graph.initializer}
    all_names = [t.name for t in out.graph.initializer] + [n.name for n in out.graph.node]
    assert len(all_names) == len(set(all_names))
    x = np.random.default_rng(4).standard_normal((2, 3, 200)).astype(np.float32)
    ref = x.astype(np.float64)
    for name in names:
        choice = choices[name]
        if isinstance(choice, BlockFormat):
            w = (weights[name].astype(np.float16) if choice.is_float
                 else rtn(weights[name], choice).dequantize())
        else:
            w = choice.dequantize()
        ref = ref @ np.asarray(w, np.float64)
    y = create_session(out).run({"x": x})["y"]
    rel = float(np.max(np.abs(y - ref)) / np.max(np.abs(ref)))
    assert rel < tol, rel


def test_export_rejects_what_it_cannot_write() -> None:
    model, _ = _model(64, (32,), seed=5)
    with pytest.raises(QuantizationError, match="no MatMul or Gather takes"):
        export_weight_only(model, {"x": parse_format("w4b32a")})
    with pytest.raises(QuantizationError, match="accuracy_level"):
        export_weight_only(model, {"W0": parse_format("w4b32a")}, accuracy_level=7)
    wrong = rtn(np.zeros((32, 64), np.float32), parse_format("w4b32a"))
    with pytest.raises(QuantizationError, match="64x32"):
        export_weight_only(model, {"W0": wrong})


def _lm(vocab: int, d: int, seed: int) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """input_ids -> Gather(E) -> MatMul W -> MatMul Transpose(E) -> logits: a tied head."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((vocab, d)).astype(np.float32)
    w = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["x"], name="embed"),
             helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
             helper.make_node("Transpose", ["E"], ["E_t"], perm=[1, 0], name="tie"),
             helper.make_node("MatMul", ["h", "E_t"], ["logits"], name="lm_head")]
    graph = helper.make_graph(
        nodes, "lm", [helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64,
                                                    [1, "seq"])],
        [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, "seq", vocab])],
        [numpy_helper.from_array(table, "E"), numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), table, w


@pytest.mark.parametrize("table_format", ["w4b128a", "w8b64s", "w2b32a", "fp16"])
def test_export_embedding_and_tied_head(table_format: str) -> None:
    # d=192: blocks of 128 pad the last one, so the gathered rows are sliced back
    model, table, w = _lm(300, 192, seed=6)
    fmt = parse_format(table_format)
    out = export_weight_only(model, {"E": fmt, "W": parse_format("w4b32s")}, accuracy_level=1)
    onnx.checker.check_model(out)
    ops = [n.op_type for n in out.graph.node]
    names = {t.name for t in out.graph.initializer}
    assert "E" not in names and "W" not in names
    if fmt.is_float:
        assert ops.count("Cast") == 1 and "Transpose" in ops
        e = table.astype(np.float16).astype(np.float64)
    else:
        assert "Transpose" not in ops and ops.count("MatMulNBits") == 2, ops
        assert ops.count("GatherBlockQuantized") == 1 and ops.count("Slice") == (fmt.block == 128)
        packed = [n for n in out.graph.node if n.op_type == "MatMulNBits"]
        assert packed[0].input[1] != packed[1].input[1]  # W's blocks and the table's
        e = rtn(np.ascontiguousarray(table.T), fmt).dequantize().T.astype(np.float64)
        # one copy of the table's packed blocks, shared by the gather and the head
        assert sum(t.name.startswith("E_Q") for t in out.graph.initializer) == 1
    ids = np.array([[5, 299, 0, 17, 5]], np.int64)
    ref = e[ids] @ rtn(w, parse_format("w4b32s")).dequantize().astype(np.float64) @ e.T
    y = create_session(out).run({"input_ids": ids})["logits"]
    assert float(np.max(np.abs(y - ref)) / np.max(np.abs(ref))) < 2e-5


def test_gather_refuses_float_zero_points() -> None:
    model, _, _ = _lm(64, 64, seed=7)
    with pytest.raises(QuantizationError, match="GatherBlockQuantized"):
        export_weight_only(model, {"E": parse_format("w4b32f")})


def test_collect_hessians_is_x_transpose_x() -> None:
    model, table, _ = _lm(300, 64, seed=8)
    windows = np.random.default_rng(9).integers(0, 300, (3, 11)).astype(np.int64)
    assert matmul_weights(model) == {"W": "x"}
    hessians = collect_hessians(model, windows)
    x = table[windows.reshape(-1)].astype(np.float64)
    np.testing.assert_allclose(hessians["W"], x.T @ x / x.shape[0], rtol=1e-6, atol=1e-9)


def test_docs_table_states_the_computed_sizes() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "llm-formats.md").read_text()
    cells = re.findall(r"\| (w\d+b\d+[saf]) \| ([\d.]+) \|", text)
    assert len(cells) == 27
    for name, bpw in cells:
        assert float(bpw) == round(parse_format(name).bits_per_weight(576, 1536), 3), name


@pytest.mark.parametrize("levels, kind", [(15, 0), (15, 1), (15, 2), (3, 0), (3, 1), (3, 2),
                                          (255, 1)])
def test_kquant_kernel_equals_its_numpy_twin(levels: int, kind: int) -> None:
    rng = np.random.default_rng(levels + kind)
    x = rng.standard_normal((300, 32)) * rng.uniform(0.01, 1, (300, 1))
    x[0] = 0.0  # a block of zeros: scale 0
    w = np.broadcast_to(rng.uniform(0.1, 3, (1, 32)), x.shape)
    got = kquant_search(x, w, levels, kind, 20)
    want = kquant_search_numpy(x, w, levels, kind, 20)
    np.testing.assert_array_equal(got[0], want[0])
    for g, e in zip(got[1:], want[1:], strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-15)


def test_hessian_feeds_cover_decoder_inputs() -> None:
    def inp(name: str, elem: int, shape: list[int | str]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, shape)

    graph = helper.make_graph(
        [], "decoder",
        [inp("input_ids", onnx.TensorProto.INT64, ["batch", "seq"]),
         inp("attention_mask", onnx.TensorProto.INT64, ["batch", "total"]),
         inp("position_ids", onnx.TensorProto.INT64, ["batch", "seq"]),
         inp("past_key_values.0.key", onnx.TensorProto.FLOAT, ["batch", 3, "past", 64])],
        [inp("input_ids", onnx.TensorProto.INT64, ["batch", "seq"])])
    feeds = _feeds(helper.make_model(graph), np.arange(7, dtype=np.int64)[None])
    assert {k: v.shape for k, v in feeds.items()} == {
        "input_ids": (1, 7), "attention_mask": (1, 7), "position_ids": (1, 7),
        "past_key_values.0.key": (1, 3, 0, 64)}
    np.testing.assert_array_equal(feeds["position_ids"][0], np.arange(7))
    assert feeds["attention_mask"].sum() == 7
    graph.input.append(inp("pixel_values", onnx.TensorProto.FLOAT, [1, 3]))
    with pytest.raises(DataError, match="pixel_values"):
        _feeds(helper.make_model(graph), np.zeros((1, 4), np.int64))
