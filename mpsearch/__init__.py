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
    "Assignment": "assignment", "estimate_latency": "assignment",
    "latency_unknown_reason": "assignment",
    "load_assignment": "assignment", "make_assignment": "assignment",
    "model_size": "assignment", "uniform_assignment": "assignment",
    "CalibrationTable": "calibration", "calibrate": "calibration", "load_table": "calibration",
    "Dataset": "data", "load_data": "data",
    "CalibrationError": "errors", "DataError": "errors", "ModelError": "errors",
    "MpsearchError": "errors", "ProfileError": "errors", "QuantizationError": "errors",
    "SearchError": "errors", "SpecError": "errors",
    "Evaluation": "evaluate", "Evaluator": "evaluate",
    "ModelGraph": "graph", "load_model": "graph",
    "HardwareProfile": "profiles", "list_profiles": "profiles", "load_profile": "profiles",
    "Quantizer": "quantize", "build_qdq": "quantize",
    "ModelSummary": "summary", "summarize": "summary",
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
    "Assignment",
    "CalibrationError",
    "CalibrationTable",
    "DataError",
    "Dataset",
    "Evaluation",
    "Evaluator",
    "HardwareProfile",
    "ModelError",
    "ModelGraph",
    "ModelSummary",
    "MpsearchError",
    "ProfileError",
    "QuantizationError",
    "Quantizer",
    "SearchError",
    "SpecError",
    "__version__",
    "build_qdq",
    "calibrate",
    "estimate_latency",
    "latency_unknown_reason",
    "list_profiles",
    "load_assignment",
    "load_data",
    "load_model",
    "load_profile",
    "load_table",
    "make_assignment",
    "model_size",
    "summarize",
    "uniform_assignment",
]
