"""Accuracy recovery as pure graph transformations, one per module, each with its contract:

* :func:`equalize` (``_cle``): cross-layer equalization, ``ModelGraph -> ModelGraph``, FP32
  outputs unchanged; applied to the graph right after loading, before calibration.
* :func:`smooth` (``_smoothquant``): SmoothQuant-style scale migration from LayerNorm outputs
  into the MatMul/Gemm weights that read them, folded into the LayerNorm's gamma and beta,
  ``ModelGraph -> ModelGraph``, FP32 outputs unchanged; from the calibration data's
  :func:`channel_maxima`, applied after :func:`equalize` and before calibration.
* :func:`round_weight` (``_gptq``): GPTQ rounding of a weight on the builder's grid from the
  calibration data's :func:`input_hessians`; :class:`CorrectedQuantizer` stores each 8-bit
  weight so rounded in every build.
* :func:`correct_biases` (``_bias_correction``): empirical bias correction of a built QDQ model
  from the calibration data's :func:`input_means`; :class:`CorrectedQuantizer` applies it to
  every build (after GPTQ's rounding, when both are on).

:func:`recover` (``_auto``) applies a :class:`RecoverySettings` to a graph; the methods left
``None`` (``recovery: auto``) are decided by measuring them on the search split, and the
:class:`RecoveryDecision` records what each bought.

The three statistics are each one streaming ONNX Runtime pass of ``_activations``.
"""

from mpsearch.recovery._auto import (
    DECISION_SAMPLES,
    METHODS,
    Recovered,
    RecoveryDecision,
    RecoverySettings,
    recover,
)
from mpsearch.recovery._bias_correction import (
    InputMeans,
    conv_tap_means,
    correct_biases,
    input_means,
    output_shift,
)
from mpsearch.recovery._cle import CLIP_POLICIES, Pair, Skipped, equalization_pairs, equalize
from mpsearch.recovery._corrected import CorrectedQuantizer
from mpsearch.recovery._gptq import (
    HESSIAN_SAMPLES,
    InputHessians,
    gptq_codes,
    gptq_factor,
    input_hessians,
    round_weight,
)
from mpsearch.recovery._smoothquant import (
    ChannelMaxima,
    SmoothGroup,
    SmoothSkipped,
    channel_maxima,
    smooth,
    smoothing_groups,
)

__all__ = ["CLIP_POLICIES", "DECISION_SAMPLES", "HESSIAN_SAMPLES", "METHODS", "ChannelMaxima",
           "CorrectedQuantizer", "InputHessians", "InputMeans", "Pair", "Recovered",
           "RecoveryDecision", "RecoverySettings", "Skipped", "SmoothGroup", "SmoothSkipped",
           "channel_maxima", "conv_tap_means", "correct_biases", "equalization_pairs",
           "equalize", "gptq_codes", "gptq_factor", "input_hessians", "input_means",
           "output_shift", "recover", "round_weight", "smooth", "smoothing_groups"]
