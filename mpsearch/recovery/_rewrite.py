"""What every recovery transform ends with: the model with some weights replaced."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from mpsearch.graph import ModelGraph

__all__ = ["with_weights"]


def with_weights(graph: ModelGraph, arrays: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``graph``'s model whose initializers named in ``arrays`` hold those arrays
    (stored as float32); the graph's own model is left as it is."""
    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    for init in model.graph.initializer:
        if init.name in arrays:
            init.CopyFrom(numpy_helper.from_array(arrays[init.name].astype(np.float32),
                                                  init.name))
    return model
