# mypy: allow-untyped-defs, allow-untyped-calls
"""k-quant style scale search over weight blocks (llama.cpp's make_qkx / make_qx), compiled.

Consumes blocks ``x`` float64 ``[M, B]`` and per-value weights ``w`` ``[M, B]``; produces each
block's codes ``[M, B]``, scale and zero ``[M, 1]`` (value = ``(code - zero) * scale``) of least
weighted squared error among round to nearest and the trial scales. ``kind`` 0 is symmetric (the
zero is ``2^(bits-1)``), 1 an integer zero code, 2 a float zero. :func:`kquant_search_numpy` is
the NumPy twin with the same signature, the reference of the tests.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["kquant_search", "kquant_search_numpy"]

_EPS = 1e-12


# -- NumPy twin --------------------------------------------------------------------------------
def _rtn_numpy(x: np.ndarray, levels: int, kind: int) -> tuple[np.ndarray, np.ndarray]:
    if kind == 0:
        half = (levels + 1) // 2
        peak = np.take_along_axis(x, np.argmax(np.abs(x), axis=-1)[..., None], axis=-1)
        return peak / -half, np.full_like(peak, half)
    lo, hi = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    if kind == 1:
        lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    scale = (hi - lo) / levels
    zero = -lo / np.where(scale > _EPS, scale, 1.0)
    if kind == 1:
        zero = np.clip(np.rint(zero), 0, levels)
    return np.where(scale > _EPS, scale, 0.0), np.where(scale > _EPS, zero, 0.0)


def _encode_numpy(x: np.ndarray, s: np.ndarray, z: np.ndarray, levels: int) -> np.ndarray:
    inv = np.where(s != 0, 1.0 / np.where(s != 0, s, 1.0), 0.0)
    out: np.ndarray = np.clip(np.rint(x * inv + z), 0, levels)
    return out


def _refit_numpy(x: np.ndarray, w: np.ndarray, c: np.ndarray, z: np.ndarray) -> np.ndarray:
    lev = c - z
    den = np.sum(w * lev * lev, axis=-1, keepdims=True)
    num = np.sum(w * lev * x, axis=-1, keepdims=True)
    out: np.ndarray = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
    return out


def _err_numpy(x: np.ndarray, w: np.ndarray, c: np.ndarray, s: np.ndarray,
               z: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.sum(w * ((c - z) * s - x) ** 2, axis=-1, keepdims=True)
    return out


def kquant_search_numpy(x: np.ndarray, w: np.ndarray, levels: int, kind: int, steps: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    scale, zero = _rtn_numpy(x, levels, kind)
    codes = _encode_numpy(x, scale, zero, levels)
    best = _err_numpy(x, w, codes, scale, zero)
    if kind == 0:
        peak = scale * -zero
        for step in range(-steps // 2, steps // 2 + 1):
            trial = _encode_numpy(x, peak / -(zero + 0.1 * step), zero, levels)
            s = _refit_numpy(x, w, trial, zero)
            err = _err_numpy(x, w, trial, s, zero)
            better = err < best
            codes, scale = np.where(better, trial, codes), np.where(better, s, scale)
            best = np.where(better, err, best)
        return codes, scale, zero
    lo = np.minimum(x.min(axis=-1, keepdims=True), 0.0)
    span = np.maximum(x.max(axis=-1, keepdims=True) - lo, _EPS)
    sw, sx = w.sum(-1, keepdims=True), (w * x).sum(-1, keepdims=True)
    for step in range(steps + 1):
        trial = np.clip(np.rint((levels - 1.0 + 2.0 * step / steps) / span * (x - lo)),
                        0, levels)
        sl, sl2 = (w * trial).sum(-1, keepdims=True), (w * trial ** 2).sum(-1, keepdims=True)
        sxl = (w * trial * x).sum(-1, keepdims=True)
        det = sw * sl2 - sl * sl
        ok = det > _EPS
        s = np.where(ok, (sw * sxl - sx * sl) / np.where(ok, det, 1.0), 0.0)
        m = np.where(ok, (sl2 * sx - sl * sxl) / np.where(ok, det, 1.0), 0.0)
        low = m > 0
        s = np.where(low, sxl / np.maximum(sl2, _EPS), s)
        m = np.where(low, 0.0, m)
        ok &= s > _EPS
        z = -m / np.where(ok, s, 1.0)
        if kind == 1:
            z = np.clip(np.rint(z), 0, levels)
            trial = _encode_numpy(x, s, z, levels)
            s = _refit_numpy(x, w, trial, z)
        err = _err_numpy(x, w, trial, s, z)
        better = ok & (err < best)
        codes, scale = np.where(better, trial, codes), np.where(better, s, scale)
        zero, best = np.where(better, z, zero), np.where(better, err, best)
    return codes, scale, zero


# -- compiled ----------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _encode(x, s, z, levels, out):
    inv = 1.0 / s if s != 0 else 0.0
    for i in range(x.size):
        out[i] = min(max(np.rint(x[i] * inv + z), 0.0), levels)


@njit(cache=True, nogil=True)
def _err(x, w, c, s, z):
    total = 0.0
    for i in range(x.size):
        d = (c[i] - z) * s - x[i]
        total += w[i] * d * d
    return total


@njit(cache=True, nogil=True)
def _refit(x, w, c, z):
    num = 0.0
    den = 0.0
    for i in range(x.size):
        lev = c[i] - z
        num += w[i] * lev * x[i]
        den += w[i] * lev * lev
    return num / den if den > 0 else 0.0


@njit(cache=True, nogil=True)
def _rtn(x, levels, kind):
    if kind == 0:
        peak = x[0]
        for v in x:
            if abs(v) > abs(peak):
                peak = v
        half = (levels + 1) // 2
        return peak / -half, float(half)
    lo, hi = x.min(), x.max()
    if kind == 1:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / levels
    if not scale > _EPS:
        return 0.0, 0.0
    zero = -lo / scale
    if kind == 1:
        zero = min(max(np.rint(zero), 0.0), levels)
    return scale, zero


@njit(cache=True, nogil=True)
def _search_sym(x, w, levels, steps, codes, trial):
    scale, zero = _rtn(x, levels, 0)
    _encode(x, scale, zero, levels, codes)
    best = _err(x, w, codes, scale, zero)
    peak = scale * -zero
    for step in range(-steps // 2, steps // 2 + 1):
        _encode(x, peak / -(zero + 0.1 * step), zero, levels, trial)
        s = _refit(x, w, trial, zero)
        err = _err(x, w, trial, s, zero)
        if err < best:
            codes[:] = trial
            scale, best = s, err
    return scale, zero


@njit(cache=True, nogil=True)
def _search_asym(x, w, levels, kind, steps, codes, trial):
    scale, zero = _rtn(x, levels, kind)
    _encode(x, scale, zero, levels, codes)
    best = _err(x, w, codes, scale, zero)
    lo = min(x.min(), 0.0)
    span = max(x.max() - lo, _EPS)
    sw, sx = w.sum(), (w * x).sum()
    for step in range(steps + 1):
        a = (levels - 1.0 + 2.0 * step / steps) / span
        sl = sl2 = sxl = 0.0
        for i in range(x.size):
            t = min(max(np.rint(a * (x[i] - lo)), 0.0), levels)
            trial[i] = t
            sl += w[i] * t
            sl2 += w[i] * t * t
            sxl += w[i] * t * x[i]
        det = sw * sl2 - sl * sl
        ok = det > _EPS
        s = (sw * sxl - sx * sl) / det if ok else 0.0
        m = (sl2 * sx - sl * sxl) / det if ok else 0.0
        if m > 0:
            s, m = sxl / max(sl2, _EPS), 0.0
        ok = ok and s > _EPS
        z = -m / (s if ok else 1.0)
        if kind == 1:
            z = min(max(np.rint(z), 0.0), levels)
            _encode(x, s, z, levels, trial)
            s = _refit(x, w, trial, z)
        err = _err(x, w, trial, s, z)
        if ok and err < best:
            codes[:] = trial
            scale, zero, best = s, z, err
    return scale, zero


@njit(cache=True, nogil=True, parallel=True)
def _search_kernel(x, w, levels, kind, steps, codes, scales, zeros):
    for m in prange(x.shape[0]):
        trial = np.empty(x.shape[1])
        if kind == 0:
            s, z = _search_sym(x[m], w[m], levels, steps, codes[m], trial)
        else:
            s, z = _search_asym(x[m], w[m], levels, kind, steps, codes[m], trial)
        scales[m, 0] = s
        zeros[m, 0] = z


def kquant_search(x: np.ndarray, w: np.ndarray, levels: int, kind: int, steps: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compiled :func:`kquant_search_numpy` (blocks along the last axis of any shape); sums
    run in block order, not pairwise, so a near-tie between trials may resolve differently."""
    shape = x.shape
    flat = np.ascontiguousarray(x, np.float64).reshape(-1, shape[-1])
    weights = np.ascontiguousarray(np.broadcast_to(w, shape), np.float64).reshape(flat.shape)
    codes = np.empty_like(flat)
    scales, zeros = np.empty((flat.shape[0], 1)), np.empty((flat.shape[0], 1))
    _search_kernel(flat, weights, float(levels), int(kind), int(steps), codes, scales, zeros)
    per_block = (*shape[:-1], 1)
    return codes.reshape(shape), scales.reshape(per_block), zeros.reshape(per_block)
