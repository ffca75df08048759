"""ONNX Runtime's own quantizer as the baseline the tests compare against.

``quantize_static`` in QDQ format, U8S8, per-channel weights, MinMax calibration on exactly the
samples given: the configuration ORT's documentation recommends for x86 CPUs, with
``reduce_range`` (7-bit weights) on CPUs without VNNI, as the same documentation advises there,
so ORT's quantizer and ours (``x86_ort_auto``) are each set up for the CPU that runs them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)

from mpsearch import host_int8_isa


class _Reader(CalibrationDataReader):  # type: ignore[misc]
    def __init__(self, batches: Sequence[Mapping[str, np.ndarray]]) -> None:
        self._batches = list(batches)
        self._it: Iterator[Mapping[str, np.ndarray]] = iter(self._batches)

    def get_next(self) -> Mapping[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self._batches)


def ort_int8(source: Path, target: Path, inputs: Mapping[str, np.ndarray],
             batch: int = 16) -> Path:
    """ORT's uniform INT8 QDQ model of ``source``, calibrated on ``inputs`` (all samples) in
    batches of ``batch``, or of the model's batch when its inputs write it as a number (ORT's
    calibration session runs the model as written; MinMax does not depend on the batching)."""
    count = len(next(iter(inputs.values())))
    batch = _fixed_batch(source) or batch
    batches = [{k: v[i:i + batch] for k, v in inputs.items()} for i in range(0, count, batch)]
    quantize_static(str(source), str(target), _Reader(batches), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    per_channel=True, calibrate_method=CalibrationMethod.MinMax,
                    reduce_range=not host_int8_isa().exact_int8)
    return target


def _fixed_batch(source: Path) -> int | None:
    """The first input's batch when it is written as a positive number (e.g. 1), else None
    (a name, or -1 as Paddle2ONNX writes a dynamic batch)."""
    dims = onnx.load(source, load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    return dims[0].dim_value if dims and dims[0].dim_value > 0 else None
