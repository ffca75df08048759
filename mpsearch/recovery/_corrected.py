"""A :class:`~mpsearch.quantize.Quantizer` whose every build is corrected: weights rounded by
GPTQ and biases corrected for the mean output shift.

Consumes the graph, calibration table and profile of a plain quantizer plus the
:class:`~mpsearch.recovery.InputHessians` and/or :class:`~mpsearch.recovery.InputMeans` of the
graph. With Hessians, every integer weight of at most 8 bits that has one is stored as
:func:`~mpsearch.recovery.round_weight`'s codes on the plain builder's grid (kept per weight
and grid in the Hessians' own memo: every builder sharing them rounds a weight once); with
means, ``build`` returns :func:`~mpsearch.recovery.correct_biases` of that build, which then
corrects the shift of the rounded weights. The analysis, the search and the export all
measure and write the corrected model through the one measurer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import onnx

from mpsearch.errors import QuantizationError
from mpsearch.graph import ModelGraph, Node
from mpsearch.profiles import HardwareProfile, TensorFormat
from mpsearch.quantize import Quantizer, code_range
from mpsearch.recovery._bias_correction import InputMeans, correct_biases
from mpsearch.recovery._gptq import InputHessians, round_weight

if TYPE_CHECKING:
    from mpsearch.calibration import CalibrationTable

__all__ = ["CorrectedQuantizer"]


class CorrectedQuantizer(Quantizer):
    """:class:`Quantizer` with GPTQ rounding from ``hessians`` and bias correction from
    ``means`` (either may be None)."""

    def __init__(self, graph: ModelGraph, table: CalibrationTable, profile: HardwareProfile,
                 *, means: InputMeans | None = None, hessians: InputHessians | None = None,
                 method: str | None = None) -> None:
        for what, stats in (("bias correction: the input means", means),
                            ("GPTQ: the input Hessians", hessians)):
            if stats is not None and stats.model_fingerprint != graph.fingerprint:
                raise QuantizationError(
                    f"{what} are of model {stats.model_fingerprint}, not of {graph.name} "
                    f"({graph.fingerprint}); compute them on the model quantized")
        super().__init__(graph, table, profile, method=method)
        self.means = means
        self.hessians = hessians
        self._shifts: dict[tuple[str, bytes], np.ndarray] = {}  # bias correction's memo

    def _weight_codes(self, node: Node, array: np.ndarray, scale: np.ndarray, zero: np.ndarray,
                      fmt: TensorFormat, axis: int | None) -> np.ndarray:
        hessians = self.hessians
        hessian = None if hessians is None else hessians.hessians.get(node.name)
        if hessians is None or hessian is None or fmt.bits > 8:
            return super()._weight_codes(node, array, scale, zero, fmt, axis)
        qmin, qmax = code_range(fmt.dtype, narrow_range=fmt.narrow_range,
                                reduce_range=fmt.reduce_range)
        key = (node.name, fmt.dtype, axis, qmin, qmax, scale.tobytes(), zero.tobytes())
        memo = hessians.codes
        if key not in memo:  # the same rounding for every builder of these Hessians
            codes = round_weight(node, array, hessian, scale, zero, axis, qmin, qmax,
                                 memo=hessians)
            memo[key] = None if codes is None else codes.astype(np.dtype(fmt.dtype))
        stored = memo[key]
        if stored is None:
            return super()._weight_codes(node, array, scale, zero, fmt, axis)
        return stored

    def build(self, assignment: Mapping[str, str], *,
              stand_ins: Mapping[str, onnx.TensorProto] | None = None) -> onnx.ModelProto:
        """The corrected QDQ model of ``assignment``."""
        model = super().build(assignment, stand_ins=stand_ins)
        return model if self.means is None else correct_biases(model, self.graph, self.means,
                                                              shifts=self._shifts)
