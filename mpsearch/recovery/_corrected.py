"""A :class:`~mpsearch.quantize.Quantizer` whose every build is bias-corrected.

Consumes the graph, calibration table and profile of a plain quantizer plus the
:class:`~mpsearch.recovery.InputMeans` of the graph; ``build`` returns
:func:`~mpsearch.recovery.correct_biases` of the plain build, so the analysis, the search and the
export all measure and write the corrected model through the one measurer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import onnx

from mpsearch.errors import QuantizationError
from mpsearch.graph import ModelGraph
from mpsearch.profiles import HardwareProfile
from mpsearch.quantize import Quantizer
from mpsearch.recovery._bias_correction import InputMeans, correct_biases

if TYPE_CHECKING:
    from mpsearch.calibration import CalibrationTable

__all__ = ["CorrectedQuantizer"]


class CorrectedQuantizer(Quantizer):
    """:class:`Quantizer` followed by empirical bias correction from ``means``."""

    def __init__(self, graph: ModelGraph, table: CalibrationTable, profile: HardwareProfile,
                 *, means: InputMeans, method: str | None = None) -> None:
        if means.model_fingerprint != graph.fingerprint:
            raise QuantizationError(
                f"bias correction: the input means are of model {means.model_fingerprint}, not "
                f"of {graph.name} ({graph.fingerprint}); compute them on the model quantized")
        super().__init__(graph, table, profile, method=method)
        self.means = means

    def build(self, assignment: Mapping[str, str], *,
              stand_ins: Mapping[str, onnx.TensorProto] | None = None) -> onnx.ModelProto:
        """The bias-corrected QDQ model of ``assignment``."""
        return correct_biases(super().build(assignment, stand_ins=stand_ins), self.graph,
                              self.means)
