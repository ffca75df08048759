"""Accuracy recovery as pure graph transformations, one per module, each with its contract:

* :func:`equalize` (``_cle``): cross-layer equalization, ``ModelGraph -> ModelGraph``, FP32
  outputs unchanged; applied to the graph right after loading, before calibration.
* :func:`correct_biases` (``_bias_correction``): empirical bias correction of a built QDQ model
  from the calibration data's :func:`input_means`; :class:`CorrectedQuantizer` applies it to
  every build.
"""

from mpsearch.recovery._bias_correction import (
    InputMeans,
    conv_tap_means,
    correct_biases,
    input_means,
    output_shift,
)
from mpsearch.recovery._cle import CLIP_POLICIES, Pair, Skipped, equalization_pairs, equalize
from mpsearch.recovery._corrected import CorrectedQuantizer

__all__ = ["CLIP_POLICIES", "CorrectedQuantizer", "InputMeans", "Pair", "Skipped",
           "conv_tap_means", "correct_biases", "equalization_pairs", "equalize", "input_means",
           "output_shift"]
