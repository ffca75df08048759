"""The committed fixture zoo, the bundled demo and the benchmark-scale model generator.

Fixtures are built by ``tests/fixtures/build_fixtures.py``; these tests check that what is
committed loads, is small, and still scores the accuracy recorded in ``fixtures.json`` when run
with onnxruntime on ``digits_eval.npz``. Tolerance: at most one evaluation sample may flip
(|correct - recorded correct| <= 1), to allow for kernel changes between onnxruntime versions.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
MANIFEST = json.loads((FIXTURES / "fixtures.json").read_text())
MODELS = sorted(MANIFEST["models"])
MAX_BYTES = 1 << 20
EXPECTED_MODELS = {
    "resnet",
    "mobilenetv2",
    "efficientnet",
    "squeezenet",
    "shufflenet",
    "transformer",
    "sensitive",
}


def _eval_data() -> tuple[np.ndarray, np.ndarray]:
    with np.load(FIXTURES / MANIFEST["eval_file"]) as data:
        return data["input"], data["labels"]


def _correct(path: Path, x: np.ndarray, y: np.ndarray) -> int:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    (logits,) = sess.run(["logits"], {"input": x})
    assert logits.shape == (len(y), MANIFEST["num_classes"])
    return int((logits.argmax(1) == y).sum())


def test_manifest_lists_the_zoo() -> None:
    assert set(MODELS) == EXPECTED_MODELS
    assert MANIFEST["input_shape"] == [1, 1, 16, 16]


def test_eval_split() -> None:
    x, y = _eval_data()
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert x.shape == (len(y), 1, 16, 16)
    assert 400 <= len(y) <= 500 and len(y) == MANIFEST["n_eval"]
    assert set(np.unique(y).tolist()) == set(range(10))
    assert np.isfinite(x).all()
    assert (FIXTURES / MANIFEST["eval_file"]).stat().st_size <= MAX_BYTES


@pytest.mark.parametrize("name", MODELS)
def test_fixture_loads_and_reproduces_accuracy(name: str) -> None:
    record = MANIFEST["models"][name]
    path = FIXTURES / record["file"]
    data = path.read_bytes()
    assert len(data) <= MAX_BYTES, f"{path.name} is {len(data)} bytes"
    assert len(data) == record["bytes"]
    assert hashlib.sha256(data).hexdigest() == record["sha256"], "rebuild fixtures.json"
    model = onnx.load_from_string(data)
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["logits"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert sum(int(np.prod(t.dims)) for t in model.graph.initializer) == record["params"]

    x, y = _eval_data()
    recorded = round(record["fp32_accuracy"] * len(y))
    assert abs(_correct(path, x, y) - recorded) <= 1
    assert record["fp32_accuracy"] >= 0.9


def test_sensitive_model_has_an_int8_problem() -> None:
    """Recorded ORT numbers: uniform INT8 loses >= 3 points, 16-bit activations < 0.5."""
    record = MANIFEST["models"]["sensitive"]
    assert record["fp32_accuracy"] - record["ort_int8_accuracy"] >= 0.03
    assert record["fp32_accuracy"] - record["ort_a16_accuracy"] < 0.005
    assert all("ort_int8_accuracy" in r for r in MANIFEST["models"].values())


def test_demo_files_load() -> None:
    from mpsearch.demo import DEMO_DATA, DEMO_MODEL

    assert DEMO_MODEL.is_file() and DEMO_DATA.is_file()
    assert DEMO_MODEL.stat().st_size <= MAX_BYTES and DEMO_DATA.stat().st_size <= MAX_BYTES
    assert DEMO_MODEL.read_bytes() == (FIXTURES / "shufflenet.onnx").read_bytes()
    onnx.checker.check_model(onnx.load(str(DEMO_MODEL)))
    with np.load(DEMO_DATA) as data:
        x, y = data["input"], data["labels"]
    ex, ey = _eval_data()
    np.testing.assert_array_equal(x, ex)
    np.testing.assert_array_equal(y, ey)
    recorded = round(MANIFEST["models"]["shufflenet"]["fp32_accuracy"] * len(y))
    assert abs(_correct(DEMO_MODEL, x, y) - recorded) <= 1


def _benchmark_models() -> ModuleType:
    """Import benchmarks/models.py by path (benchmarks/ is not a package)."""
    path = ROOT / "benchmarks" / "models.py"
    spec = importlib.util.spec_from_file_location("mpsearch_benchmark_models", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "published", "folded", "gmacs"),
    [
        ("resnet18", 11_689_512, 11_684_712, 1.814),
        ("mobilenetv2", 3_504_872, 3_487_816, 0.301),
    ],
)
def test_benchmark_models_match_torchvision(
    name: str, published: int, folded: int, gmacs: float
) -> None:
    bench = _benchmark_models()
    model = getattr(bench, name)()
    # Folded BN keeps one bias per channel where torchvision counts gamma and beta.
    assert bench.parameter_count(model) == folded
    assert bench.torchvision_parameter_count(model) == published
    macs = int({p.key: p.value for p in model.metadata_props}["macs"])
    assert macs / 1e9 == pytest.approx(gmacs, abs=5e-4)
    assert model.opset_import[0].version == 17
    assert not any(n.op_type == "BatchNormalization" for n in model.graph.node)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "N" and [d.dim_value for d in dims[1:]] == [3, 224, 224]
    assert [o.name for o in model.graph.output] == ["logits"]
    onnx.checker.check_model(model)
    again = getattr(bench, name)()
    first = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_array_equal(first, numpy_helper.to_array(again.graph.initializer[0]))
