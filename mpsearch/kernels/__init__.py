"""Numba kernels for streaming statistics, fake quantization, weight codes and GPTQ rounding
(the only numba importer); a NumPy twin beside each kernel."""

from __future__ import annotations

import os

# Sleeping, not spinning, OpenMP workers: on few shared cores ONNX Runtime's pool runs between
# kernel calls, and a spinning worker holds the core it needs. Must precede numba's pool, so it
# is set here, before any kernel module imports numba.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from mpsearch.kernels._gptq import gptq_block, gptq_block_numpy
from mpsearch.kernels._kernels import (
    abs_histogram,
    central_moments,
    central_moments_numpy,
    entropy_divergences,
    entropy_divergences_numpy,
    entropy_threshold,
    entropy_threshold_numpy,
    error_stats,
    error_stats_numpy,
    fake_quantize,
    fake_quantize_numpy,
    fake_quantize_per_channel,
    fake_quantize_per_channel_numpy,
    histogram_merge,
    histogram_merge_numpy,
    histogram_rebin,
    histogram_rebin_numpy,
    mse_threshold,
    mse_threshold_numpy,
    percentile_range,
    percentile_range_numpy,
    quantize_codes,
    quantize_codes_numpy,
    range_mse,
    range_mse_numpy,
    set_threads,
    tensor_stats,
    tensor_stats_numpy,
)

__all__ = [
    "abs_histogram",
    "central_moments",
    "central_moments_numpy",
    "entropy_divergences",
    "entropy_divergences_numpy",
    "entropy_threshold",
    "entropy_threshold_numpy",
    "error_stats",
    "error_stats_numpy",
    "fake_quantize",
    "fake_quantize_numpy",
    "fake_quantize_per_channel",
    "fake_quantize_per_channel_numpy",
    "gptq_block",
    "gptq_block_numpy",
    "histogram_merge",
    "histogram_merge_numpy",
    "histogram_rebin",
    "histogram_rebin_numpy",
    "mse_threshold",
    "mse_threshold_numpy",
    "percentile_range",
    "percentile_range_numpy",
    "quantize_codes",
    "quantize_codes_numpy",
    "range_mse",
    "range_mse_numpy",
    "set_threads",
    "tensor_stats",
    "tensor_stats_numpy",
]
