"""ModelGraph: loading, normalizations of real-world export quirks, roles, bad-input errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from _paths import FIXTURES
from onnx import TensorProto, helper, numpy_helper

from mpsearch.errors import ModelError
from mpsearch.graph import load_model
from mpsearch.runtime import create_session


def _conv_model(opset: int = 17, constant_weights: bool = False) -> onnx.ModelProto:
    """x -> Conv(W, B) -> Relu -> Shape/Reshape subgraph -> y, batch dimension symbolic."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    nodes = []
    inits = []
    if constant_weights:  # Paddle-style: weights held in Constant nodes
        nodes += [helper.make_node("Constant", [], ["W"], value=numpy_helper.from_array(weight)),
                  helper.make_node("Constant", [], ["B"], value=numpy_helper.from_array(bias))]
    else:
        inits += [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "B")]
    inits.append(numpy_helper.from_array(np.array([0, -1], dtype=np.int64), "shape"))
    nodes += [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Add", ["n", "zero"], ["n2"]),  # int64 arithmetic: not quantizable
        helper.make_node("Reshape", ["r", "shape"], ["y"]),
    ]
    inits.append(numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"))
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 256]),
         helper.make_tensor_value_info("n2", TensorProto.INT64, [])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_roles_shapes_and_topology() -> None:
    graph = load_model(_conv_model())
    assert graph.order[0].startswith("Conv")
    conv = graph.nodes[graph.order[0]]
    assert conv.quantizable and conv.weights == ("W",) and conv.bias == "B"
    assert conv.activation_inputs == ("x",)
    assert graph.shapes["c"] == ("N", 4, 8, 8)  # the dynamic batch stays symbolic
    add = next(n for n in graph.nodes.values() if n.op_type == "Add")
    assert not add.quantizable and "non-float" in add.reason
    reshape = next(n for n in graph.nodes.values() if n.op_type == "Reshape")
    assert not reshape.quantizable and "moves data" in reshape.reason
    assert graph.activation_tensors() == ("x", "c", "r")
    assert graph.consumers("r") == tuple(n for n in graph.order if "r" in graph.nodes[n].inputs)
    assert graph.producer("c") == conv.name
    assert graph.changes == ("named 6 unnamed or duplicate nodes",)


def test_constant_weights_become_initializers() -> None:
    reference = load_model(_conv_model())
    graph = load_model(_conv_model(constant_weights=True))
    assert any("Constant nodes into initializers" in c for c in graph.changes)
    assert not any(n.op_type == "Constant" for n in graph.nodes.values())
    conv = next(n for n in graph.nodes.values() if n.op_type == "Conv")
    assert conv.quantizable and conv.weights == ("W",)
    np.testing.assert_array_equal(graph.initializers["W"], reference.initializers["W"])
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    a = create_session(graph.model).run({"x": x})["y"]
    b = create_session(reference.model).run({"x": x})["y"]
    np.testing.assert_allclose(a, b, rtol=0, atol=0)


def test_opset_11_is_upgraded_to_13() -> None:
    graph = load_model(_conv_model(opset=11))
    assert graph.opset == 13
    assert "upgraded opset 11 -> 13" in graph.changes
    x = np.ones((1, 3, 8, 8), np.float32)
    expected = create_session(_conv_model(opset=11)).run({"x": x})["y"]
    np.testing.assert_allclose(create_session(graph.model).run({"x": x})["y"], expected,
                               rtol=1e-6, atol=1e-6)


def test_wrong_declared_output_shape_is_dropped() -> None:
    model = _conv_model()
    dims = model.graph.output[0].type.tensor_type.shape.dim
    dims[1].dim_value = 999  # contradicts inference (256)
    graph = load_model(model)
    assert any("contradicted inference" in c for c in graph.changes)
    assert graph.shapes["c"] == ("N", 4, 8, 8)


def test_initializers_listed_as_inputs_are_not_inputs() -> None:
    model = _conv_model()
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3, 3, 3]))
    graph = load_model(model)
    assert [i.name for i in graph.inputs] == ["x"]
    assert any("initializers from the graph inputs" in c for c in graph.changes)


def test_external_data_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "ext.onnx"
    onnx.save(_conv_model(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    graph = load_model(path)
    assert graph.initializers["W"].shape == (4, 3, 3, 3)
    assert graph.path == str(path)


def test_nodes_inside_if_are_listed_not_quantizable() -> None:
    then_graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_graph = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["e"])], "else", [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_graph,
                          else_branch=else_graph)],
        "if", [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
               helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    loaded = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert not loaded.quantizable_nodes()
    assert {n.op_type for n in loaded.subgraph_nodes} == {"Relu", "Sigmoid"}
    assert all("subgraph of If" in n.reason for n in loaded.subgraph_nodes)


def test_not_onnx_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a protobuf at all \x00\x01")
    with pytest.raises(ModelError, match=r"notes\.onnx: not a readable ONNX model"):
        load_model(path)


def test_truncated_file(tmp_path: Path) -> None:
    data = (FIXTURES / "resnet.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelError, match=r"cut\.onnx: "):
        load_model(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no such file"):
        load_model(tmp_path / "absent.onnx")


def test_unsupported_opset() -> None:
    with pytest.raises(ModelError, match="opset 6 is not supported"):
        load_model(_conv_model(opset=6))


def test_error_messages_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x08\x07garbage")
    with pytest.raises(ModelError) as info:
        load_model(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["resnet", "mobilenetv2", "efficientnet", "squeezenet",
                                  "shufflenet", "transformer", "sensitive"])
def test_every_fixture_loads(name: str) -> None:
    graph = load_model(FIXTURES / f"{name}.onnx")
    assert graph.quantizable_nodes()
    assert graph.inputs[0].shape is not None and isinstance(graph.inputs[0].shape[0], str)
    for node in graph.quantizable_nodes():
        assert all(graph.is_float(t) for t in node.activation_inputs if t not in node.weights)
