"""mpsearch: automated mixed-precision search for ONNX models, driven by hardware profiles.

The public Python API. A typical session::

    import mpsearch
    graph = mpsearch.load_model("model.onnx")
    data = mpsearch.load_data("data.npz")
    profile = mpsearch.load_profile("x86_ort")
    table = mpsearch.calibrate(graph, data)
    int8 = mpsearch.uniform_assignment(graph, profile, "int8")
    model = mpsearch.build_qdq(graph, table, profile, int8)
"""

from __future__ import annotations

__version__ = "0.1.0"

import importlib
from typing import Any

# Public name -> defining module. Imported on first use, so `import mpsearch.profiles` or the
# CLI's `summary` does not pay for numba, optuna or onnxruntime.
_EXPORTS = {
    "Analysis": "analysis", "Measurer": "analysis", "Thresholds": "analysis",
    "analyze": "analysis",
    "Assignment": "assignment", "estimate_latency": "assignment",
    "latency_unknown_reason": "assignment",
    "load_assignment": "assignment", "make_assignment": "assignment",
    "model_size": "assignment", "uniform_assignment": "assignment",
    "why_float": "assignment",
    "CalibrationTable": "calibration", "calibrate": "calibration", "load_table": "calibration",
    "IMAGE_SUFFIXES": "data", "Dataset": "data", "ImageOptions": "data",
    "check_signature": "data", "load_data": "data",
    "CalibrationError": "errors", "DataError": "errors", "ModelError": "errors",
    "MpsearchError": "errors", "ProfileError": "errors", "QuantizationError": "errors",
    "SearchError": "errors", "SpecError": "errors", "TargetError": "errors",
    "METRICS": "evaluate", "Evaluation": "evaluate", "Evaluator": "evaluate",
    "ModelGraph": "graph", "load_model": "graph",
    "AUTO_X86_PROFILE": "profiles", "Format": "profiles", "HardwareProfile": "profiles",
    "host_int8_isa": "profiles", "list_profiles": "profiles", "load_profile": "profiles",
    "validate_profile_file": "profiles", "x86_profile_for": "profiles",
    "Quantizer": "quantize", "build_qdq": "quantize",
    "write_llm_report": "report",
    "write_report": "report",
    "study_progress": "search",
    "ModelSummary": "summary", "format_summary": "summary", "summarize": "summary",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mpsearch' has no attribute '{name}'")
    value = getattr(importlib.import_module(f"mpsearch.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AUTO_X86_PROFILE",
    "Analysis",
    "Assignment",
    "CalibrationError",
    "CalibrationTable",
    "DataError",
    "Dataset",
    "Evaluation",
    "Evaluator",
    "Format",
    "HardwareProfile",
    "IMAGE_SUFFIXES",
    "ImageOptions",
    "METRICS",
    "Measurer",
    "ModelError",
    "ModelGraph",
    "ModelSummary",
    "MpsearchError",
    "ProfileError",
    "QuantizationError",
    "Quantizer",
    "SearchError",
    "SpecError",
    "TargetError",
    "Thresholds",
    "__version__",
    "analyze",
    "build_qdq",
    "calibrate",
    "check_signature",
    "estimate_latency",
    "format_summary",
    "host_int8_isa",
    "latency_unknown_reason",
    "list_profiles",
    "load_assignment",
    "load_data",
    "load_model",
    "load_profile",
    "load_table",
    "make_assignment",
    "model_size",
    "study_progress",
    "summarize",
    "uniform_assignment",
    "validate_profile_file",
    "why_float",
    "write_llm_report",
    "write_report",
    "x86_profile_for",
]
