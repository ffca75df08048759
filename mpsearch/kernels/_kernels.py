# mypy: allow-untyped-defs, allow-untyped-calls
"""Numba kernels for calibration and error analysis.

Consumes float32 arrays (any shape; the wrappers ravel them to contiguous 1-D views) and
histograms; produces statistics, clip ranges, fake-quantized arrays and error figures. Every
kernel ``name`` has a NumPy twin ``name_numpy`` with the same signature and semantics, used as
the reference in the property tests and in the benchmark. Kernels are compiled on first use
and cached on disk (``cache=True``), so the JIT cost is paid once per machine, not per call.

Histogram convention: ``hist`` has ``bins`` equal-width bins over ``[lo, hi]``; bin ``k`` holds
the values ``v`` with ``floor((v - lo) * s) == k`` where ``s = float32(bins / (hi - lo))`` and the
arithmetic is float32; values below ``lo`` (and NaN) saturate into the first bin, values above
``hi`` into the last one. Range searches treat the values as uniform inside each bin.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import numba
import numpy as np
from numba import float32, int32, njit, prange

__all__ = [
    "abs_histogram",
    "central_moments",
    "central_moments_numpy",
    "entropy_divergences",
    "entropy_divergences_numpy",
    "entropy_threshold",
    "entropy_threshold_numpy",
    "error_stats",
    "error_stats_numpy",
    "fake_quantize",
    "fake_quantize_numpy",
    "fake_quantize_per_channel",
    "fake_quantize_per_channel_numpy",
    "histogram_merge",
    "histogram_merge_numpy",
    "histogram_rebin",
    "histogram_rebin_numpy",
    "mse_threshold",
    "mse_threshold_numpy",
    "percentile_range",
    "percentile_range_numpy",
    "quantize_codes",
    "quantize_codes_numpy",
    "range_mse",
    "range_mse_numpy",
    "set_threads",
    "tensor_stats",
    "tensor_stats_numpy",
]

Stats = tuple[float, float, float, float, np.ndarray]
_BLOCK = 2048  # elements per inner block: the block stays in L1 between its passes
_MIN_CHUNK = 65536  # elements per parallel chunk, at least
_COARSE = 128  # candidates per coarse threshold search (then as many around the best one)


P = ParamSpec("P")
R = TypeVar("R")


def _interruptible(kernel: Callable[P, R]) -> Callable[P, R]:
    """``kernel`` with a Ctrl-C arriving inside compiled code raised as KeyboardInterrupt: numba's
    dispatcher otherwise reports it as ``SystemError: CPUDispatcher(...) returned a result with
    an exception set``, the KeyboardInterrupt only at the end of its chain of causes."""

    @functools.wraps(kernel)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return kernel(*args, **kwargs)
        except SystemError as e:
            cause: BaseException | None = e
            for _ in range(16):  # numba wraps it in a SystemError per nested dispatch
                cause = cause.__cause__ or cause.__context__ if cause is not None else None
                if isinstance(cause, KeyboardInterrupt):
                    raise KeyboardInterrupt from e
            raise

    return run


def set_threads(threads: int) -> None:
    """Use ``threads`` threads (capped by the machine) in the parallel kernels."""
    limit = int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    numba.set_num_threads(max(1, min(int(threads), limit)))


def _readonly(x: np.ndarray) -> np.ndarray:
    """A read-only view of ``x``. Numba types a read-only array apart from a writable one and
    compiles a kernel anew for it; a model's weights arrive read-only and activations do not,
    so every input a kernel only reads is passed read-only: one compiled signature each."""
    view = x.view()
    view.flags.writeable = False
    return view


def _flat(x: Any) -> np.ndarray:
    return _readonly(np.ascontiguousarray(x, dtype=np.float32).reshape(-1))


def _chunks(size: int) -> int:
    """Parallel chunks of a reduction over ``size`` values: at least :data:`_MIN_CHUNK` values
    each, at most eight per thread."""
    return max(1, min(size // _MIN_CHUNK, 8 * numba.get_num_threads()))


def _hist_scale(lo: float, hi: float, bins: int) -> tuple[np.float32, np.float32]:
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo) or bins < 1:
        raise ValueError(f"histogram range [{lo}, {hi}] with {bins} bins is invalid; "
                         "need finite lo < hi and bins >= 1")
    return np.float32(lo), np.float32(bins / (hi - lo))


# ------------------------------------------------------------------ fused statistics
@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _block_moments(x, xi, a, b, mn, mx):
    # min/max on order-preserving int32 keys of the float bits: float min/max with NaN
    # semantics does not vectorize, integer min/max does
    c31 = int32(31)
    mask = int32(0x7FFFFFFF)
    s = 0.0
    ss = 0.0
    for i in range(a, b):
        bits = xi[i]
        key = int32(bits ^ int32(int32(bits >> c31) & mask))
        mn = min(mn, key)
        mx = max(mx, key)
        d = np.float64(x[i])
        s += d
        ss += d * d
    return mn, mx, s, ss


@njit(cache=True, nogil=True)
def _block_bins(x, a, b, lo, scale, bmax, idx):
    zero = float32(0.0)
    for i in range(a, b):
        t = (x[i] - lo) * scale
        t = t if t > zero else zero  # NaN and v < lo -> first bin
        t = t if t < bmax else bmax  # v > hi -> last bin
        idx[i - a] = int32(t)  # type: ignore[arg-type]


@njit(cache=True, nogil=True)
def _stats_block(x, xi, a, b, lo, scale, bmax, idx, mn, mx):
    # two passes over an L1-resident block: each loop vectorizes, a fused one does not
    mn, mx, s, ss = _block_moments(x, xi, a, b, mn, mx)
    _block_bins(x, a, b, lo, scale, bmax, idx)
    return mn, mx, s, ss


@njit(cache=True, nogil=True, parallel=True)
def _tensor_stats_kernel(x, xi, lo, scale, bins, nchunks):
    n = x.size
    per = (n + nchunks - 1) // nchunks
    keys = np.empty((nchunks, 2), np.int32)
    sums = np.zeros((nchunks, 2))
    hists = np.zeros((nchunks, bins), np.int64)
    bmax = float32(bins - 0.5)
    for c in prange(nchunks):
        a = min(n, c * per)
        b = min(n, a + per)
        idx = np.empty(_BLOCK, np.int32)
        sub = np.zeros((4, bins), np.int32)  # 4 interleaved copies break store->load chains
        mn = int32(2147483647)
        mx = int32(-2147483648)
        s = 0.0
        ss = 0.0
        for start in range(a, b, _BLOCK):
            stop = min(b, start + _BLOCK)
            mn, mx, ps, pss = _stats_block(x, xi, start, stop, lo, scale, bmax, idx, mn, mx)
            s += ps
            ss += pss
            m = stop - start
            m4 = m - m % 4
            for i in range(0, m4, 4):
                sub[0, idx[i]] += 1
                sub[1, idx[i + 1]] += 1
                sub[2, idx[i + 2]] += 1
                sub[3, idx[i + 3]] += 1
            for i in range(m4, m):
                sub[0, idx[i]] += 1
        for j in range(bins):
            hists[c, j] = sub[0, j] + sub[1, j] + sub[2, j] + sub[3, j]
        keys[c, 0] = mn
        keys[c, 1] = mx
        sums[c, 0] = s
        sums[c, 1] = ss
    return keys, sums, hists


def _key_to_float(key: int) -> float:
    k = np.int32(key)
    bits = k ^ ((k >> np.int32(31)) & np.int32(0x7FFFFFFF))
    return float(np.array([bits], dtype=np.int32).view(np.float32)[0])


@_interruptible
def tensor_stats(x: Any, lo: float, hi: float, bins: int) -> Stats:
    """(min, max, sum, sum of squares, histogram) of ``x`` in one parallel pass over memory.

    Sums are accumulated in float64, so ``sumsq`` is finite exactly when every value is;
    ``min``/``max`` ignore NaN only if there is none (check ``sumsq`` first).
    """
    flat = _flat(x)
    lo32, scale = _hist_scale(lo, hi, bins)
    if flat.size == 0:
        return math.inf, -math.inf, 0.0, 0.0, np.zeros(bins, np.int64)
    nchunks = _chunks(flat.size)
    nchunks = max(nchunks, -(-flat.size // (1 << 30)))  # int32 sub-histograms never overflow
    keys, sums, hists = _tensor_stats_kernel(
        flat, flat.view(np.int32), lo32, scale, int(bins), nchunks)
    return (_key_to_float(keys[:, 0].min()), _key_to_float(keys[:, 1].max()),
            float(sums[:, 0].sum()), float(sums[:, 1].sum()), hists.sum(axis=0))


def tensor_stats_numpy(x: Any, lo: float, hi: float, bins: int) -> Stats:
    """NumPy twin of :func:`tensor_stats` (same binning arithmetic, several passes)."""
    flat = _flat(x)
    lo32, scale = _hist_scale(lo, hi, bins)
    if flat.size == 0:
        return math.inf, -math.inf, 0.0, 0.0, np.zeros(bins, np.int64)
    d = flat.astype(np.float64)
    t = (flat - lo32) * scale
    t = np.where(t > 0, t, np.float32(0))
    t = np.where(t < np.float32(bins - 0.5), t, np.float32(bins - 0.5))
    hist = np.bincount(t.astype(np.int32), minlength=bins).astype(np.int64)
    return float(flat.min()), float(flat.max()), float(d.sum()), float((d * d).sum()), hist


@njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc"})
def _central_kernel(x, mean, nchunks):
    n = x.size
    per = (n + nchunks - 1) // nchunks
    acc = np.zeros((nchunks, 3))
    for c in prange(nchunks):
        a = min(n, c * per)
        b = min(n, a + per)
        s2 = 0.0
        s3 = 0.0
        s4 = 0.0
        for i in range(a, b):
            d = np.float64(x[i]) - mean
            dd = d * d
            s2 += dd
            s3 += dd * d
            s4 += dd * dd
        acc[c, 0] = s2
        acc[c, 1] = s3
        acc[c, 2] = s4
    return acc


@_interruptible
def central_moments(x: Any, mean: float) -> tuple[float, float, float]:
    """Sums of the 2nd, 3rd and 4th powers of ``x - mean`` (float64), in one parallel pass and
    no temporary: a tensor's skew and kurtosis around the mean :func:`tensor_stats` gave."""
    flat = _flat(x)
    nchunks = _chunks(flat.size)
    acc = _central_kernel(flat, float(mean), nchunks).sum(axis=0)
    return float(acc[0]), float(acc[1]), float(acc[2])


def central_moments_numpy(x: Any, mean: float) -> tuple[float, float, float]:
    """NumPy twin of :func:`central_moments`."""
    d = _flat(x).astype(np.float64) - float(mean)
    dd = d * d
    return float(dd.sum()), float(dd @ d), float(dd @ dd)


# ------------------------------------------------------------------ histogram rebin / merge
@njit(cache=True, nogil=True)
def _rebin_kernel(hist, lo, hi, new_lo, new_hi, new_bins):
    # piecewise-linear CDF of the old histogram, read at the new edges (np.interp's formula)
    n = hist.size
    width = (hi - lo) / n
    new_width = (new_hi - new_lo) / new_bins
    cdf = np.zeros(n + 1)
    for i in range(n):
        cdf[i + 1] = cdf[i] + hist[i]
    total = cdf[n]
    out = np.zeros(new_bins)
    prev = 0.0
    j = 0
    for k in range(1, new_bins):
        e = new_lo + k * new_width
        if e <= lo:
            c = 0.0
        elif e >= hi:
            c = total
        else:
            while j < n - 1 and lo + (j + 1) * width <= e:
                j += 1
            x0 = lo + j * width
            x1 = lo + (j + 1) * width
            c = cdf[j] + (cdf[j + 1] - cdf[j]) * ((e - x0) / (x1 - x0))
        out[k - 1] = c - prev
        prev = c
    out[new_bins - 1] = total - prev
    return out


@_interruptible
def histogram_rebin(
    hist: Any, lo: float, hi: float, new_lo: float, new_hi: float, new_bins: int
) -> np.ndarray:
    """Counts of ``hist`` (over [lo, hi]) redistributed onto ``new_bins`` bins over
    [new_lo, new_hi], uniform inside each old bin; mass outside saturates into the edge bins.
    Exact (integer-valued) when every new edge falls on an old edge."""
    h = np.ascontiguousarray(hist, dtype=np.float64)
    _hist_scale(lo, hi, h.size)
    _hist_scale(new_lo, new_hi, new_bins)
    return np.asarray(_rebin_kernel(h, float(lo), float(hi), float(new_lo), float(new_hi),
                                    int(new_bins)))


def histogram_rebin_numpy(
    hist: Any, lo: float, hi: float, new_lo: float, new_hi: float, new_bins: int
) -> np.ndarray:
    """NumPy twin of :func:`histogram_rebin`."""
    h = np.asarray(hist, dtype=np.float64)
    edges = lo + np.arange(h.size + 1) * ((hi - lo) / h.size)
    edges[-1] = hi
    new_edges = new_lo + np.arange(new_bins + 1) * ((new_hi - new_lo) / new_bins)
    cdf = np.interp(new_edges[1:-1], edges, np.concatenate(([0.0], np.cumsum(h))))
    return np.diff(np.concatenate(([0.0], cdf, [h.sum()])))


@_interruptible
def histogram_merge(
    a: Any, a_lo: float, a_hi: float, b: Any, b_lo: float, b_hi: float, bins: int | None = None
) -> tuple[np.ndarray, float, float]:
    """Sum of two histograms on the union of their ranges: (hist, lo, hi)."""
    bins = int(bins or len(a))
    lo, hi = min(a_lo, b_lo), max(a_hi, b_hi)
    return (histogram_rebin(a, a_lo, a_hi, lo, hi, bins)
            + histogram_rebin(b, b_lo, b_hi, lo, hi, bins)), lo, hi


def histogram_merge_numpy(
    a: Any, a_lo: float, a_hi: float, b: Any, b_lo: float, b_hi: float, bins: int | None = None
) -> tuple[np.ndarray, float, float]:
    """NumPy twin of :func:`histogram_merge`."""
    bins = int(bins or len(a))
    lo, hi = min(a_lo, b_lo), max(a_hi, b_hi)
    return (histogram_rebin_numpy(a, a_lo, a_hi, lo, hi, bins)
            + histogram_rebin_numpy(b, b_lo, b_hi, lo, hi, bins)), lo, hi


def abs_histogram(hist: Any, lo: float, hi: float) -> tuple[np.ndarray, float]:
    """Histogram of ``|x|`` over [0, amax] with the bin width of ``hist``: (hist, amax).

    Exact for the calibration ranges ([0, A] and [-A, A] with an even bin count).
    """
    h = np.asarray(hist, dtype=np.float64)
    amax = max(abs(lo), abs(hi))
    if lo == 0:
        return h.copy(), float(hi)
    width = (hi - lo) / h.size
    bins = max(1, int(round(amax / width)))
    edges = np.linspace(0.0, amax, bins + 1)
    old = lo + np.arange(h.size + 1) * width
    old[-1] = hi
    cdf = np.concatenate(([0.0], np.cumsum(h)))
    below = np.interp(edges, old, cdf)  # mass below t
    above_neg = np.interp(-edges, old, cdf)  # mass below -t
    folded = below - above_neg
    folded[0] = 0.0
    return np.maximum(np.diff(folded), 0.0), float(amax)


# ------------------------------------------------------------------ percentile
@njit(cache=True, nogil=True)
def _quantile_kernel(hist, lo, hi, q):
    n = hist.size
    total = 0.0
    for i in range(n):
        total += hist[i]
    target = q * total
    width = (hi - lo) / n
    c = 0.0
    for i in range(n):
        h = hist[i]
        if h > 0 and c + h >= target:
            return lo + (i + (target - c) / h) * width
        c += h
    return hi


def _quantile_numpy(hist: np.ndarray, lo: float, hi: float, q: float) -> float:
    cdf = np.cumsum(hist)
    target = q * cdf[-1]
    i = int(np.searchsorted(cdf, target, side="left"))
    while i < hist.size and hist[i] <= 0:
        i += 1
    if i >= hist.size:
        return hi
    before = cdf[i] - hist[i]
    return float(lo + (i + (target - before) / hist[i]) * ((hi - lo) / hist.size))


def _percentile(quantile: Any, hist: Any, lo: float, hi: float, p: float,
                symmetric: bool) -> tuple[float, float]:
    if not 0.0 < p <= 100.0:
        raise ValueError(f"percentile {p} is outside (0, 100]; use e.g. 99.99")
    if symmetric:
        h, amax = abs_histogram(hist, lo, hi)
        t = float(quantile(np.ascontiguousarray(h), 0.0, amax, p / 100.0))
        return -t, t
    h = np.ascontiguousarray(hist, dtype=np.float64)
    cut = (100.0 - p) / 200.0
    return float(quantile(h, lo, hi, cut)), float(quantile(h, lo, hi, 1.0 - cut))


@_interruptible
def percentile_range(
    hist: Any, lo: float, hi: float, p: float, *, symmetric: bool = False
) -> tuple[float, float]:
    """Clip range keeping ``p`` percent of the values: (100 - p) / 2 percent cut on each side,
    or the ``p``-th percentile of ``|x|`` when ``symmetric`` (returns (-t, t))."""
    return _percentile(_quantile_kernel, hist, lo, hi, p, symmetric)


def percentile_range_numpy(
    hist: Any, lo: float, hi: float, p: float, *, symmetric: bool = False
) -> tuple[float, float]:
    """NumPy twin of :func:`percentile_range`."""
    return _percentile(_quantile_numpy, hist, lo, hi, p, symmetric)


# ------------------------------------------------------------------ entropy (KL)
@njit(cache=True, nogil=True)
def _kl_kernel(hist, nq, start, eps):
    # O(n * nq): Q is constant over the non-empty bins of a level, so every sum over a level
    # comes from prefix sums of p, p log p and the non-empty indicator
    n = hist.size
    bins = hist.copy()
    if n > 1:
        bins[0] = bins[1]  # zero is exact on every grid: ignore the spike ReLU puts there
    out = np.full(max(0, n - start + 1), np.inf)
    csum = np.zeros(n + 1)
    cplogp = np.zeros(n + 1)
    cnz = np.zeros(n + 1)
    for j in range(n):
        b = bins[j]
        csum[j + 1] = csum[j] + b
        cplogp[j + 1] = cplogp[j] + (b * np.log(b) if b > 0 else 0.0)
        cnz[j + 1] = cnz[j] + (1.0 if b > 0 else 0.0)
    total = csum[n]
    for i in range(start, n + 1):
        nonzero = cnz[i]
        zeros = i - nonzero
        if total <= 0.0 or nonzero <= 0.0:
            continue
        cut = eps * zeros / nonzero  # smoothing: Q's empty bins get eps counts
        q_total = csum[i]  # sum of Q: the removed cut mass equals the added eps mass
        last = bins[i - 1]
        tail = total - csum[i]
        acc = 0.0  # sum over bins of p * log(q), p without the outliers
        q_last = eps
        valid = True
        for g in range(nq):
            a = (g * i + nq - 1) // nq
            b = ((g + 1) * i + nq - 1) // nq
            nz = cnz[b] - cnz[a]
            if nz <= 0.0:
                continue
            q = (csum[b] - csum[a]) / nz - cut
            if q <= 0.0:  # smoothing took more than a level holds: no valid Q
                valid = False
                break
            acc += (csum[b] - csum[a]) * np.log(q)
            if a <= i - 1 < b and last > 0:
                q_last = q
        if not valid:
            continue
        # sum p log p - sum p log q with bin i-1 holding last + tail
        plogp = cplogp[i]
        plogq = acc
        if tail > 0.0:
            p_last = last + tail
            plogp += p_last * np.log(p_last) - (last * np.log(last) if last > 0 else 0.0)
            plogq += tail * np.log(q_last)
        out[i - start] = (plogp - plogq) / total - np.log(total) + np.log(q_total)
    return out


KL_EPS = 1e-4


@_interruptible
def entropy_divergences(hist_abs: Any, nq: int, start: int) -> np.ndarray:
    """KL(P || Q) for every candidate threshold bin ``i`` in [start, len(hist_abs)].

    P is the first ``i`` bins with the outliers added to bin ``i - 1``; Q is those ``i`` bins
    without the outliers quantized to ``nq`` levels and spread back over each level's non-empty
    bins (TensorRT's calibrator); Q's empty bins get ``KL_EPS`` counts, as in MXNet and ONNX
    Runtime, so clipping a populated tail costs a large but finite divergence. The first bin is
    set to the second one: zero is exact on every grid, so ReLU's spike there does not count.
    """
    return np.asarray(_kl_kernel(np.ascontiguousarray(hist_abs, dtype=np.float64), int(nq),
                                 int(start), KL_EPS))


def entropy_divergences_numpy(hist_abs: Any, nq: int, start: int) -> np.ndarray:
    """NumPy twin of :func:`entropy_divergences`."""
    bins = np.array(hist_abs, dtype=np.float64)
    n = bins.size
    if n > 1:
        bins[0] = bins[1]
    out = np.full(max(0, n - start + 1), np.inf)
    for i in range(start, n + 1):
        head = bins[:i]
        p = head.copy()
        p[-1] += bins[i:].sum()
        g = (np.arange(i) * nq) // i
        sums = np.bincount(g, weights=head, minlength=nq)
        nonzero = np.bincount(g, weights=(head > 0).astype(np.float64), minlength=nq)
        filled = head > 0
        zeros = i - int(filled.sum())
        if p.sum() <= 0 or zeros >= i:
            continue
        q = np.where(filled, sums[g] / np.maximum(nonzero[g], 1.0), 0.0)
        q = np.where(filled, q - KL_EPS * zeros / (i - zeros), KL_EPS)
        if np.any(q <= 0):
            continue
        pn, qn = p / p.sum(), q / q.sum()
        mask = pn > 0
        out[i - start] = float(np.sum(pn[mask] * np.log(pn[mask] / qn[mask])))
    return out


def _entropy(curve_fn: Any, hist: Any, lo: float, hi: float, bits: int) -> float:
    h, amax = abs_histogram(hist, lo, hi)
    nq = 1 << (bits if lo >= 0 else bits - 1)  # unsigned grids have twice the levels
    if nq >= h.size or h.sum() <= 0:
        return amax
    curve = curve_fn(h, nq, nq)
    if not np.isfinite(curve).any():
        return amax
    best = curve.size - 1 - int(np.argmin(curve[::-1]))  # the last minimum: widest range
    return float(amax * (best + nq) / h.size)


@_interruptible
def entropy_threshold(hist: Any, lo: float, hi: float, bits: int) -> float:
    """TensorRT-style threshold ``t`` on ``|x|`` minimizing the KL divergence between the
    histogram and its ``bits``-bit quantization; the full range when ``2**bits`` levels
    outnumber the bins."""
    return _entropy(entropy_divergences, hist, lo, hi, bits)


def entropy_threshold_numpy(hist: Any, lo: float, hi: float, bits: int) -> float:
    """NumPy twin of :func:`entropy_threshold`."""
    return _entropy(entropy_divergences_numpy, hist, lo, hi, bits)


# ------------------------------------------------------------------ MSE-optimal clipping
@njit(cache=True, nogil=True)
def _cube(x):
    return x * x * x


@njit(cache=True, nogil=True)
def _saw(x, step):
    # integral of (t - step * round(t / step))**2 from -step/2 to x
    m = np.floor(x / step + 0.5)
    r = x - m * step
    return m * _cube(step) / 12.0 + (_cube(r) + _cube(step) / 8.0) / 3.0


@njit(cache=True, nogil=True)
def _range_mse_kernel(hist, lo, hi, a, b, levels):
    n = hist.size
    width = (hi - lo) / n
    a = min(a, 0.0)
    b = max(b, 0.0)
    step = (b - a) / levels
    if step <= 0.0:
        return 0.0
    zp = min(max(np.floor(-a / step + 0.5), 0.0), levels)
    low = -zp * step
    high = (levels - zp) * step
    err = 0.0
    total = 0.0
    for j in range(n):
        c = hist[j]
        if c <= 0.0:
            continue
        u = lo + j * width
        v = u + width
        e = 0.0
        if u < low:
            w = min(v, low)
            e += (_cube(w - low) - _cube(u - low)) / 3.0
        if v > high:
            w = max(u, high)
            e += (_cube(v - high) - _cube(w - high)) / 3.0
        s = max(u, low)
        t = min(v, high)
        if t > s:
            e += _saw(t, step) - _saw(s, step)
        err += c * e / width
        total += c
    return err / total if total > 0 else 0.0


def _levels(bits: int) -> float:
    if bits not in (2, 3, 4, 5, 6, 7, 8, 12, 16):
        raise ValueError(f"bit width {bits} is not supported; use 8 or 16")
    return float((1 << bits) - 1)


@_interruptible
def range_mse(hist: Any, lo: float, hi: float, a: float, b: float, bits: int) -> float:
    """Expected squared error of quantizing the histogram's values (uniform inside each bin)
    on the ``bits``-bit grid of the range [a, b] (widened to contain 0), clipping included."""
    return float(_range_mse_kernel(np.ascontiguousarray(hist, dtype=np.float64), float(lo),
                                   float(hi), float(a), float(b), _levels(bits)))


def _cube_numpy(y: np.ndarray) -> np.ndarray:
    return np.asarray(y * y * y)  # the kernel's exact operation order


def _saw_numpy(x: np.ndarray, step: float) -> np.ndarray:
    m = np.floor(x / step + 0.5)
    r = x - m * step
    return m * (step * step * step) / 12.0 + (r * r * r + (step * step * step) / 8.0) / 3.0


def range_mse_numpy(hist: Any, lo: float, hi: float, a: float, b: float, bits: int) -> float:
    """NumPy twin of :func:`range_mse`."""
    h = np.asarray(hist, dtype=np.float64)
    levels = _levels(bits)
    width = (hi - lo) / h.size
    a, b = min(a, 0.0), max(b, 0.0)
    step = (b - a) / levels
    if step <= 0.0:  # an empty range, or one so narrow its step underflows: as the kernel
        return 0.0
    zp = min(max(math.floor(-a / step + 0.5), 0.0), levels)
    low, high = -zp * step, (levels - zp) * step
    u = lo + np.arange(h.size) * width
    v = u + width
    w = np.minimum(v, low)
    e = np.where(u < low, (_cube_numpy(w - low) - _cube_numpy(u - low)) / 3.0, 0.0)
    w = np.maximum(u, high)
    e += np.where(v > high, (_cube_numpy(v - high) - _cube_numpy(w - high)) / 3.0, 0.0)
    s, t = np.maximum(u, low), np.minimum(v, high)
    e += np.where(t > s, _saw_numpy(t, step) - _saw_numpy(s, step), 0.0)
    mask = h > 0
    if not mask.any():
        return 0.0
    err = np.cumsum(h[mask] * e[mask] / width)[-1]  # sequential, like the kernel
    return float(err / np.cumsum(h[mask])[-1])


@njit(cache=True, nogil=True)
def _mse_search_kernel(hist, lo, hi, mn, mx, levels, symmetric, coarse):
    mn = min(mn, 0.0)
    mx = max(mx, 0.0)
    if symmetric:
        amax = max(-mn, mx)
        mn, mx = -amax, amax
    best_a, best_b = mn, mx
    best = _range_mse_kernel(hist, lo, hi, mn, mx, levels)
    # stage 0: shrink both ends together; then each end with the other fixed (asymmetric)
    for stage in range(1 if symmetric or mn == 0.0 or mx == 0.0 else 3):
        if stage == 0:
            pick = 1.0
        elif stage == 1:
            pick = best_b / mx
        else:
            pick = best_a / mn
        center = 0.5
        span = 1.0
        for _level in range(2):  # coarse grid over (0, 1], then a fine grid around the best
            for k in range(coarse + 1):
                f = center - span / 2 + k * (span / coarse)
                if f <= 0.0 or f > 1.0:
                    continue
                if stage == 0:
                    a, b = mn * f, mx * f
                elif stage == 1:
                    a, b = best_a, mx * f
                else:
                    a, b = mn * f, best_b
                e = _range_mse_kernel(hist, lo, hi, a, b, levels)
                if e < best:
                    best, best_a, best_b, pick = e, a, b, f
            center = pick
            span = 2.0 / coarse
    return best_a, best_b


@_interruptible
def mse_threshold(
    hist: Any, lo: float, hi: float, bits: int, *, symmetric: bool = False,
    data_range: tuple[float, float] | None = None,
) -> tuple[float, float]:
    """Clip range [a, b] (containing 0) minimizing :func:`range_mse` for ``bits``-bit
    quantization: a coarse-then-fine search of the shrink factor of both ends of
    ``data_range`` (default: the histogram's range), then of each end alone when asymmetric."""
    mn, mx = data_range if data_range is not None else (lo, hi)
    a, b = _mse_search_kernel(np.ascontiguousarray(hist, dtype=np.float64), float(lo),
                              float(hi), float(mn), float(mx), _levels(bits), bool(symmetric),
                              _COARSE)
    return float(a), float(b)


def mse_threshold_numpy(
    hist: Any, lo: float, hi: float, bits: int, *, symmetric: bool = False,
    data_range: tuple[float, float] | None = None,
) -> tuple[float, float]:
    """NumPy twin of :func:`mse_threshold` (same search, vectorized objective)."""
    h = np.asarray(hist, dtype=np.float64)
    mn, mx = data_range if data_range is not None else (lo, hi)
    mn, mx = min(mn, 0.0), max(mx, 0.0)
    if symmetric:
        amax = max(-mn, mx)
        mn, mx = -amax, amax
    best_a, best_b = mn, mx
    best = range_mse_numpy(h, lo, hi, mn, mx, bits)
    for stage in range(1 if symmetric or mn == 0.0 or mx == 0.0 else 3):
        pick = 1.0 if stage == 0 else best_b / mx if stage == 1 else best_a / mn
        center, span = 0.5, 1.0
        for _level in range(2):
            for f in center - span / 2 + np.arange(_COARSE + 1) * (span / _COARSE):
                if f <= 0.0 or f > 1.0:
                    continue
                a, b = ((mn * f, mx * f) if stage == 0 else (best_a, mx * f) if stage == 1
                        else (mn * f, best_b))
                e = range_mse_numpy(h, lo, hi, a, b, bits)
                if e < best:
                    best, best_a, best_b, pick = e, a, b, float(f)
            center, span = pick, 2.0 / _COARSE
    return float(best_a), float(best_b)


# ------------------------------------------------------------------ fake quantization
@njit(cache=True, nogil=True, parallel=True)
def _fq_kernel(x, out, scale, zp, qmin, qmax):
    for i in prange(x.size):
        q = np.rint(x[i] / scale) + zp
        q = min(max(q, qmin), qmax)
        out[i] = (q - zp) * scale


@njit(cache=True, nogil=True, parallel=True)
def _fq_channel_kernel(x, out, scales, zps, qmin, qmax):
    outer, channels, inner = x.shape
    for oc in prange(outer * channels):
        o = oc // channels
        c = oc % channels
        s = scales[c]
        z = zps[c]
        for i in range(inner):
            q = np.rint(x[o, c, i] / s) + z
            q = min(max(q, qmin), qmax)
            out[o, c, i] = (q - z) * s


def _fq_args(scale: Any, zero_point: Any, qmin: int, qmax: int) -> tuple[Any, ...]:
    if qmin >= qmax:
        raise ValueError(f"integer range [{qmin}, {qmax}] is empty")
    return (np.float32(scale), np.float32(zero_point), np.float32(qmin), np.float32(qmax))


@_interruptible
def fake_quantize(x: Any, scale: float, zero_point: float, qmin: int, qmax: int) -> np.ndarray:
    """``(clip(rint(x / scale) + zp, qmin, qmax) - zp) * scale`` in float32, as ONNX Runtime's
    QuantizeLinear followed by DequantizeLinear computes it (round half to even)."""
    arr = np.asarray(x)
    flat = _flat(arr)
    out = np.empty_like(flat)
    _fq_kernel(flat, out, *_fq_args(scale, zero_point, qmin, qmax))
    return out.reshape(arr.shape)


def fake_quantize_numpy(
    x: Any, scale: float, zero_point: float, qmin: int, qmax: int
) -> np.ndarray:
    """NumPy twin of :func:`fake_quantize`."""
    s, z, lo, hi = _fq_args(scale, zero_point, qmin, qmax)
    arr = np.asarray(x, dtype=np.float32)
    q = np.clip(np.rint(arr / s) + z, lo, hi)
    return np.asarray((q - z) * s, dtype=np.float32)


def _channel_view(x: np.ndarray, axis: int, scales: Any, zps: Any,
                  zero_dtype: Any = np.float32) -> tuple[Any, ...]:
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for a {x.ndim}-d array")
    axis %= x.ndim
    channels = x.shape[axis]
    s = np.ascontiguousarray(scales, dtype=np.float32).reshape(-1)
    z = np.ascontiguousarray(zps, dtype=zero_dtype).reshape(-1)
    if s.size != channels or z.size != channels:
        raise ValueError(f"{s.size} scales / {z.size} zero points for {channels} channels "
                         f"on axis {axis}; give one per channel")
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    view = np.ascontiguousarray(x, dtype=np.float32).reshape(outer, channels, -1)
    return _readonly(view), _readonly(s), _readonly(z)


@_interruptible
def fake_quantize_per_channel(
    x: Any, scales: Any, zps: Any, axis: int, qmin: int, qmax: int
) -> np.ndarray:
    """:func:`fake_quantize` with one (scale, zero point) per index along ``axis``."""
    arr = np.asarray(x)
    view, s, z = _channel_view(arr, axis, scales, zps)
    out = np.empty_like(view)
    _fq_channel_kernel(view, out, s, z, *_fq_args(1.0, 0.0, qmin, qmax)[2:])
    return np.asarray(out).reshape(arr.shape)


def fake_quantize_per_channel_numpy(
    x: Any, scales: Any, zps: Any, axis: int, qmin: int, qmax: int
) -> np.ndarray:
    """NumPy twin of :func:`fake_quantize_per_channel`."""
    arr = np.asarray(x)
    view, s, z = _channel_view(arr, axis, scales, zps)
    lo, hi = _fq_args(1.0, 0.0, qmin, qmax)[2:]
    s3, z3 = s.reshape(1, -1, 1), z.reshape(1, -1, 1)
    q = np.clip(np.rint(view / s3) + z3, lo, hi)
    return np.asarray((q - z3) * s3, dtype=np.float32).reshape(arr.shape)


@njit(cache=True, nogil=True, parallel=True)
def _codes_kernel(x, out, scales, zps, qmin, qmax):
    outer, channels, inner = x.shape
    if outer >= channels:  # e.g. a MatMul weight [K, N] along N: its rows in parallel
        for o in prange(outer):
            for c in range(channels):
                s = scales[c]
                z = zps[c]
                for i in range(inner):
                    q = np.float64(np.rint(x[o, c, i] / s)) + z
                    out[o, c, i] = min(max(q, qmin), qmax)
    else:
        for c in prange(channels):
            s = scales[c]
            z = zps[c]
            for o in range(outer):
                for i in range(inner):
                    q = np.float64(np.rint(x[o, c, i] / s)) + z
                    out[o, c, i] = min(max(q, qmin), qmax)


@_interruptible
def quantize_codes(x: Any, scales: Any, zps: Any, axis: int | None, qmin: int, qmax: int,
                   dtype: Any) -> np.ndarray:
    """Integer codes ``clip(rint(x / scale) + zp, qmin, qmax)`` of float32 ``x`` as ``dtype``
    (a range within int32's), one (scale, zero point) per index along ``axis`` (per tensor
    when None): the division and rounding in float32, the zero point added in float64, in
    one parallel pass."""
    arr = np.asarray(x, dtype=np.float32)
    view, s, z = _codes_view(arr, axis, scales, zps)
    out = np.empty(view.shape, np.int32)  # one compiled signature for every code type
    _codes_kernel(view, out, s, z, float(qmin), float(qmax))
    return out.reshape(arr.shape).astype(dtype, copy=False)


def quantize_codes_numpy(x: Any, scales: Any, zps: Any, axis: int | None, qmin: int, qmax: int,
                         dtype: Any) -> np.ndarray:
    """NumPy twin of :func:`quantize_codes`."""
    arr = np.asarray(x, dtype=np.float32)
    view, s, z = _codes_view(arr, axis, scales, zps)
    codes = np.rint(view / s.reshape(1, -1, 1)) + z.reshape(1, -1, 1)
    clipped: np.ndarray = np.clip(codes, qmin, qmax).astype(dtype).reshape(arr.shape)
    return clipped


def _codes_view(x: np.ndarray, axis: int | None, scales: Any, zps: Any) -> tuple[Any, ...]:
    """``x`` as [outer, channels, inner] (one channel per tensor when ``axis`` is None), the
    scales as float32 and the zero points as float64, one per channel."""
    if axis is None:
        return (_readonly(np.ascontiguousarray(x).reshape(1, 1, -1)),
                _readonly(np.asarray(scales, np.float32).reshape(1)),
                _readonly(np.asarray(zps, np.float64).reshape(1)))
    return _channel_view(x, axis, scales, zps, zero_dtype=np.float64)


# ------------------------------------------------------------------ error statistics
@njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc"})
def _error_kernel(ref, test, nchunks):
    n = ref.size
    per = (n + nchunks - 1) // nchunks
    acc = np.zeros((nchunks, 5))
    for c in prange(nchunks):
        a = min(n, c * per)
        b = min(n, a + per)
        dd = 0.0
        rr = 0.0
        tt = 0.0
        rt = 0.0
        mx = 0.0
        for i in range(a, b):
            r = np.float64(ref[i])
            t = np.float64(test[i])
            d = r - t
            dd += d * d
            rr += r * r
            tt += t * t
            rt += r * t
            ad = abs(d)
            mx = ad if ad > mx else mx
        acc[c, 0] = dd
        acc[c, 1] = rr
        acc[c, 2] = tt
        acc[c, 3] = rt
        acc[c, 4] = mx
    return acc


def _error_figures(n: int, dd: float, rr: float, tt: float, rt: float,
                   mx: float) -> tuple[float, float, float, float]:
    if n == 0:
        return 0.0, math.inf, 1.0, 0.0
    mse = dd / n
    sqnr = math.inf if dd == 0 else (-math.inf if rr == 0 else 10 * math.log10(rr / dd))
    if rr == 0 and tt == 0:
        cosine = 1.0
    elif rr == 0 or tt == 0:
        cosine = 0.0
    else:
        cosine = rt / math.sqrt(rr * tt)
    return float(mse), float(sqnr), float(cosine), float(mx)


def _pair(ref: Any, test: Any) -> tuple[np.ndarray, np.ndarray]:
    r, t = _flat(ref), _flat(test)
    if r.size != t.size:
        raise ValueError(f"reference has {r.size} values but the tested output {t.size}; "
                         "compare outputs of the same shape")
    return r, t


@_interruptible
def error_stats(ref: Any, test: Any) -> tuple[float, float, float, float]:
    """(MSE, SQNR in dB, cosine similarity, max abs error) of ``test`` against ``ref``."""
    r, t = _pair(ref, test)
    nchunks = _chunks(r.size)
    acc = _error_kernel(r, t, nchunks)
    dd, rr, tt, rt = (float(v) for v in acc[:, :4].sum(axis=0))
    return _error_figures(r.size, dd, rr, tt, rt, float(acc[:, 4].max()))


def error_stats_numpy(ref: Any, test: Any) -> tuple[float, float, float, float]:
    """NumPy twin of :func:`error_stats`."""
    r, t = _pair(ref, test)
    r64, t64 = r.astype(np.float64), t.astype(np.float64)
    d = r64 - t64
    mx = float(np.abs(d).max()) if d.size else 0.0
    return _error_figures(r.size, float(d @ d), float(r64 @ r64), float(t64 @ t64),
                          float(r64 @ t64), mx)
