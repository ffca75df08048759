"""Round-to-nearest, HQQ and k-quant scale search for weight-only block formats (NumPy).

Each consumes a float ``[K, N]`` MatMul weight and a :class:`~mpsearch.llm._formats.BlockFormat`
and produces a :class:`~mpsearch.llm._formats.Quantized` (codes, scales, zero points, and its
dequantized weight). ``importance`` is a per-input-channel weight ``[K]`` (the diagonal of the
Hessian ``X^T X`` of the projection's input, as llama.cpp's importance matrix): the k-quant search
minimises the squared error weighted by it. :func:`weighted_error` scores any result that way,
or with a full Hessian as ``tr(E^T H E)``, the output error GPTQ minimises.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mpsearch.errors import SpecError
from mpsearch.llm._formats import BlockFormat, Quantized

__all__ = ["blocks_of", "hqq", "kquant", "quantize", "rtn", "weighted_error"]

_EPS = 1e-12
#: output channels searched at a time: bounds the float64 temporaries of a wide weight (a
#: 49152-row embedding) to a few hundred MB
_ROWS = 4096


def blocks_of(weight: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    """``[K, N]`` -> float64 ``[N, n_blocks, block]``, K padded with zeros."""
    k, n = weight.shape
    padded = np.zeros((n, fmt.n_blocks(k) * fmt.block))
    padded[:, :k] = np.asarray(weight, np.float64).T
    return padded.reshape(n, -1, fmt.block)


def _importance_blocks(importance: np.ndarray | None, k: int, fmt: BlockFormat) -> np.ndarray:
    """Per-channel weights as ``[1, n_blocks, block]``; padding weighs nothing."""
    w = np.zeros(fmt.n_blocks(k) * fmt.block)
    w[:k] = 1.0 if importance is None else np.asarray(importance, np.float64)
    return w.reshape(1, -1, fmt.block)


def _check(weight: np.ndarray, fmt: BlockFormat) -> None:
    if fmt.is_float:
        raise SpecError(f"{fmt.name} is a float format; only integer block formats quantize")
    if weight.ndim != 2 or not np.all(np.isfinite(weight)):
        raise SpecError(f"weight of shape {list(weight.shape)} is not a finite [K, N] matrix")


def _result(fmt: BlockFormat, k: int, codes: np.ndarray, scales: np.ndarray,
            zeros: np.ndarray) -> Quantized:
    n = codes.shape[0]
    return Quantized(fmt=fmt, k=k, n=n, codes=codes.reshape(n, -1).astype(np.uint8),
                     scales=scales.astype(np.float32), zeros=zeros.astype(np.float32))


def _encode(x: np.ndarray, scales: np.ndarray, zeros: np.ndarray, levels: int) -> np.ndarray:
    """Codes of blocks ``x`` under per-block ``scales`` and ``zeros`` (``[..., 1]``)."""
    inv = np.where(scales != 0, 1.0 / np.where(scales != 0, scales, 1.0), 0.0)
    codes: np.ndarray = np.clip(np.rint(x * inv + zeros), 0, levels)
    return codes


def block_params(x: np.ndarray, fmt: BlockFormat) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest scale and zero of blocks ``x`` ``[..., block]``, each ``[..., 1]``.

    Symmetric: the value of largest magnitude maps to code 0 (``-2^(bits-1)`` from the zero),
    the other side reaching ``2^(bits-1) - 1``, as ONNX Runtime's blockwise quantizer does.
    uint8 zeros: the range is widened to hold 0 so the integer zero code is in range.
    Float zeros: min and max map to codes 0 and ``levels`` exactly."""
    if fmt.symmetric:
        idx = np.argmax(np.abs(x), axis=-1)[..., None]
        peak = np.take_along_axis(x, idx, axis=-1)
        return peak / -fmt.default_zero, np.full_like(peak, fmt.default_zero)
    lo, hi = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    if fmt.zero == "uint8":
        lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    scale = (hi - lo) / fmt.levels
    safe = np.where(scale > _EPS, scale, 1.0)
    zero = -lo / safe
    if fmt.zero == "uint8":
        zero = np.clip(np.rint(zero), 0, fmt.levels)
    return np.where(scale > _EPS, scale, 0.0), np.where(scale > _EPS, zero, 0.0)


_Rows = tuple[np.ndarray, np.ndarray, np.ndarray]


def _by_rows(weight: np.ndarray, fmt: BlockFormat, importance: np.ndarray | None,
             fit: Callable[[np.ndarray, np.ndarray], _Rows]) -> Quantized:
    """Apply ``fit(blocks, importance)`` -> (codes, scales, zeros) to :data:`_ROWS` output
    channels at a time and assemble the result."""
    x = blocks_of(weight, fmt)
    imp = _importance_blocks(importance, weight.shape[0], fmt)
    parts = [fit(x[i:i + _ROWS], np.broadcast_to(imp, x[i:i + _ROWS].shape))
             for i in range(0, x.shape[0], _ROWS)]
    codes, scale, zero = (np.concatenate([p[j] for p in parts]) for j in range(3))
    return _result(fmt, weight.shape[0], codes, scale[..., 0], zero[..., 0])


def rtn(weight: np.ndarray, fmt: BlockFormat) -> Quantized:
    """Round to nearest on each block's min/max (or absolute maximum, symmetric) range."""
    _check(weight, fmt)

    def fit(x: np.ndarray, _: np.ndarray) -> _Rows:
        scales, zeros = block_params(x, fmt)
        return _encode(x, scales, zeros, fmt.levels), scales, zeros

    return _by_rows(weight, fmt, None, fit)


def hqq(weight: np.ndarray, fmt: BlockFormat, importance: np.ndarray | None = None, *,
        iters: int = 20, lp_norm: float = 0.7, beta: float = 10.0, kappa: float = 1.01
        ) -> Quantized:
    """Half-quadratic quantization: keep each block's min/max scale and fit its zero point by
    the proximal iterations of HQQ (an ``l_p`` shrinkage of the error, ``p < 1``, then the zero
    as the mean residual). Every iterate (rounded to a code for uint8 zero points) is a
    candidate; each block keeps the one of least mean absolute error (HQQ's own measure) or,
    given ``importance``, of least importance-weighted squared error, starting from min/max's
    zero, and the iterations stop when no block improves. Calibration free."""
    _check(weight, fmt)
    if fmt.symmetric:
        raise SpecError(f"HQQ fits zero points; {fmt.name} has none: use an asymmetric "
                        f"format such as {fmt.name[:-1]}a or {fmt.name[:-1]}f")

    def fit(x: np.ndarray, w: np.ndarray) -> _Rows:
        return _hqq_rows(x, w if importance is not None else None, fmt,
                         (iters, lp_norm, beta, kappa))

    return _by_rows(weight, fmt, importance, fit)


def _hqq_rows(x: np.ndarray, w: np.ndarray | None, fmt: BlockFormat,
              params: tuple[int, float, float, float]) -> _Rows:
    iters, lp_norm, beta, kappa = params
    lo, hi = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    span = np.where(hi - lo > _EPS, hi - lo, float(fmt.levels))
    inv = np.minimum(fmt.levels / span, 2e4)
    zero = -lo * inv
    best, best_zero = np.full(zero.shape, np.inf), zero
    for _ in range(iters):
        cand = np.clip(np.rint(zero), 0, fmt.levels) if fmt.zero == "uint8" else zero
        q = np.clip(np.rint(x * inv + cand), 0, fmt.levels)
        e = x - (q - cand) / inv
        err = (np.mean(np.abs(e), axis=-1, keepdims=True) if w is None
               else np.sum(w * e * e, axis=-1, keepdims=True))
        better = err < best
        if not better.any():
            break
        best, best_zero = np.where(better, err, best), np.where(better, cand, best_zero)
        q = np.clip(np.rint(x * inv + zero), 0, fmt.levels)
        e = x - (q - zero) / inv
        shrunk = np.sign(e) * np.maximum(np.abs(e) - np.power(np.abs(e) + 1e-8, lp_norm - 1)
                                         / beta, 0.0)
        zero = np.mean(q - (x - shrunk) * inv, axis=-1, keepdims=True)
        beta *= kappa
    scales = 1.0 / inv
    return _encode(x, scales, best_zero, fmt.levels), scales, best_zero


def kquant(weight: np.ndarray, fmt: BlockFormat, importance: np.ndarray | None = None,
           *, steps: int = 20) -> Quantized:
    """k-quant style scale search (llama.cpp's make_qkx for zero-point formats, make_qx for
    symmetric ones): per block, the trial scale (and minimum) whose codes, refit by weighted
    least squares, give the least ``importance``-weighted squared error; never worse than
    round to nearest. Compiled (:mod:`mpsearch.kernels._kquant`)."""
    from mpsearch.kernels._kquant import kquant_search

    _check(weight, fmt)
    kind = ("none", "uint8", "float").index(fmt.zero)
    return _by_rows(weight, fmt, importance,
                    lambda x, w: kquant_search(x, w, fmt.levels, kind, steps))


def weighted_error(weight: np.ndarray, approx: np.ndarray, hessian: np.ndarray) -> float:
    """``tr(E^T H E)`` for ``E = weight - approx`` ``[K, N]``: the summed squared output error
    over the calibration inputs whose ``X^T X`` is ``hessian`` ``[K, K]`` (a ``[K]`` vector is
    read as a diagonal)."""
    e = np.asarray(weight, np.float64) - np.asarray(approx, np.float64)
    h = np.asarray(hessian, np.float64)
    if h.ndim == 1:
        return float(np.sum(h[:, None] * e * e))
    return float(np.sum(e * (h @ e)))


def quantize(weight: np.ndarray, fmt: BlockFormat, method: str,
             importance: np.ndarray | None = None) -> Quantized:
    """Quantize by ``method`` (``rtn``, ``hqq``, ``kquant``); GPTQ needs a Hessian: see
    :func:`mpsearch.llm._gptq.gptq`."""
    if method == "rtn":
        return rtn(weight, fmt)
    if method == "hqq":
        return hqq(weight, fmt, importance)
    if method == "kquant":
        return kquant(weight, fmt, importance)
    raise SpecError(f"weight-only method '{method}' unknown; use rtn, hqq, kquant or gptq")
