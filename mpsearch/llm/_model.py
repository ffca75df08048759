"""Ingest of a decoder-only ONNX language model.

Consumes an ONNX file as the standard exporters write it (onnxruntime-genai's builder, optimum,
:mod:`mpsearch.testing.smollm`); produces a :class:`LanguageModel`: the names of its token,
mask, position and past key/value inputs and its logits output, its context length, the
tokenizer beside it, and every quantizable weight (a MatMul/Gemm initializer, the embedding's
Gather table) with its layer and projection, found by graph structure and names.

:func:`with_weight_inputs` turns chosen initializers into graph inputs, so one ONNX Runtime
session scores many weight assignments (the weights are fed per run).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from mpsearch.errors import ModelError

__all__ = ["PROJECTIONS", "LMWeight", "LanguageModel", "initial_weights",
           "load_language_model", "with_weight_inputs"]

#: The per-layer projections, in graph order; plus "lm_head", "embedding" and "other".
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
_ROLES = (
    ("q", r"q_proj|attn_q\b|\.query\b|/query/"), ("k", r"k_proj|attn_k\b|\.key\b|/key/"),
    ("v", r"v_proj|attn_v\b|\.value\b|/value/"),
    ("o", r"o_proj|out_proj|attn_output|attention/output|attn/dense|self_attn/dense"),
    ("gate", r"gate_proj|ffn_gate|\bw1\b"), ("up", r"up_proj|ffn_up|\bw3\b|fc1"),
    ("down", r"down_proj|ffn_down|\bw2\b|fc2"), ("lm_head", r"lm_head|^output\b"),
)
_LAYER = re.compile(r"(?:layers?|blk|h|block)[./_](\d+)")
_PAST = re.compile(r"past_key_values?[._](\d+)[._](key|value)")


@dataclass(frozen=True, slots=True, kw_only=True)
class LMWeight:
    """One quantizable weight: the initializer ``name`` read by ``node`` (MatMul B as
    ``[in, out]``, Gemm B as stored, the embedding as ``[vocab, hidden]``)."""

    name: str
    node: str
    op: str
    layer: int | None  # None for lm_head, the embedding and unplaced weights
    role: str  # one of PROJECTIONS, "lm_head", "embedding", "other"
    shape: tuple[int, ...]

    @property
    def key(self) -> str:
        """``"3.q"``, ``"lm_head"``, ``"embedding"``: how tables and bit maps name it."""
        return f"{self.layer}.{self.role}" if self.layer is not None else self.role


@dataclass(frozen=True, slots=True, kw_only=True)
class LanguageModel:
    """What the metrics and the search need to know of a decoder ONNX model."""

    path: Path
    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    past: tuple[tuple[str, tuple[int, int]], ...]  # (input, (kv heads, head dim))
    logits: str
    vocab: int
    context: int | None  # max positions, from the model's metadata or its config files
    tokenizer: Path | None  # tokenizer.json beside the model
    weights: tuple[LMWeight, ...]

    def feeds(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """The inputs of one full-sequence forward pass over ``ids`` [batch, length] with an
        empty past (length 0) where the graph has past inputs."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        batch, length = ids.shape
        feeds = {self.input_ids: ids}
        if self.attention_mask:
            feeds[self.attention_mask] = np.ones_like(ids)
        if self.position_ids:
            feeds[self.position_ids] = np.broadcast_to(np.arange(length), ids.shape).copy()
        for name, (heads, dim) in self.past:
            feeds[name] = np.zeros((batch, heads, 0, dim), np.float32)
        return feeds


def load_language_model(path: str | Path) -> LanguageModel:
    """Read ``path`` and describe it; ModelError (exit 2) for a GGUF or safetensors file, a
    file ONNX cannot read, or a model with no quantizable MatMul weight."""
    path = Path(path)
    model = _load(path)
    graph = model.graph
    inits = {t.name: tuple(int(d) for d in t.dims) for t in graph.initializer}
    names = [i.name for i in graph.input if i.name not in inits]
    ids = _pick(names, ("input_ids",)) or next((n for n in names if "ids" in n), None)
    if ids is None:
        raise ModelError(f"{path}: no input_ids input among {names}; give a decoder language "
                         "model as the standard exporters write it (input_ids, logits)")
    past = tuple((i.name, _kv_shape(i)) for i in graph.input if _PAST.search(i.name))
    outputs = [o.name for o in graph.output]
    logits = _pick(outputs, ("logits",)) or outputs[0]
    weights = _weights(graph, inits, ids, logits)
    if not any(w.op != "Gather" for w in weights):
        raise ModelError(f"{path}: no MatMul or Gemm with a constant weight, nothing to "
                         "quantize; give the float model as exported, before quantization")
    vocab = next((w.shape[-1] for w in weights if w.role == "lm_head"),
                 _output_dim(graph, logits))
    tokenizer = path.parent / "tokenizer.json"
    return LanguageModel(
        path=path, input_ids=ids, attention_mask=_pick(names, ("attention_mask",)),
        position_ids=_pick(names, ("position_ids",)), past=past, logits=logits, vocab=vocab,
        context=_context(model, path), tokenizer=tokenizer if tokenizer.is_file() else None,
        weights=weights)


def with_weight_inputs(model: onnx.ModelProto, names: list[str] | tuple[str, ...]
                       ) -> onnx.ModelProto:
    """Make the initializers ``names`` of ``model`` graph inputs (same name, dtype, shape), so
    a session feeds them per run instead of holding them; changes ``model`` in place (a 30-layer
    model is hundreds of MB) and returns it."""
    wanted = set(names)
    copy = model
    kept: list[onnx.TensorProto] = []
    moved: list[onnx.TensorProto] = []
    for tensor in copy.graph.initializer:
        (moved if tensor.name in wanted else kept).append(tensor)
    missing = wanted - {t.name for t in moved}
    if missing:
        raise ModelError(f"{copy.graph.name}: no initializer(s) {sorted(missing)[:3]}; "
                         "name weights as load_language_model lists them")
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(kept)
    for tensor in moved:
        copy.graph.input.append(onnx.helper.make_tensor_value_info(
            tensor.name, tensor.data_type, list(tensor.dims)))
    return copy


def initial_weights(model: onnx.ModelProto, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The arrays of initializers ``names`` (the FP32 weights a weight-input variant is fed)."""
    wanted = set(names)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
            if t.name in wanted}


def _load(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise ModelError(f"{path}: no such file; give the path of an ONNX model")
    with open(path, "rb") as f:
        head = f.read(16)
    if head[:4] == b"GGUF" or path.suffix == ".gguf":
        raise ModelError(f"{path}: a GGUF file, not ONNX; convert it first (onnxruntime-genai's "
                         "model builder, or mpsearch.testing.smollm for SmolLM2)")
    if path.suffix == ".safetensors" or head[8:10] == b'{"':
        raise ModelError(f"{path}: a safetensors weight file, not ONNX; export the model "
                         "first (optimum-cli export onnx, or onnxruntime-genai's builder)")
    try:
        return onnx.load(str(path))
    except Exception as e:
        raise ModelError(f"{path}: ONNX cannot read the file ({str(e).splitlines()[0][:120]});"
                         " give an .onnx model") from e


def _pick(names: list[str], wanted: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in wanted), None)


def _kv_shape(value: onnx.ValueInfoProto) -> tuple[int, int]:
    dims = value.type.tensor_type.shape.dim
    if len(dims) != 4 or not dims[1].dim_value or not dims[3].dim_value:
        raise ModelError(f"past input '{value.name}' is not [batch, kv heads, past, head dim] "
                         "with fixed heads and head dim; export with the standard KV layout")
    return int(dims[1].dim_value), int(dims[3].dim_value)


def _output_dim(graph: onnx.GraphProto, name: str) -> int:
    out = next(o for o in graph.output if o.name == name)
    return int(out.type.tensor_type.shape.dim[-1].dim_value)


def _role(text: str) -> str:
    return next((role for role, pattern in _ROLES if re.search(pattern, text)), "other")


def _weights(graph: onnx.GraphProto, inits: dict[str, tuple[int, ...]], ids: str,
             logits: str) -> tuple[LMWeight, ...]:
    producer = {out: node for node in graph.node for out in node.output}
    head = _head_node(producer, logits)
    found = []
    for node in graph.node:
        slot = {"MatMul": 1, "Gemm": 1, "Gather": 0}.get(node.op_type)
        if slot is None or len(node.input) <= slot or len(inits.get(node.input[slot], ())) != 2:
            continue
        name = node.input[slot]
        if node.op_type == "Gather" and node.input[1] != ids:
            continue
        text = f"{node.name} {name}"
        if node.op_type == "Gather":
            role, layer = "embedding", None
        elif node is head:
            role, layer = "lm_head", None
        else:
            role = _role(text)
            match = _LAYER.search(text)
            layer = int(match.group(1)) if match and role != "lm_head" else None
        found.append(LMWeight(name=name, node=node.name, op=node.op_type, layer=layer,
                              role=role, shape=inits[name]))
    return tuple(found)


def _head_node(producer: dict[str, onnx.NodeProto], logits: str) -> onnx.NodeProto | None:
    """The MatMul/Gemm that produces the logits, through shape-only and cast ops."""
    node = producer.get(logits)
    while node is not None and node.op_type in ("Reshape", "Cast", "Identity", "Add"):
        node = producer.get(node.input[0])
    return node if node is not None and node.op_type in ("MatMul", "Gemm") else None


def _context(model: onnx.ModelProto, path: Path) -> int | None:
    """Max positions: the model's metadata, else config.json or genai_config.json beside it."""
    for prop in model.metadata_props:
        if prop.key == "max_position_embeddings" and prop.value.isdigit():
            return int(prop.value)
    for name, keys in (("config.json", ("max_position_embeddings",)),
                       ("genai_config.json", ("model", "context_length"))):
        file = path.parent / name
        if not file.is_file():
            continue
        try:
            value = json.loads(file.read_text(encoding="utf-8"))
            for key in keys:
                value = value[key]
            return int(value)
        except (ValueError, KeyError, TypeError):
            continue
    return None
