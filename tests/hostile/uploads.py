"""Generators of hostile uploads, made at test time: a valid model of very many nodes (small
on disk, large once parsed and summarised)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["many_nodes"]


def many_nodes(path: Path, nodes: int = 600_000) -> Path:
    """A valid model: one MatMul, then a chain of ``nodes - 1`` Relu (about 30 bytes a node on
    disk)."""
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "W")
    chain = [helper.make_node("MatMul", ["x", "W"], ["t0"], name="mm")]
    chain += [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"r{i}")
              for i in range(nodes - 1)]
    chain[-1].output[0] = "y"
    graph = helper.make_graph(
        chain, "many", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path
