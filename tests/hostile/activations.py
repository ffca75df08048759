"""Generators of models whose activations, not their weights, are large: one Resize that
blows a 3x32x32 image up ``scale`` times per side (x250: 768 MB per sample as float32), and
data for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["resize_model"]


def resize_model(folder: Path, scale: int, samples: int = 16) -> tuple[Path, Path]:
    """(model, data): Conv 1x1 -> Resize x``scale`` (nearest) -> ReduceMean, and
    ``samples`` random 3x32x32 inputs with labels."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(size=(3, 3, 1, 1)).astype(np.float32), "W")
    scales = numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), "scales")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("Resize", ["c", "", "scales"], ["up"], name="resize",
                              mode="nearest"),
             helper.make_node("ReduceMean", ["up"], ["y"], name="mean", axes=[2, 3],
                              keepdims=0)]
    graph = helper.make_graph(
        nodes, "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        initializer=[weight, scales])
    model = folder / f"resize{scale}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    data = folder / f"resize{scale}.npz"
    np.savez(data, x=rng.normal(size=(samples, 3, 32, 32)).astype(np.float32),
             labels=rng.integers(0, 3, samples))
    return model, data
