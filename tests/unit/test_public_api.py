"""The public API: exactly these names, of these kinds; the CLI starts without the heavy ones."""

from __future__ import annotations

import inspect
import subprocess
import sys

import mpsearch

CLASSES = {
    "Analysis", "Assignment", "CalibrationTable", "Dataset", "Evaluation", "Evaluator",
    "Format", "HardwareProfile", "ImageOptions", "Measurer", "ModelGraph", "ModelSummary",
    "Quantizer", "Thresholds",
}
ERRORS = {"CalibrationError", "DataError", "ModelError", "MpsearchError", "ProfileError",
          "QuantizationError", "SearchError", "SpecError", "TargetError"}
FUNCTIONS = {
    "analyze", "build_qdq", "calibrate", "check_signature", "estimate_latency", "format_summary",
    "host_int8_isa", "latency_unknown_reason", "list_profiles", "load_assignment",
    "load_data", "load_model", "load_profile", "load_table", "make_assignment", "model_size",
    "study_progress",
    "summarize", "uniform_assignment", "validate_profile_file", "why_float",
    "write_llm_report", "write_report",
    "x86_profile_for",
}
CONSTANTS = {"AUTO_X86_PROFILE", "IMAGE_SUFFIXES", "METRICS", "__version__"}
HEAVY = ("onnx", "numba", "onnxruntime", "optuna", "networkx", "plotly")


def test_exported_names_are_pinned() -> None:
    assert set(mpsearch.__all__) == CLASSES | ERRORS | FUNCTIONS | CONSTANTS
    assert sorted(mpsearch.__all__) == list(mpsearch.__all__)


def test_exported_kinds() -> None:
    for name in CLASSES:
        assert inspect.isclass(getattr(mpsearch, name)), name
    for name in ERRORS:
        assert issubclass(getattr(mpsearch, name), mpsearch.MpsearchError), name
    for name in FUNCTIONS:
        value = getattr(mpsearch, name)
        assert callable(value) and not inspect.isclass(value), name
    assert mpsearch.AUTO_X86_PROFILE == "x86_ort_auto"
    assert "accuracy" in mpsearch.METRICS and ".png" in mpsearch.IMAGE_SUFFIXES


def _loaded_after(code: str) -> list[str]:
    probe = (f"import sys; {code}; "
             f"print('loaded:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("loaded:"), out.stdout
    return [m for m in last.removeprefix("loaded:").split(",") if m]


def test_cli_imports_no_heavy_module() -> None:
    assert _loaded_after("import mpsearch.cli") == []
    assert _loaded_after("import mpsearch.cli; mpsearch.cli._main.build_parser()") == []


def test_version_and_profile_list_stay_light() -> None:
    code = ("from mpsearch.cli import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n")
    assert _loaded_after(f"exec({code!r})") == []
    assert _loaded_after("from mpsearch.cli import main; main(['-q', 'profiles', 'list'])") == []


def test_spec_sections_are_public() -> None:
    """The search spec's YAML sections, one dataclass each, beside :class:`SearchSpec`."""
    import mpsearch.spec

    sections = {"Budget", "CalibrationSpec", "Constraints", "DataSpec", "EvaluationSpec",
                "Recovery"}
    assert sections | {"SearchSpec", "load_spec"} <= set(mpsearch.spec.__all__)
    for name in sections:
        assert inspect.isclass(getattr(mpsearch.spec, name)), name
