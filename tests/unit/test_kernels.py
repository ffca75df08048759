"""Every Numba kernel against its NumPy twin (hypothesis), plus numeric ground truths."""

from __future__ import annotations

import math

import numba
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper

from mpsearch import kernels
from mpsearch.kernels import _gptq, _kquant, gptq_block, gptq_block_numpy
from mpsearch.kernels import _kernels as k  # the module: its private jitted functions too

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
finite32 = st.floats(-1e4, 1e4, width=32, allow_nan=False, allow_infinity=False)
arrays = hnp.arrays(np.float32, st.integers(0, 400), elements=finite32)


@st.composite
def histograms(draw: st.DrawFn, min_bins: int = 2, max_bins: int = 300) -> tuple:
    bins = draw(st.integers(min_bins, max_bins))
    counts = draw(hnp.arrays(np.int64, bins, elements=st.integers(0, 1000)))
    if counts.sum() == 0:
        counts[draw(st.integers(0, bins - 1))] = 1
    lo = draw(st.floats(-100, 0, allow_nan=False))
    hi = draw(st.floats(0.01, 100, allow_nan=False))
    return counts.astype(np.float64), lo, hi


def test_every_public_kernel_has_a_numpy_twin() -> None:
    twins = {n for n in kernels.__all__ if n.endswith("_numpy")}
    paired = {n for n in kernels.__all__ if f"{n}_numpy" in twins}
    assert {t.removesuffix("_numpy") for t in twins} == paired
    assert {"tensor_stats", "histogram_rebin", "histogram_merge", "entropy_threshold",
            "mse_threshold", "percentile_range", "fake_quantize", "fake_quantize_per_channel",
            "error_stats", "gptq_block", "central_moments", "quantize_codes"} <= paired


def test_every_jitted_kernel_is_cached_on_disk() -> None:
    jitted = [v for module in (k, _gptq, _kquant) for v in vars(module).values()
              if isinstance(v, numba.core.dispatcher.Dispatcher)]
    assert len(jitted) >= 11
    for fn in jitted:
        assert fn.targetoptions.get("cache") or type(fn._cache).__name__ != "NullCache", fn


def test_read_only_and_writable_inputs_share_one_compiled_kernel() -> None:
    """A model's weights are read-only, activations are not: both reach each kernel as one
    type, so a search never compiles a kernel a second time for the other."""
    x = np.random.default_rng(5).standard_normal(1 << 17).astype(np.float32)
    frozen = x.copy()
    frozen.flags.writeable = False
    scales, zeros = np.full(256, 0.01, np.float32), np.zeros(256, np.float32)
    calls = [
        (k._error_kernel, lambda a: k.error_stats(a, a)),
        (k._central_kernel, lambda a: k.central_moments(a, 0.0)),
        (k._tensor_stats_kernel, lambda a: k.tensor_stats(a, -4.0, 4.0, 64)),
        (k._fq_kernel, lambda a: k.fake_quantize(a, 0.01, 0.0, -128, 127)),
        (k._fq_channel_kernel, lambda a: k.fake_quantize_per_channel(
            a.reshape(256, -1), scales, zeros, 0, -128, 127)),
        (k._codes_kernel, lambda a: k.quantize_codes(a.reshape(256, -1), scales, zeros, 0,
                                                     -128, 127, np.int8)),
    ]
    for kernel, call in calls:
        call(x)
        compiled = set(kernel.signatures)
        call(frozen)
        assert set(kernel.signatures) == compiled, kernel


# ------------------------------------------------------------------ tensor_stats
@SETTINGS
@given(x=arrays, lo=st.floats(-2e4, 1e3), width=st.floats(1e-2, 3e4), bins=st.integers(1, 64))
def test_tensor_stats_matches_numpy(x: np.ndarray, lo: float, width: float, bins: int) -> None:
    got = k.tensor_stats(x, lo, lo + width, bins)
    want = k.tensor_stats_numpy(x, lo, lo + width, bins)
    assert got[0] == want[0] and got[1] == want[1]
    assert got[2] == pytest.approx(want[2], rel=1e-9, abs=1e-6)
    assert got[3] == pytest.approx(want[3], rel=1e-9, abs=1e-6)
    np.testing.assert_array_equal(got[4], want[4])
    assert got[4].sum() == x.size


def test_tensor_stats_parallel_chunks_and_threads() -> None:
    x = np.random.default_rng(1).standard_normal(700_001).astype(np.float32) * 3
    want = k.tensor_stats_numpy(x, -4.0, 4.0, 2048)
    for threads in (1, 2):
        k.set_threads(threads)
        got = k.tensor_stats(x.reshape(7, -1) if x.size % 7 == 0 else x, -4.0, 4.0, 2048)
        assert got[:2] == want[:2]
        assert got[2] == pytest.approx(want[2], rel=1e-9)
        np.testing.assert_array_equal(got[4], want[4])
    assert want[0] == x.min() and want[2] == pytest.approx(float(x.astype(np.float64).sum()))


@SETTINGS
@given(x=arrays, mean=st.floats(-1e4, 1e4))
def test_central_moments_match_numpy(x: np.ndarray, mean: float) -> None:
    got, want = k.central_moments(x, mean), k.central_moments_numpy(x, mean)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-6)


def test_central_moments_of_a_large_tensor_in_parallel_chunks() -> None:
    x = np.random.default_rng(2).gamma(2.0, size=700_001).astype(np.float32)
    d = x.astype(np.float64) - x.mean(dtype=np.float64)
    for threads in (1, 2):
        k.set_threads(threads)
        s2, s3, s4 = k.central_moments(x, float(x.mean(dtype=np.float64)))
        assert s2 == pytest.approx(float(d @ d), rel=1e-9)
        assert s3 == pytest.approx(float((d * d) @ d), rel=1e-9)
        assert s4 == pytest.approx(float((d * d) @ (d * d)), rel=1e-9)
    assert s3 / 700_001 / (s2 / 700_001) ** 1.5 == pytest.approx(math.sqrt(2), rel=0.02)


def test_tensor_stats_bins_agree_with_numpy_histogram_away_from_edges() -> None:
    lo, hi, bins = -3.0, 5.0, 16
    width = (hi - lo) / bins
    centers = lo + (np.arange(bins) + 0.5) * width
    x = np.repeat(centers, np.arange(1, bins + 1)).astype(np.float32)
    x = np.concatenate([x, np.float32([lo, hi])])  # ends: first and (closed) last bin
    np.testing.assert_array_equal(k.tensor_stats(x, lo, hi, bins)[4],
                                  np.histogram(x, bins, range=(lo, hi))[0])


def test_tensor_stats_saturates_outside_and_flags_nonfinite() -> None:
    x = np.float32([-10, 0.5, 10])
    assert list(k.tensor_stats(x, 0, 1, 4)[4]) == [1, 0, 1, 1]
    for bad in (np.nan, np.inf, -np.inf):
        s = k.tensor_stats(np.float32([1, bad, 2] * 50_000), 0, 1, 8)
        assert not math.isfinite(s[3])
        assert s[4].sum() == 150_000
    empty = k.tensor_stats(np.zeros(0, np.float32), 0, 1, 4)
    assert empty[0] == math.inf and empty[4].sum() == 0
    with pytest.raises(ValueError, match="invalid"):
        k.tensor_stats(x, 1.0, 1.0, 4)


# ------------------------------------------------------------------ rebin / merge / fold
@SETTINGS
@given(h=histograms(), new_lo=st.floats(-200, 0), new_w=st.floats(0.5, 400),
       new_bins=st.integers(1, 300))
def test_histogram_rebin_matches_numpy(h: tuple, new_lo: float, new_w: float,
                                       new_bins: int) -> None:
    counts, lo, hi = h
    got = k.histogram_rebin(counts, lo, hi, new_lo, new_lo + new_w, new_bins)
    want = k.histogram_rebin_numpy(counts, lo, hi, new_lo, new_lo + new_w, new_bins)
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-6 * counts.sum())
    assert got.sum() == pytest.approx(counts.sum(), rel=1e-12)


def test_histogram_rebin_keeps_counts_on_aligned_edges() -> None:
    counts = np.random.default_rng(2).integers(0, 1000, 2048).astype(np.float64)
    grown = k.histogram_rebin(counts, -1.7, 1.7, -6.8, 6.8, 2048)
    np.testing.assert_allclose(grown[768:1280], counts.reshape(-1, 4).sum(axis=1), rtol=1e-9)
    assert abs(grown[:768]).sum() < 1e-6 and abs(grown[1280:]).sum() < 1e-6
    signed = k.histogram_rebin(counts, 0.0, 1.5, -3.0, 3.0, 2048)
    np.testing.assert_array_equal(signed[1024:1536], counts.reshape(-1, 4).sum(axis=1))


@SETTINGS
@given(a=histograms(max_bins=100), b=histograms(max_bins=100))
def test_histogram_merge_matches_numpy(a: tuple, b: tuple) -> None:
    bins = len(a[0])
    got, lo, hi = k.histogram_merge(*a, *b)
    want, lo2, hi2 = k.histogram_merge_numpy(*a, *b)
    assert (lo, hi) == (lo2, hi2) == (min(a[1], b[1]), max(a[2], b[2]))
    assert got.size == bins
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-6 * (a[0].sum() + b[0].sum()))
    assert got.sum() == pytest.approx(a[0].sum() + b[0].sum())


def test_abs_histogram_folds_exactly() -> None:
    counts = np.arange(8.0)
    folded, amax = k.abs_histogram(counts, -2.0, 2.0)
    assert amax == 2.0
    np.testing.assert_allclose(folded, counts[4:] + counts[:4][::-1])
    same, amax = k.abs_histogram(counts, 0.0, 3.0)
    assert amax == 3.0 and (same == counts).all()


# ------------------------------------------------------------------ percentile
@SETTINGS
@given(h=histograms(), p=st.floats(50, 100), symmetric=st.booleans())
def test_percentile_range_matches_numpy(h: tuple, p: float, symmetric: bool) -> None:
    got = k.percentile_range(*h, p, symmetric=symmetric)
    want = k.percentile_range_numpy(*h, p, symmetric=symmetric)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    assert got[0] <= got[1]


def test_percentile_range_is_within_one_bin_of_numpy_percentile() -> None:
    x = np.random.default_rng(3).standard_normal(200_000).astype(np.float32)
    lo, hi, bins = float(x.min()), float(x.max()), 2048
    width = (hi - lo) / bins
    hist = k.tensor_stats(x, lo, hi, bins)[4]
    got = k.percentile_range(hist, lo, hi, 99.0)
    np.testing.assert_allclose(got, np.percentile(x, [0.5, 99.5]), atol=width)
    sym = k.percentile_range(hist, lo, hi, 99.0, symmetric=True)
    assert sym[1] == pytest.approx(np.percentile(np.abs(x), 99.0), abs=2 * width)


# ------------------------------------------------------------------ entropy
@SETTINGS
@given(h=histograms(min_bins=20, max_bins=160), nq=st.sampled_from([4, 8, 16]))
def test_entropy_divergences_match_numpy(h: tuple, nq: int) -> None:
    counts = h[0]
    got = k.entropy_divergences(counts, nq, nq)
    want = k.entropy_divergences_numpy(counts, nq, nq)
    assert (np.isinf(got) == np.isinf(want)).all()
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-9, atol=1e-12)


@SETTINGS
@given(h=histograms(min_bins=260, max_bins=600))
def test_entropy_threshold_matches_numpy(h: tuple) -> None:
    got = k.entropy_threshold(*h, 8)
    want = k.entropy_threshold_numpy(*h, 8)
    assert got == pytest.approx(want, rel=1e-12)
    assert 0 < got <= max(abs(h[1]), abs(h[2])) * (1 + 1e-12)


def test_entropy_clips_gaussian_outliers_and_keeps_16_bit_range() -> None:
    x = np.random.default_rng(4).standard_normal(400_000).astype(np.float32)
    x[:20] = 40.0
    hist = k.tensor_stats(x, -40.0, 40.0, 2048)[4]
    t8 = k.entropy_threshold(hist, -40.0, 40.0, 8)
    assert 2.5 < t8 < 12.0  # the outliers at 40 sigma are clipped
    assert k.entropy_threshold(hist, -40.0, 40.0, 16) == 40.0


# ------------------------------------------------------------------ MSE
@SETTINGS
@given(h=histograms(), a=st.floats(-150, 0), b=st.floats(0, 150), bits=st.sampled_from([4, 8, 16]))
def test_range_mse_matches_numpy(h: tuple, a: float, b: float, bits: int) -> None:
    got = k.range_mse(*h, a, b, bits)
    want = k.range_mse_numpy(*h, a, b, bits)
    assert got == pytest.approx(want, rel=1e-7, abs=1e-12 * (h[2] - h[1]) ** 2)


def test_range_mse_of_a_range_whose_step_underflows_is_zero_in_both() -> None:
    """[-5e-324, 0]: the step (range / levels) rounds to 0; hypothesis found the NumPy twin
    dividing by it while the kernel returned 0."""
    hist = (np.ones(4), -1.0, 1.0)
    assert k.range_mse(*hist, -5e-324, 0.0, 8) == k.range_mse_numpy(*hist, -5e-324, 0.0, 8) == 0.0


@pytest.mark.parametrize(("a", "b", "bits"), [(-2.0, 3.0, 4), (0.0, 1.5, 8), (-1.2, 1.2, 8)])
def test_range_mse_is_the_expected_fake_quantization_error(a: float, b: float, bits: int) -> None:
    rng = np.random.default_rng(5)
    lo, hi, bins = -3.0, 4.0, 64
    counts = rng.integers(0, 50, bins).astype(np.float64)
    width = (hi - lo) / bins
    x = np.concatenate([lo + (j + rng.random(int(c) * 200)) * width
                        for j, c in enumerate(counts)])
    levels = 2**bits - 1
    scale = (max(b, 0) - min(a, 0)) / levels
    zp = np.clip(np.floor(-min(a, 0) / scale + 0.5), 0, levels)
    q = np.clip(np.rint(x / scale) + zp, 0, levels)
    empirical = np.mean((x - (q - zp) * scale) ** 2)
    assert k.range_mse(counts, lo, hi, a, b, bits) == pytest.approx(empirical, rel=0.03)


@settings(max_examples=15, deadline=None)
@given(h=histograms(max_bins=120), symmetric=st.booleans(), bits=st.sampled_from([4, 8]))
def test_mse_threshold_matches_numpy(h: tuple, symmetric: bool, bits: int) -> None:
    got = k.mse_threshold(*h, bits, symmetric=symmetric)
    want = k.mse_threshold_numpy(*h, bits, symmetric=symmetric)
    assert got == pytest.approx(want, rel=1e-12)
    amax = max(-h[1], h[2])
    full = (-amax, amax) if symmetric else (h[1], h[2])
    assert k.range_mse(*h, *got, bits) <= k.range_mse(*h, *full, bits)
    assert got[0] <= 0 <= got[1] and (not symmetric or got[0] == -got[1])


def test_mse_threshold_on_a_gaussian_is_about_four_sigma_at_8_bits() -> None:
    x = np.random.default_rng(6).standard_normal(1_000_000).astype(np.float32)
    lo, hi = float(x.min()), float(x.max())
    hist = k.tensor_stats(x, lo, hi, 2048)[4]
    a, b = k.mse_threshold(hist, lo, hi, 8, symmetric=True)
    assert a == -b and 3.4 < b < 4.4  # analytic optimum for a unit Gaussian: ~3.9 sigma
    a16, b16 = k.mse_threshold(hist, lo, hi, 16, symmetric=True)
    assert b16 > 4.5  # 16 bits: almost no clipping pays off


# ------------------------------------------------------------------ fake quantization
@SETTINGS
@given(x=arrays, scale=st.floats(1e-4, 10), zp=st.integers(0, 255), signed=st.booleans())
def test_fake_quantize_matches_numpy(x: np.ndarray, scale: float, zp: int, signed: bool) -> None:
    qmin, qmax, zp = (-128, 127, zp - 128) if signed else (0, 255, zp)
    np.testing.assert_array_equal(k.fake_quantize(x, scale, zp, qmin, qmax),
                                  k.fake_quantize_numpy(x, scale, zp, qmin, qmax))


@SETTINGS
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=6),
                    elements=finite32), data=st.data())
def test_fake_quantize_per_channel_matches_numpy(x: np.ndarray, data: st.DataObject) -> None:
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    c = x.shape[axis]
    scales = data.draw(hnp.arrays(np.float32, c, elements=st.floats(2**-10, 10, width=32)))
    zps = data.draw(hnp.arrays(np.float32, c, elements=st.integers(-10, 10)))
    np.testing.assert_array_equal(
        k.fake_quantize_per_channel(x, scales, zps, axis, -128, 127),
        k.fake_quantize_per_channel_numpy(x, scales, zps, axis, -128, 127))


@SETTINGS
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=9),
                    elements=finite32), data=st.data())
def test_quantize_codes_match_numpy_and_the_builder(x: np.ndarray, data: st.DataObject) -> None:
    """Per channel along any axis or per tensor, every code type: the kernel's codes equal
    its twin's, and the twin equals the builder's NumPy rounding."""
    axis = data.draw(st.none() | st.integers(0, x.ndim - 1))
    c = 1 if axis is None else x.shape[axis]
    dtype, (qmin, qmax) = data.draw(st.sampled_from([
        (np.int8, (-128, 127)), (np.uint8, (0, 255)), (np.int16, (-32768, 32767)),
        (np.uint16, (0, 65535)), (np.int32, (-(2**31), 2**31 - 1))]))
    scales = data.draw(hnp.arrays(np.float32, c, elements=st.floats(2**-10, 10, width=32)))
    zps = data.draw(hnp.arrays(np.int64, c, elements=st.integers(qmin, qmax)))
    if axis is None:
        scales, zps = scales.reshape(()), zps.reshape(())
    got = k.quantize_codes(x, scales, zps, axis, qmin, qmax, dtype)
    want = k.quantize_codes_numpy(x, scales, zps, axis, qmin, qmax, dtype)
    assert got.dtype == want.dtype == dtype
    np.testing.assert_array_equal(got, want)
    shape = [1] * x.ndim
    if axis is not None:
        shape[axis] = -1
    builder = np.clip(np.round(x / scales.reshape(shape)) + zps.reshape(shape).astype(np.float64),
                      qmin, qmax).astype(dtype)
    np.testing.assert_array_equal(want, builder)


def _qdq_model(axis: int | None, channels: int) -> bytes:
    shape = [channels] if axis is not None else []
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **(
                 {"axis": axis} if axis is not None else {})),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **(
                 {"axis": axis} if axis is not None else {}))]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                       helper.make_tensor_value_info("s", TensorProto.FLOAT, shape),
                       helper.make_tensor_value_info("z", TensorProto.UINT8, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=8).SerializeToString()


def test_fake_quantize_equals_onnxruntime_qdq() -> None:
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 3, 5, 5)) * 3).astype(np.float32)
    x.flat[:6] = [0.5, 1.5, 2.5, -0.5, 1e9, -1e9]  # ties round to even; saturation
    sess = ort.InferenceSession(_qdq_model(None, 0), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": x, "s": np.array(1.0, np.float32),
                             "z": np.array(128, np.uint8)})
    np.testing.assert_array_equal(k.fake_quantize(x, 1.0, 128, 0, 255), y)
    scales = np.float32([0.02, 0.05, 0.1])
    zps = np.uint8([100, 128, 3])
    sess = ort.InferenceSession(_qdq_model(1, 3), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": x, "s": scales, "z": zps})
    np.testing.assert_array_equal(k.fake_quantize_per_channel(x, scales, zps, 1, 0, 255), y)


# ------------------------------------------------------------------ error statistics
@SETTINGS
@given(x=arrays, noise=st.floats(0, 10), seed=st.integers(0, 100))
def test_error_stats_matches_numpy(x: np.ndarray, noise: float, seed: int) -> None:
    y = x + (np.random.default_rng(seed).standard_normal(x.size) * noise).astype(np.float32)
    got, want = k.error_stats(x, y), k.error_stats_numpy(x, y)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_error_stats_known_values() -> None:
    ref = np.float32([1, 2, 3, 4])
    assert k.error_stats(ref, ref) == (0.0, math.inf, 1.0, 0.0)
    mse, sqnr, cosine, max_abs = k.error_stats(ref, ref * 0.5)
    assert mse == pytest.approx(np.mean((ref * 0.5) ** 2))
    assert sqnr == pytest.approx(10 * math.log10(30 / (30 / 4)))
    assert cosine == pytest.approx(1.0) and max_abs == 2.0
    assert k.error_stats(np.zeros(3), np.ones(3))[2] == 0.0
    big = np.random.default_rng(8).standard_normal((300, 1000)).astype(np.float32)
    np.testing.assert_allclose(k.error_stats(big, big + 0.1),
                               k.error_stats_numpy(big, big + 0.1), rtol=1e-9)
    with pytest.raises(ValueError, match="same shape"):
        k.error_stats(ref, ref[:2])


# ------------------------------------------------------------------ gptq_block
@SETTINGS
@given(groups=st.integers(1, 3), rows=st.integers(1, 9), width=st.integers(1, 12),
       before=st.integers(0, 5), seed=st.integers(0, 2**16), narrow=st.booleans())
def test_gptq_block_matches_numpy(groups: int, rows: int, width: int, before: int, seed: int,
                                  narrow: bool) -> None:
    """Same codes, block updates and errors, bit for bit: the kernel does the twin's float64
    operations in the twin's order. Narrow code ranges make the clip bite."""
    rng = np.random.default_rng(seed)
    inner = before + width + 3  # columns before and after the block, as inside gptq_codes
    factor = np.triu(rng.normal(size=(groups, inner, inner)))
    factor[:, np.arange(inner), np.arange(inner)] = rng.uniform(0.5, 2.0, (groups, inner))
    block = rng.normal(size=(groups, rows, width)) * 3
    scale = rng.uniform(0.01, 0.2, (groups, rows))
    zero = rng.integers(-3, 4, (groups, rows)).astype(np.float64)
    qmin, qmax = (-4, 3) if narrow else (-128, 127)
    outputs = []
    for kernel in (gptq_block, gptq_block_numpy):
        b, codes = block.copy(), np.full((groups, rows, inner), np.nan)
        errors = np.empty_like(b)
        kernel(b, factor, before, scale, zero, qmin, qmax, codes, errors)
        outputs.append((b, codes, errors))
    for got, want in zip(*outputs, strict=True):
        np.testing.assert_array_equal(got, want)
    codes = outputs[0][1][:, :, before:before + width]
    assert codes.min() >= qmin and codes.max() <= qmax
    assert np.isnan(outputs[0][1][:, :, :before]).all()  # only the block's columns written
