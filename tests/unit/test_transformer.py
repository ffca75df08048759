"""Transformer encoders: embedding tables stored quantized (weight-only), LayerNormalization,
Softmax, GELU (Erf), Gemm with transposed weights and attention MatMuls between two
activations, compared with ONNX Runtime's ``quantize_static`` on the same calibration samples.

The model is a one-layer BERT-like classifier written with ``onnx.helper`` from a seeded RNG."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mpsearch
from mpsearch.assignment import table_format
from mpsearch.data import Dataset
from mpsearch.graph import ModelGraph, load_model
from mpsearch.runtime import create_session
from mpsearch.search import group_nodes, seed_assignments
from mpsearch.testing.ort_baseline import ort_int8

VOCAB, HIDDEN, SEQ, FFN, CLASSES = 1000, 128, 16, 256, 8
def _tiny_bert(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int, scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)

    # rows of very different norms (frequent vs rare tokens): per-row scales matter
    rows = rng.standard_normal((VOCAB, HIDDEN)) * np.exp(rng.normal(0, 1.0, (VOCAB, 1))) * 0.5
    inits = [
        numpy_helper.from_array(rows.astype(np.float32), "word_embeddings"),
        w("position_embeddings", SEQ, HIDDEN, scale=0.1),
        numpy_helper.from_array(np.ones(HIDDEN, np.float32), "ln1_g"),
        numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "ln1_b"),
        w("wq", HIDDEN, HIDDEN, scale=HIDDEN ** -0.5),
        w("wk", HIDDEN, HIDDEN, scale=HIDDEN ** -0.5),
        w("wv", HIDDEN, HIDDEN, scale=HIDDEN ** -0.5),
        w("wo", HIDDEN, HIDDEN, scale=HIDDEN ** -0.5),
        numpy_helper.from_array(np.array(HIDDEN ** -0.5, np.float32), "inv_sqrt_d"),
        numpy_helper.from_array(np.ones(HIDDEN, np.float32), "ln2_g"),
        numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "ln2_b"),
        w("w1", HIDDEN, FFN, scale=HIDDEN ** -0.5), w("b1", FFN, scale=0.02),
        w("w2", FFN, HIDDEN, scale=FFN ** -0.5), w("b2", HIDDEN, scale=0.02),
        numpy_helper.from_array(np.array(2 ** -0.5, np.float32), "inv_sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        w("cls_w", CLASSES, HIDDEN, scale=HIDDEN ** -0.5), w("cls_b", CLASSES, scale=0.02),
    ]
    n = helper.make_node
    nodes = [
        n("Gather", ["word_embeddings", "input_ids"], ["tok"], name="embed"),
        n("Add", ["tok", "position_embeddings"], ["emb"], name="add_pos"),
        n("LayerNormalization", ["emb", "ln1_g", "ln1_b"], ["h0"], name="ln1", axis=-1),
        n("MatMul", ["h0", "wq"], ["q"], name="q"), n("MatMul", ["h0", "wk"], ["k"], name="k"),
        n("MatMul", ["h0", "wv"], ["v"], name="v"),
        n("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["qk"], name="scores"),  # two activations
        n("Mul", ["qk", "inv_sqrt_d"], ["qk_s"], name="scale"),
        n("Softmax", ["qk_s"], ["p"], name="softmax", axis=-1),
        n("MatMul", ["p", "v"], ["ctx"], name="context"),  # two activations
        n("MatMul", ["ctx", "wo"], ["att"], name="o"),
        n("Add", ["att", "h0"], ["res1"], name="res1"),
        n("LayerNormalization", ["res1", "ln2_g", "ln2_b"], ["h1"], name="ln2", axis=-1),
        n("MatMul", ["h1", "w1"], ["f1"], name="ffn1"),
        n("Add", ["f1", "b1"], ["f1b"], name="ffn1_b"),
        # GELU as exporters write it: x * 0.5 * (1 + erf(x / sqrt 2))
        n("Mul", ["f1b", "inv_sqrt2"], ["g0"], name="gelu_div"),
        n("Erf", ["g0"], ["g1"], name="gelu_erf"),
        n("Add", ["g1", "one"], ["g2"], name="gelu_add"),
        n("Mul", ["f1b", "g2"], ["g3"], name="gelu_mul"),
        n("Mul", ["g3", "half"], ["g4"], name="gelu_half"),
        n("MatMul", ["g4", "w2"], ["f2"], name="ffn2"),
        n("Add", ["f2", "b2"], ["f2b"], name="ffn2_b"),
        n("Add", ["f2b", "h1"], ["res2"], name="res2"),
        n("ReduceMean", ["res2"], ["pooled"], name="pool", axes=[1], keepdims=0),
        n("Gemm", ["pooled", "cls_w", "cls_b"], ["logits"], name="classifier", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_bert",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", SEQ])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="mpsearch-tests")
    onnx.checker.check_model(model, full_check=True)
    return model


def _bytes(model: onnx.ModelProto) -> int:
    return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


def _sqnr(output: np.ndarray, reference: np.ndarray) -> float:
    return float(10 * np.log10((reference**2).sum() / ((output - reference) ** 2).sum()))


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ModelGraph, np.ndarray]:
    path = tmp_path_factory.mktemp("bert") / "tiny_bert.onnx"
    onnx.save(_tiny_bert(0), path)
    ids = np.random.default_rng(0).integers(0, VOCAB, (640, SEQ)).astype(np.int64)
    return path, load_model(path), ids


def test_embedding_gather_is_a_weight_only_node(bert: tuple[Path, ModelGraph, np.ndarray]
                                                ) -> None:
    _, graph, _ = bert
    embed = graph.nodes["embed"]
    assert embed.quantizable and embed.weight_only
    assert embed.weights == ("word_embeddings",) and embed.activation_inputs == ()
    profile = mpsearch.load_profile("x86_ort")
    groups = {g.name: g for g in group_nodes(graph, profile)}
    assert groups["embed"].nodes == ("embed",)
    assert groups["embed"].formats == ("int8", "int8_rows", "int16", "a16w16", "fp16w", "fp32")
    # the uniform int8_rows seed is uniform INT8 with the table one scale a row
    seeds = {s.source: s.formats for s in seed_assignments(graph, profile, list(groups.values()),
                                                           cost={})}
    assert seeds["uniform int8_rows"] == dict(seeds["uniform int8"], embed="int8_rows")
    assert set(seeds["uniform int8"].values()) == {"int8"}
    # a way to store tables, not a precision: no uniform baseline of its own
    assert table_format(graph, profile, "int8_rows") and not table_format(graph, profile, "int8")


def test_a_model_of_tables_only_keeps_the_table_formats_as_precisions(tmp_path: Path) -> None:
    """Where every quantizable node is a table, ``int8_rows`` is no narrower than ``int8``:
    both stay formats with uniform baselines."""
    table = numpy_helper.from_array(np.ones((10, 4), np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["out"], name="embed")], "tables",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 4])], initializer=[table])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "tables.onnx")
    only_tables = load_model(tmp_path / "tables.onnx")
    profile = mpsearch.load_profile("x86_ort")
    assert not table_format(only_tables, profile, "int8_rows")
    assert not table_format(only_tables, profile, "int8")


@pytest.mark.parametrize(("fmt", "axis"), [("int8", 1), ("int8_rows", 0)])
def test_the_table_is_stored_int8_one_scale_a_column_or_a_row(
        bert: tuple[Path, ModelGraph, np.ndarray], fmt: str, axis: int) -> None:
    """x86 ORT: ``int8`` stores an embedding table with one scale per column (embedding
    dimension), as small as ORT's one scale a table; ``int8_rows`` one per row, the search's
    choice where rows differ in norm. Codes, scales and the size model checked against NumPy."""
    path, graph, ids = bert
    profile = mpsearch.load_profile("x86_ort")
    table = mpsearch.calibrate(graph, Dataset(inputs={"input_ids": ids[:64]}))
    fp32 = mpsearch.uniform_assignment(graph, profile, "fp32")
    only_table = mpsearch.make_assignment(graph, profile, dict(fp32.formats, embed=fmt))
    model = mpsearch.build_qdq(graph, table, profile, only_table)
    (dq,) = [n for n in model.graph.node
             if n.op_type == "DequantizeLinear" and n.input[0].startswith("word_embeddings")]
    assert helper.get_attribute_value(dq.attribute[0]) == axis
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    codes, scale, zero = (stored[t] for t in dq.input)
    weights = numpy_helper.to_array(
        next(t for t in _tiny_bert(0).graph.initializer if t.name == "word_embeddings"))
    expected_scale = np.abs(weights).max(axis=1 - axis) / 127.0  # symmetric int8
    np.testing.assert_allclose(scale, expected_scale, rtol=1e-6)
    assert zero.dtype == np.int8 and not zero.any()
    shape = (-1, 1) if axis == 0 else (1, -1)
    np.testing.assert_array_equal(codes, np.clip(np.round(weights / scale.reshape(shape)),
                                                 -128, 127).astype(np.int8))
    # one byte a value, plus a float32 scale and an int8 zero point per column or row
    scales = HIDDEN if axis == 1 else VOCAB
    assert (mpsearch.model_size(graph, profile, fp32)
            - mpsearch.model_size(graph, profile, only_table)) == VOCAB * HIDDEN * 3 - scales * 5
    assert mpsearch.model_size(graph, profile, only_table) == _bytes(model)
    decoded = codes.astype(np.float32) * scale.reshape(shape)
    # rows of very different norms: one scale a row keeps the table 11 dB closer (NumPy:
    # 43.71 dB per row, 32.46 per column, 27.16 with ORT's one scale a table)
    assert _sqnr(decoded, weights) == pytest.approx(43.71 if axis == 0 else 32.46, abs=0.01)


def test_why_float_names_the_transformer_ops_kept_in_float(
        bert: tuple[Path, ModelGraph, np.ndarray]) -> None:
    _, graph, _ = bert
    profile = mpsearch.load_profile("x86_ort")
    reasons = mpsearch.why_float(graph, profile)
    assert reasons == {
        "kt": "Transpose moves data; it runs at the precision of its input",
        "gelu_erf": "Erf has no quantized kernel in the supported runtimes",
        "pool": "profile 'x86_ort' has no integer format for ReduceMean",
    }
    int8 = mpsearch.uniform_assignment(graph, profile, "int8")
    assert {n for n, f in int8.items() if f == "fp32"} == set(reasons)


def test_uniform_int8_matches_ort_quantize_static(
        bert: tuple[Path, ModelGraph, np.ndarray], tmp_path: Path) -> None:
    """Uniform INT8 (the table one scale a column) is no larger than ORT's quantize_static (one
    scale a table) and agrees with FP32 as often; with the table one scale a row (the search's
    ``int8_rows``) it also keeps at least ORT's output SQNR."""
    path, graph, ids = bert
    calibration, held = ids[:128], ids[128:]
    profile = mpsearch.load_profile("x86_ort_auto")  # ORT's int8 kernels exact on this CPU
    table = mpsearch.calibrate(graph, Dataset(inputs={"input_ids": calibration}))
    int8 = mpsearch.uniform_assignment(graph, profile, "int8")
    rows = mpsearch.make_assignment(graph, profile, dict(int8.formats, embed="int8_rows"))
    models = {"ort": ort_int8(path, tmp_path / "ort.onnx", {"input_ids": calibration})}
    for name, assignment in (("ours", int8), ("ours_rows", rows)):
        model = mpsearch.build_qdq(graph, table, profile, assignment)
        onnx.checker.check_model(model, full_check=True)
        assert mpsearch.model_size(graph, profile, assignment) == _bytes(model)
        models[name] = tmp_path / f"{name}.onnx"
        onnx.save(model, models[name])
    size = {name: file.stat().st_size for name, file in models.items()}
    # measured 279,157 / 283,517 / 282,506 bytes: one scale a row costs 5 bytes a row
    assert size["ours"] <= size["ort"] < size["ours_rows"] <= 1.01 * size["ort"]
    assert size["ours"] < 0.3 * path.stat().st_size

    feeds = {"input_ids": held}
    reference = create_session(path).run(feeds)["logits"]
    agrees, sqnr = {}, {}
    for name, model in models.items():
        output = create_session(model).run(feeds)["logits"]
        agrees[name] = output.argmax(1) == reference.argmax(1)
        sqnr[name] = _sqnr(output, reference)
    # Measured, AVX-512 VNNI (8-bit weights): ORT 430/512 agree at 13.3688 dB; ours 430 at
    # 13.2707 dB, with the table by rows 426 at 13.3698 dB (AVX2 without VNNI, 7-bit weights,
    # ORT 1.32: ORT 394 at 10.43 dB, ours 411 at 12.71 dB, by rows 428 at 13.45 dB; an earlier
    # AVX2 run read 424 at 13.30 dB by rows, ORT 421 at 13.18 dB). At the same output SQNR the
    # tools differ in which near-tie sequences flip, so counts are compared as a paired difference:
    # ORT may win at most two standard deviations of it (sign test). This table's rows differ
    # in norm by design, where one scale a row is the right choice: that configuration keeps
    # at least ORT's output SQNR. One scale a column costs 0.1 dB of it with 8-bit weights and
    # 0.74 dB with 7-bit ones, whose grid is twice as coarse.
    for ours in ("ours", "ours_rows"):
        ours_only = int((agrees[ours] & ~agrees["ort"]).sum())
        ort_only = int((agrees["ort"] & ~agrees[ours]).sum())
        assert ort_only - ours_only <= 2 * math.sqrt(ours_only + ort_only)
    assert sqnr["ours_rows"] >= sqnr["ort"]
    column_cost = 0.25 if mpsearch.host_int8_isa().exact_int8 else 1.0
    assert sqnr["ours_rows"] - column_cost <= sqnr["ours"] <= sqnr["ours_rows"]


def test_int16_keeps_the_table_in_int8_and_runs(bert: tuple[Path, ModelGraph, np.ndarray]
                                               ) -> None:
    """Uniform INT16 stores the table as INT8 does; on this table (rows differing in norm) the
    table is then what limits the output, and one scale a row recovers 12 dB of it."""
    path, graph, ids = bert
    profile = mpsearch.load_profile("x86_ort")
    table = mpsearch.calibrate(graph, Dataset(inputs={"input_ids": ids[:128]}))
    int16 = mpsearch.uniform_assignment(graph, profile, "int16")
    assert int16["embed"] == "int16"
    feeds = {"input_ids": ids[128:]}
    reference = create_session(path).run(feeds)["logits"]
    sqnr = {}
    for embed, stored_as in (("int16", "word_embeddings__i8c1_q"),
                             ("int8_rows", "word_embeddings__i8c0_q")):
        assignment = mpsearch.make_assignment(graph, profile, dict(int16.formats, embed=embed))
        model = mpsearch.build_qdq(graph, table, profile, assignment)
        stored = {t.name: t.data_type for t in model.graph.initializer}
        assert stored[stored_as] == TensorProto.INT8
        sqnr[embed] = _sqnr(create_session(model).run(feeds)["logits"], reference)
    # measured 20.44 dB (table by columns) and 32.34 dB (by rows); uniform INT8 13.27 dB
    assert sqnr["int16"] >= 20.0 and sqnr["int8_rows"] >= 32.0
