"""Static shapes for toolchains that need them: dynamic dimensions fixed to the data's.

Consumes a model and one input sample; produces a copy whose graph inputs have every
symbolic or unknown dimension set to the sample's size there (a symbolic name shared with the
outputs is fixed there too), and one note per fixed dimension, so the caller can say so.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from mpsearch.errors import TargetError

__all__ = ["fix_shapes"]


def fix_shapes(model: onnx.ModelProto, sample: Mapping[str, np.ndarray]
               ) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """``model`` with static input shapes taken from ``sample``, and notes on what changed."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    initializers = {i.name for i in fixed.graph.initializer}
    named: dict[str, int] = {}
    notes: list[str] = []
    for value in fixed.graph.input:
        if value.name in initializers:
            continue
        if value.name not in sample:
            raise TargetError(f"model input {value.name!r} has no data (the sample has "
                              f"{sorted(sample)}); give one array per model input")
        shape = np.shape(sample[value.name])
        dims = value.type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise TargetError(f"model input {value.name!r} has rank {len(dims)} but its data "
                              f"has shape {list(shape)}; check the data")
        for axis, (dim, size) in enumerate(zip(dims, shape, strict=True)):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            label = dim.dim_param or "?"
            if dim.dim_param:
                named[dim.dim_param] = int(size)
            dim.dim_value = int(size)
            notes.append(f"input {value.name!r} dimension {axis} ({label}) fixed to {size}, "
                         "the data's")
    for value in (*fixed.graph.output, *fixed.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in named:
                dim.dim_value = named[dim.dim_param]
    return fixed, tuple(notes)
