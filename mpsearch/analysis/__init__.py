"""Node-level analysis through the one shared measurer: sensitivity, distributions, curve."""

from __future__ import annotations

from mpsearch.analysis._analysis import (
    SCHEMA,
    Analysis,
    CurvePoint,
    analysis_formats,
    analyze,
    measure_curve,
)
from mpsearch.analysis._distributions import (
    BINS,
    STAT_COLUMNS,
    STAT_FIELDS,
    FlagRules,
    NodeDistribution,
    TensorDistribution,
    analyze_distributions,
    tensor_flags,
)
from mpsearch.analysis._measure import (
    Measurement,
    Measurer,
    assignment_key,
    output_kl,
)
from mpsearch.analysis._sensitivity import (
    CLASSES,
    NodeSensitivity,
    RestoreGain,
    Thresholds,
    kendall_tau,
    lower_formats,
    measure_proxy,
    measure_reverse,
    measure_sensitivity,
    node_model,
    rank_sensitivity,
    severity,
    worsening,
)
from mpsearch.analysis._uncertainty import (
    Z95,
    bootstrap_interval,
    wilson_interval,
)

__all__ = [
    "Analysis",
    "BINS",
    "CLASSES",
    "CurvePoint",
    "FlagRules",
    "Measurement",
    "Measurer",
    "NodeDistribution",
    "NodeSensitivity",
    "RestoreGain",
    "SCHEMA",
    "STAT_COLUMNS",
    "STAT_FIELDS",
    "TensorDistribution",
    "Thresholds",
    "Z95",
    "analysis_formats",
    "analyze",
    "analyze_distributions",
    "assignment_key",
    "bootstrap_interval",
    "kendall_tau",
    "lower_formats",
    "measure_curve",
    "measure_proxy",
    "measure_reverse",
    "measure_sensitivity",
    "node_model",
    "output_kl",
    "rank_sensitivity",
    "severity",
    "tensor_flags",
    "wilson_interval",
    "worsening",
]
