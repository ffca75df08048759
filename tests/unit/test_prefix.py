"""Prefix reuse: a configuration measured on the sensitivity samples runs only what it changes,
fed with FP32 tensors kept once, and scores what the whole model scores."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _paths import FIXTURES
from onnx import TensorProto, helper, numpy_helper

import mpsearch
from mpsearch.analysis import Measurer
from mpsearch.analysis._prefix import FloatPrefix
from mpsearch.data import Dataset
from mpsearch.graph import load_model


def _quantizer(model: str | onnx.ModelProto, data: Dataset) -> mpsearch.Quantizer:
    graph = load_model(model)
    return mpsearch.Quantizer(graph, mpsearch.calibrate(graph, data.take(64)),
                              mpsearch.load_profile("x86_ort"))


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["mobilenetv2", "transformer", "resnet"])
def test_single_node_rows_score_as_whole_model_runs(fixture: str, digits: Dataset) -> None:
    """Every (node, format) row measured through the changed part scores the whole model's
    agreement exactly and its output noise up to float rounding (ORT fuses FP32 nodes
    differently when their tensors are outputs); most rows skip part of the model."""
    quantizer = _quantizer(str(FIXTURES / f"{fixture}.onnx"), digits)
    data = digits.take(96)
    reused, whole = Measurer(quantizer, data, prefix_samples=32), Measurer(quantizer, data)
    nodes = quantizer.graph.quantizable_nodes()
    for node in nodes:
        for fmt in ("int8", "int16"):
            a, b = reused.measure({node.name: fmt}, samples=32), whole.measure(
                {node.name: fmt}, samples=32)
            assert a.metrics["agreement"] == b.metrics["agreement"]
            assert a.metrics["mse"] == pytest.approx(b.metrics["mse"], rel=0.05, abs=1e-9)
    assert reused.partial_runs >= len(nodes) and whole.partial_runs == 0


def test_measuring_past_the_prefix_samples_continues_with_the_whole_model(
        digits: Dataset) -> None:
    """The race's next stage (64 samples) runs the rest on the whole model's session, which
    its latency then times."""
    quantizer = _quantizer(str(FIXTURES / "mobilenetv2.onnx"), digits)
    data = digits.take(128)
    reused, whole = Measurer(quantizer, data, prefix_samples=32), Measurer(quantizer, data)
    last = quantizer.graph.quantizable_nodes()[-3].name
    assert reused.measure({last: "int8"}, samples=32).samples == 32
    assert reused.partial_runs == 1
    state = reused._open
    assert state is not None and state.session is None  # only the changed part ran
    a, b = reused.measure({last: "int8"}, samples=96), whole.measure({last: "int8"}, samples=96)
    assert a.samples == b.samples == 96 and a.metrics["agreement"] == b.metrics["agreement"]
    assert state.session is not None
    session = state.session
    assert reused.latency({last: "int8"}, batch=64, repeat=2) > 0
    assert reused._open is state and state.session is session  # timed on the same session


def _two_heads() -> onnx.ModelProto:
    """x -> MatMul a -> y (the primary output) and x -> MatMul b -> z."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(8, 4)).astype(np.float32), name)
               for name in ("wa", "wb")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "wa"], ["y"], name="a"),
         helper.make_node("MatMul", ["x", "wb"], ["z"], name="b")], "heads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 4])], initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_node_off_the_primary_output_scores_as_fp32_without_a_run() -> None:
    x = np.random.default_rng(1).normal(size=(64, 8)).astype(np.float32)
    data = Dataset(inputs={"x": x}, source="heads")
    quantizer = _quantizer(_two_heads(), data)
    reused = Measurer(quantizer, data, prefix_samples=32)
    off = reused.measure({"b": "int8"}, samples=32)
    assert off.metrics == reused.fp32(32).metrics and off.sqnr == float("inf")
    on = reused.measure({"a": "int8"}, samples=32)
    assert on.metrics == Measurer(quantizer, data).measure({"a": "int8"}, samples=32).metrics
    assert reused.partial_runs == 1  # "a" changes most of this two-node model: run whole


def test_without_kept_tensors_a_candidate_runs_whole(digits: Dataset) -> None:
    """With no memory for kept tensors every candidate would recompute its whole prefix: the
    cut declines and the measurer runs the whole model."""
    quantizer = _quantizer(str(FIXTURES / "mobilenetv2.onnx"), digits)
    graph = quantizer.graph
    feeds = next(iter(digits.take(32).batches(32)))
    starved, kept = FloatPrefix(graph, feeds, budget=0), FloatPrefix(graph, feeds)
    assert set(starved.kept) == set(feeds)
    deep = graph.quantizable_nodes()[-3].name
    model = quantizer.build({deep: "int8"})
    assert starved.cut(model, graph.outputs[0].name) is None
    cut = kept.cut(model, graph.outputs[0].name)
    assert cut is not None and cut.model is not None
    assert cut.nodes < len(model.graph.node) // 4


def test_prefix_samples_beyond_one_batch_run_in_batches_and_score_alike(
        digits: Dataset) -> None:
    """Batches smaller than the prefix samples (a memory budget's): the kept tensors and the
    changed part run a batch at a time and score what the whole model scores."""
    quantizer = _quantizer(str(FIXTURES / "mobilenetv2.onnx"), digits)
    data = digits.take(64)
    reused = Measurer(quantizer, data, prefix_samples=32, batch_size=8)
    whole = Measurer(quantizer, data, batch_size=8)
    last = quantizer.graph.quantizable_nodes()[-3].name
    a, b = reused.measure({last: "int8"}, samples=32), whole.measure({last: "int8"}, samples=32)
    assert reused.partial_runs == 1 and reused.evaluator.batch_size == 8
    assert a.samples == b.samples == 32 and a.metrics["agreement"] == b.metrics["agreement"]
    assert a.metrics["mse"] == pytest.approx(b.metrics["mse"], rel=0.05, abs=1e-9)
    reused.release()
    assert reused._open is None and reused._prefix is None
    assert reused.measure({last: "int8"}, samples=32).metrics == a.metrics  # from the cache


def _shape_grid() -> onnx.ModelProto:
    """x [n, 4] -> six MatMul/Tanh -> c; a [4, 4] grid of ones made from x's shape alone (no
    batch axis, as a detector's anchors); y = MatMul(c, grid) -> MatMul v."""
    rng = np.random.default_rng(2)
    names = [f"w{i}" for i in range(6)]
    weights = [numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32) / 2, name)
               for name in (*names, "v")]
    chain = [node for i, w in enumerate(names) for node in (
        helper.make_node("MatMul", ["x" if i == 0 else f"t{i - 1}", w], [f"m{i}"], name=f"m{i}"),
        helper.make_node("Tanh", [f"m{i}"], ["c" if i == 5 else f"t{i}"], name=f"t{i}"))]
    consts = [numpy_helper.from_array(np.array(v, np.int64), n)
              for n, v in (("one", [1]), ("two", [2]))]
    one = helper.make_tensor("fill", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [*chain,
         helper.make_node("Shape", ["x"], ["shape"], name="shape"),
         helper.make_node("Slice", ["shape", "one", "two"], ["width"], name="width"),
         helper.make_node("Concat", ["width", "width"], ["square"], name="square", axis=0),
         helper.make_node("ConstantOfShape", ["square"], ["grid"], name="grid", value=one),
         helper.make_node("MatMul", ["c", "grid"], ["d"], name="mixed"),
         helper.make_node("MatMul", ["d", "v"], ["y"], name="last")], "grid",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        initializer=weights + consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_tensors_without_a_batch_axis_are_not_kept() -> None:
    """A tensor made from the input's shape alone has no batch axis: kept, it would be
    concatenated and sliced as if it had one. The changed part recomputes it instead, and
    scores what the whole model scores, a batch at a time."""
    x = np.random.default_rng(3).normal(size=(40, 4)).astype(np.float32)
    data = Dataset(inputs={"x": x}, source="grid")
    quantizer = _quantizer(_shape_grid(), data)
    prefix = FloatPrefix(quantizer.graph, {"x": x[:10]}, rows=4)
    assert "grid" not in prefix.kept and "c" in prefix.kept
    assert {len(v) for v in prefix.kept.values()} == {10}
    reused = Measurer(quantizer, data, prefix_samples=10, batch_size=4)
    whole = Measurer(quantizer, data, batch_size=4)
    a, b = (m.measure({"mixed": "int8"}, samples=10) for m in (reused, whole))
    assert reused.partial_runs == 1
    assert a.metrics["agreement"] == b.metrics["agreement"]


def _folded_batch() -> onnx.ModelProto:
    """x [n, 8] -> MatMul a -> [n, 4] -> Reshape [-1, 2] (the batch folded into the rows, as
    YOLOv8's head does) -> MatMul b -> [2n, 2] -> Reshape [-1, 4] -> y [n, 4]."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(8, 4)).astype(np.float32), "wa"),
               numpy_helper.from_array(rng.normal(size=(2, 2)).astype(np.float32), "wb"),
               numpy_helper.from_array(np.array([-1, 2], np.int64), "pairs"),
               numpy_helper.from_array(np.array([-1, 4], np.int64), "rows")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "wa"], ["h"], name="a"),
         helper.make_node("Reshape", ["h", "pairs"], ["folded"], name="fold"),
         helper.make_node("MatMul", ["folded", "wb"], ["m"], name="b"),
         helper.make_node("Reshape", ["m", "rows"], ["y"], name="unfold")], "folded",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_tensor_with_the_batch_folded_in_is_not_kept() -> None:
    """A Reshape to [-1, 2] puts two rows per sample: split in batches of samples it would
    feed the changed part a wrong count of rows (ONNX Runtime: invalid dimensions). Only
    batch-first tensors are kept, and a node reading the folded one scores as the whole
    model does."""
    x = np.random.default_rng(1).normal(size=(64, 8)).astype(np.float32)
    data = Dataset(inputs={"x": x}, source="folded")
    quantizer = _quantizer(_folded_batch(), data)
    feeds = next(iter(data.take(32).batches(32)))
    prefix = FloatPrefix(quantizer.graph, feeds)
    assert "folded" not in prefix.kept and "h" in prefix.kept
    assert all(len(value) == 32 for value in prefix.kept.values())
    reused = Measurer(quantizer, data, prefix_samples=32, batch_size=8)
    whole = Measurer(quantizer, data, batch_size=8)
    a, b = reused.measure({"b": "int8"}, samples=32), whole.measure({"b": "int8"}, samples=32)
    assert a.samples == b.samples == 32 and a.metrics["agreement"] == b.metrics["agreement"]
    assert a.metrics["mse"] == pytest.approx(b.metrics["mse"], rel=1e-4)


def test_a_tensor_of_constants_is_not_kept() -> None:
    """A detector's anchor grid is built from the input's shape: one row for one sample, one
    row for any batch. Kept, it would be fed as a batch of samples; only tensors with a row per
    sample are kept, and the node reading the grid scores as the whole model does."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(8, 4)).astype(np.float32), "wa"),
               numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "wb"),
               numpy_helper.from_array(np.array([1], np.int64), "one"),
               numpy_helper.from_array(np.array([2], np.int64), "two")]
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
         helper.make_node("Slice", ["shape", "one", "two"], ["width"], name="width"),
         helper.make_node("Div", ["width", "two"], ["half"], name="half"),
         helper.make_node("Concat", ["one", "half"], ["grid_shape"], name="grid_shape", axis=0),
         helper.make_node("ConstantOfShape", ["grid_shape"], ["grid"], name="anchors",
                          value=numpy_helper.from_array(np.array([0.5], np.float32))),
         helper.make_node("MatMul", ["x", "wa"], ["h"], name="a"),
         helper.make_node("Sub", ["h", "grid"], ["d"], name="offset"),
         helper.make_node("MatMul", ["d", "wb"], ["y"], name="b")], "grid",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])], initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.normal(size=(64, 8)).astype(np.float32)
    data = Dataset(inputs={"x": x}, source="grid")
    quantizer = _quantizer(model, data)
    prefix = FloatPrefix(quantizer.graph, next(iter(data.take(32).batches(32))))
    assert "grid" not in prefix.kept and "h" in prefix.kept
    reused = Measurer(quantizer, data, prefix_samples=32)
    a, b = reused.measure({"a": "int8"}, samples=32), Measurer(quantizer, data).measure(
        {"a": "int8"}, samples=32)
    assert a.samples == b.samples == 32 and a.metrics["agreement"] == b.metrics["agreement"]
    assert a.metrics["mse"] == pytest.approx(b.metrics["mse"], rel=1e-4)
