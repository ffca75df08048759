"""Model summary: parameter and MAC counts against published figures and hand-counted models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _paths import FIXTURES
from onnx import TensorProto, helper, numpy_helper

from mpsearch.cli import main
from mpsearch.graph import load_model
from mpsearch.summary import format_summary, summarize
from mpsearch.testing import architectures


def _within(value: float, published: float, tolerance: float = 0.02) -> bool:
    return abs(value - published) <= tolerance * published


def test_resnet18_published_counts() -> None:
    summary = summarize(load_model(architectures.resnet18()))
    assert _within(summary.params, 11.69e6), summary.params
    assert _within(summary.macs, 1.82e9), summary.macs


def test_mobilenetv2_published_counts() -> None:
    summary = summarize(load_model(architectures.mobilenetv2()))
    assert _within(summary.params, 3.50e6), summary.params
    assert _within(summary.macs, 0.30e9), summary.macs
    depthwise = [n for n in summary.nodes if n.op_type == "Conv" and n.params and
                 n.input_shapes[1] is not None and n.input_shapes[1][1] == 1]
    assert depthwise, "MobileNetV2 has depthwise convolutions"


def test_hand_counted_model() -> None:
    """Depthwise conv, grouped conv, Gemm and batched MatMul with known MAC counts."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "dw"),
        numpy_helper.from_array(rng.standard_normal((16, 4, 1, 1)).astype(np.float32), "gw"),
        numpy_helper.from_array(rng.standard_normal((16 * 4 * 4, 10)).astype(np.float32), "fc"),
        numpy_helper.from_array(np.array([0, -1], np.int64), "flat"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "dw"], ["a"], group=8, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a", "gw"], ["b"], group=2),
        helper.make_node("Softmax", ["b"], ["s"], axis=1),
        helper.make_node("Reshape", ["s", "flat"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 8, 4, 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 10])], inits)
    summary = summarize(load_model(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)])))
    macs = {n.op_type + str(i): n.macs for i, n in enumerate(summary.nodes)}
    assert macs["Conv0"] == 8 * 4 * 4 * 1 * 9  # depthwise: out elements x (Cin/groups) x k
    assert macs["Conv1"] == 16 * 4 * 4 * 4  # two groups of 4 input channels
    assert macs["Gemm4"] == 256 * 10
    assert summary.params == 8 * 9 + 16 * 4 + 256 * 10  # the int64 shape is not a parameter
    assert summary.op_types == {"Conv": 2, "Gemm": 1, "Reshape": 1, "Softmax": 1}
    assert summary.flops == 2 * summary.macs + 5 * 256


@pytest.mark.parametrize("name", ["resnet", "mobilenetv2", "efficientnet", "squeezenet",
                                  "shufflenet", "transformer", "sensitive"])
def test_every_fixture_summarizes(name: str) -> None:
    record = json.loads((FIXTURES / "fixtures.json").read_text())["models"][name]
    summary = summarize(load_model(FIXTURES / f"{name}.onnx"))
    assert summary.params == record["params"]
    assert summary.macs > 0 and summary.flops >= 2 * summary.macs
    assert "MACs" in format_summary(summary)
    json.dumps(summary.to_dict())  # serializable


def test_cli_summary_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(FIXTURES / "resnet.onnx"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["params"] > 0 and data["op_types"]["Conv"] > 0


def test_cli_summary_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.onnx"
    path.write_bytes(b"nope")
    assert main(["summary", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mpsearch: error: ") and str(path) in err and "\n" not in err


def test_transformer_attention_matmuls_counted() -> None:
    graph = load_model(FIXTURES / "transformer.onnx")
    summary = summarize(graph)
    matmuls = [n for n in summary.nodes if n.op_type == "MatMul"]
    assert matmuls and all(n.macs > 0 for n in matmuls)


def test_lstm_gates_are_counted_every_step() -> None:
    """A bidirectional LSTM (seq 6, batch 1, 3 features, hidden 5): each step and direction
    multiplies the input (3) and the last output (5) by four gates' weights."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("W", (2, 20, 3)), ("R", (2, 20, 5)))]
    graph = helper.make_graph(
        [helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=5,
                          direction="bidirectional")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 2, 1, 5])], inits)
    summary = summarize(load_model(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)])))
    y = 6 * 2 * 1 * 5
    assert summary.macs == y * 4 * (3 + 5) == 6 * 2 * (20 * 3 + 20 * 5)
    assert summary.flops == 2 * summary.macs + y * 4 * 5
