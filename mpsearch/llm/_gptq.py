"""GPTQ for weight-only block formats, and the Hessians it needs from a float ONNX model.

:func:`gptq` consumes a float ``[K, N]`` MatMul weight (ONNX layout) and the Hessian
``H = X^T X`` ``[K, K]`` of the projection's input ``X`` over calibration tokens; it quantizes
one input channel at a time and spreads each channel's error over the channels not yet
quantized through the Cholesky factor of ``H^-1``, so the output error ``tr(E^T H E)`` falls
below round to nearest's. :func:`collect_hessians` runs the float model in ONNX Runtime on
token windows with every MatMul's input exposed and sums ``X^T X`` per weight.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import onnx

from mpsearch.errors import DataError, SpecError
from mpsearch.llm._formats import BlockFormat, Quantized
from mpsearch.llm._quant import _check, _result, block_params, kquant

__all__ = ["collect_hessians", "gptq", "matmul_weights"]

logger = logging.getLogger(__name__)


def _inverse_factor(hessian: np.ndarray, damp: float) -> np.ndarray:
    """Upper Cholesky factor of ``(H + damp * mean(diag H) * I)^-1``."""
    h = np.array(hessian, np.float64)
    k = h.shape[0]
    h[np.arange(k), np.arange(k)] += damp * max(float(np.mean(np.diag(h))), 1e-12)
    try:
        inv = np.linalg.inv(np.linalg.cholesky(h))
        return np.linalg.cholesky(inv.T @ inv).T
    except np.linalg.LinAlgError as e:
        raise SpecError(f"GPTQ: the damped Hessian is not positive definite (damp {damp}); "
                        "raise damp or calibrate on more tokens") from e


def _group_params(w: np.ndarray, fmt: BlockFormat, fit: str, importance: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero ``[N]`` of one group ``w`` ``[N, g]`` (rows are output channels);
    ``importance`` ``[g]``: the group's channels' ``diag(H)``, weighing the k-quant search."""
    if fit == "kquant":  # one block: a short last group is padded, the padding weighs 0
        q = kquant(np.ascontiguousarray(w.T), fmt, importance)
        return q.scales[:, 0].astype(np.float64), q.zeros[:, 0].astype(np.float64)
    if fit != "rtn":
        raise SpecError(f"GPTQ group fit '{fit}' unknown; use rtn or kquant")
    scale, zero = block_params(w, fmt)
    return scale[:, 0], zero[:, 0]


def gptq(weight: np.ndarray, fmt: BlockFormat, hessian: np.ndarray, *, damp: float = 0.01,
         act_order: bool = False, lazy: int = 128, fit: str = "rtn") -> Quantized:
    """GPTQ of ``weight`` ``[K, N]`` given ``hessian`` ``[K, K]``.

    Groups are the format's blocks along K, their scale and zero fit (``fit``: ``rtn``
    min/max or ``kquant`` search) on the error-updated weights when the group's first
    channel comes up; with ``act_order`` channels go in order of falling ``diag(H)`` and the
    groups' parameters are fit on the original weights first (static groups, so the blocks
    stay contiguous along K as MatMulNBits needs). ``lazy`` channels are updated at a time."""
    _check(weight, fmt)
    k, n = weight.shape
    if hessian.shape != (k, k):
        raise SpecError(f"GPTQ: Hessian shape {list(hessian.shape)} does not match K={k}")
    g = fmt.block
    w = np.array(weight, np.float64).T  # [N, K]: one row per output channel
    dead = np.diag(hessian) <= 0
    h = np.array(hessian, np.float64)
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(k)
    nb = fmt.n_blocks(k)
    scales, zeros = np.zeros((n, nb)), np.zeros((n, nb))
    if act_order:
        for b in range(nb):
            scales[:, b], zeros[:, b] = _group_params(w[:, b * g:(b + 1) * g], fmt, fit,
                                                      np.diag(h)[b * g:(b + 1) * g])
    u = _inverse_factor(h[np.ix_(order, order)], damp)
    w = w[:, order]
    codes = np.zeros((n, k))
    lazy = max(g, lazy // g * g)
    for i1 in range(0, k, lazy):
        i2 = min(i1 + lazy, k)
        block = w[:, i1:i2].copy()
        err = np.zeros_like(block)
        for i in range(i2 - i1):
            col = order[i1 + i]
            grp = col // g
            if not act_order and col % g == 0:
                scales[:, grp], zeros[:, grp] = _group_params(block[:, i:i + g], fmt, fit,
                                                              np.diag(h)[col:col + g])
            s, z = scales[:, grp], zeros[:, grp]
            inv = np.where(s != 0, 1.0 / np.where(s != 0, s, 1.0), 0.0)
            q = np.clip(np.rint(block[:, i] * inv + z), 0, fmt.levels)
            codes[:, col] = q
            e = (block[:, i] - (q - z) * s) / u[i1 + i, i1 + i]
            block[:, i:] -= np.outer(e, u[i1 + i, i1 + i:i2])
            err[:, i] = e
        w[:, i2:] -= err @ u[i1:i2, i2:]
    padded = np.tile(np.rint(zeros)[:, :, None], (1, 1, g)).reshape(n, nb * g)
    padded[:, :k] = codes
    return _result(fmt, k, padded, scales, zeros)


def matmul_weights(model: onnx.ModelProto) -> dict[str, str]:
    """``{weight initializer: input activation}`` of every MatMul whose second input is a 2-D
    float initializer (the projections a weight-only format applies to)."""
    inits = {t.name: t for t in model.graph.initializer}
    found: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits:
            continue
        tensor = inits[node.input[1]]
        if len(tensor.dims) == 2 and tensor.data_type == onnx.TensorProto.FLOAT:
            found.setdefault(node.input[1], node.input[0])
    return found


def _feeds(model: onnx.ModelProto, window: np.ndarray) -> dict[str, np.ndarray]:
    """Inputs of a decoder LLM for one token window ``[1, seq]``: ids, an all-ones mask,
    positions, and empty past key/values (every symbolic dimension but the batch is 0)."""
    seq = window.shape[1]
    feeds: dict[str, np.ndarray] = {}
    inits = {t.name for t in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        if inp.name == "input_ids":
            feeds[inp.name] = window.astype(np.int64)
        elif inp.name == "attention_mask":
            feeds[inp.name] = np.ones((1, seq), np.int64)
        elif inp.name == "position_ids":
            feeds[inp.name] = np.arange(seq, dtype=np.int64)[None]
        elif "past" in inp.name:
            dims = inp.type.tensor_type.shape.dim
            shape = [1 if i == 0 else (d.dim_value if d.HasField("dim_value") else 0)
                     for i, d in enumerate(dims)]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
            feeds[inp.name] = np.zeros(shape, dtype)
        else:
            raise DataError(f"model input '{inp.name}' is not one a decoder LLM takes "
                            "(input_ids, attention_mask, position_ids, past_key_values.*)")
    return feeds


def collect_hessians(model: onnx.ModelProto, windows: np.ndarray,
                     weights: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """Mean ``X^T X`` over every token of ``windows`` (int64 ``[n, seq]``) of each MatMul
    weight's input (``weights``: ``{weight: input}``, all float MatMul weights by default),
    from float ONNX Runtime runs of ``model`` one window at a time."""
    from mpsearch.runtime import create_session

    if windows.ndim != 2 or windows.shape[0] == 0:
        raise DataError(f"token windows of shape {list(windows.shape)}: need int64 [n, seq]")
    wanted = dict(weights) if weights is not None else matmul_weights(model)
    if not wanted:
        raise DataError("the model has no MatMul with a 2-D float weight initializer")
    inputs = sorted(set(wanted.values()))
    session = create_session(model, extra_outputs=inputs, label="hessians")
    sums: dict[str, np.ndarray] = {}
    count = 0
    for row in windows:
        out = session.run(_feeds(model, row[None]), inputs)
        for name in inputs:
            x = out[name].reshape(-1, out[name].shape[-1]).astype(np.float64)
            sums[name] = sums.get(name, 0.0) + x.T @ x
        count += row.shape[0]
    logger.debug("Hessians of %d inputs over %d tokens", len(inputs), count)
    return {weight: sums[inp] / count for weight, inp in wanted.items()}

