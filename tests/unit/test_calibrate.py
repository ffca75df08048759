"""Streaming calibration: ORT parity, every method on every fixture, cache, bad data, CLI."""

from __future__ import annotations

import dataclasses
import math
import os
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from _paths import FIXTURES
from onnx import TensorProto, helper, numpy_helper

from mpsearch import calibration as cal
from mpsearch import kernels
from mpsearch.calibration import METHODS, calibrate, calibrate_cached, load_table, weight_stats
from mpsearch.data import Dataset
from mpsearch.errors import CalibrationError, DataError
from mpsearch.graph import ModelGraph, load_model

MODELS = sorted(FIXTURES.glob("*.onnx"))
DIGITS = FIXTURES / "digits_eval.npz"


def _tiny() -> ModelGraph:
    """input (batch, 2, 6, 6) -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "fc")]
    nodes = [helper.make_node("Conv", ["input", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["relu"]),
             helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
             helper.make_node("Flatten", ["pool"], ["flat"]),
             helper.make_node("Gemm", ["flat", "fc"], ["logits"], transB=1)]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                      ["batch", 2, 6, 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])], inits)
    return load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def _data(n: int, seed: int = 0, scale: float = 1.0) -> Dataset:
    x = np.random.default_rng(seed).standard_normal((n, 2, 6, 6)).astype(np.float32) * scale
    return Dataset(inputs={"input": x}, source=f"random{n}")


@pytest.fixture(scope="module")
def digits(digits: Dataset) -> Dataset:
    """The first 48 of the shared digits (conftest.py)."""
    return digits.take(48)


# ------------------------------------------------------------------ parity with ORT
def _ort_minmax(graph: ModelGraph, data: Dataset, tmp: Path, batch: int) -> dict:
    from onnxruntime.quantization.calibrate import (
        CalibrationDataReader,
        CalibrationMethod,
        create_calibrator,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = data.batches(batch)

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    path = tmp / "model.onnx"
    onnx.save(graph.model, path)
    calibrator = create_calibrator(path, augmented_model_path=str(tmp / "aug.onnx"),
                                   calibrate_method=CalibrationMethod.MinMax)
    calibrator.collect_data(Reader())
    return {name: tuple(float(np.asarray(v).reshape(-1)[0]) for v in d.range_value)
            for name, d in calibrator.compute_data().data.items()}


@pytest.mark.parametrize("name", ["resnet", "mobilenetv2"])
def test_minmax_ranges_equal_onnxruntime_minmax_calibrator(name: str, digits: Dataset,
                                                           tmp_path: Path) -> None:
    graph = load_model(FIXTURES / f"{name}.onnx")
    exact = calibrate(graph, digits, batch_size=16, optimize=False)  # ORT runs it unoptimized
    optimized = calibrate(graph, digits, batch_size=16)
    ort_ranges = _ort_minmax(graph, digits, tmp_path, 16)
    assert set(exact.tensors) <= set(ort_ranges)
    for tensor in exact.tensors:
        assert exact.range(tensor, method="minmax") == ort_ranges[tensor], tensor
        np.testing.assert_allclose(optimized.range(tensor, method="minmax"),
                                   ort_ranges[tensor], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ every method everywhere
@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS, ids=[m.stem for m in MODELS])
def test_every_method_runs_on_every_fixture(model: Path, digits: Dataset) -> None:
    graph = load_model(model)
    table = calibrate(graph, digits.take(24), batch_size=8, bins=512)
    assert set(table.tensors) == set(graph.activation_tensors())
    for tensor, stats in table.tensors.items():
        assert stats.count > 0 and stats.min <= stats.mean <= stats.max
        for method in METHODS:
            for bits in (8, 16):
                lo, hi = table.range(tensor, method=method, bits=bits)
                assert math.isfinite(lo) and math.isfinite(hi) and lo <= hi
                assert min(stats.min, 0) - 1e-6 <= lo and hi <= max(stats.max, 0) + 1e-6
                a, b = table.range(tensor, method=method, bits=bits, symmetric=True)
                assert a == -b and b <= max(abs(stats.min), abs(stats.max)) + 1e-6


def test_ranges_tighten_from_minmax_and_16_bits_clip_less() -> None:
    x = np.random.default_rng(1).standard_normal((400, 2, 6, 6)).astype(np.float32)
    x[0, 0, 0, 0] = 30.0  # one outlier
    table = calibrate(_tiny(), Dataset(inputs={"input": x}), batch_size=64, percentile=99.9)
    mm = table.range("input", method="minmax")
    assert mm[1] == 30.0
    for method in ("percentile", "entropy"):
        lo, hi = table.range("input", method=method)
        assert hi < 15.0, method  # the outlier is clipped
        assert table.range("input", method=method, bits=16)[1] >= hi
    # one outlier in 28800 costs less than the coarser grid clipping saves: MSE keeps it
    mse = table.range("input", method="mse")
    assert kernels.range_mse(table.tensors["input"].hist, table.tensors["input"].lo,
                             table.tensors["input"].hi, *mse, 8) <= kernels.range_mse(
        table.tensors["input"].hist, table.tensors["input"].lo, table.tensors["input"].hi,
        *mm, 8)
    p = table.range("input", method="percentile", percentile=99.0)
    np.testing.assert_allclose(p, np.percentile(x, [0.5, 99.5]), atol=0.05)


# ------------------------------------------------------------------ streaming
def test_batch_size_does_not_change_statistics() -> None:
    graph, data = _tiny(), _data(200)
    one = calibrate(graph, data, batch_size=200)
    many = calibrate(graph, data, batch_size=7)
    for tensor, a in one.tensors.items():
        b = many.tensors[tensor]
        assert (a.min, a.max, a.count) == (b.min, b.max, b.count)
        assert a.mean == pytest.approx(b.mean, rel=1e-9, abs=1e-9)
        assert a.std == pytest.approx(b.std, rel=1e-9)
        assert a.hist.sum() == b.hist.sum() == a.count
        assert (a.hist_lo, a.hist_hi) == (b.hist_lo, b.hist_hi)  # powers of two
        assert np.log2(a.hist_hi) % 1 == 0
        assert np.abs(a.hist - b.hist).sum() <= 1e-4 * a.count  # float32 edge rounding only
        width = (a.hist_hi - a.hist_lo) / a.hist.size
        for method in ("percentile", "mse"):
            np.testing.assert_allclose(one.range(tensor, method=method, percentile=99.9),
                                       many.range(tensor, method=method, percentile=99.9),
                                       atol=width, err_msg=f"{tensor} {method}")


def test_growing_histogram_merges_exactly() -> None:
    rng = np.random.default_rng(2)
    collector = cal._Collector(64)
    parts = [np.zeros(50, np.float32), rng.random(100).astype(np.float32),
             (rng.random(100) * 10).astype(np.float32), -rng.random(100).astype(np.float32) * 37]
    for part in parts:
        assert collector.add(part)
    stats = collector.stats("t")
    everything = np.concatenate(parts)
    direct = kernels.tensor_stats(everything, stats.hist_lo, stats.hist_hi, 64)[4]
    assert stats.hist_lo == -stats.hist_hi == -64.0  # the power of two above 37
    assert stats.hist.sum() == everything.size and stats.count == everything.size
    assert np.abs(stats.hist - direct).sum() <= 2
    assert stats.hist[32] >= 50  # the early zeros sit in the bin of 0
    assert not collector.add(np.float32([1, np.nan]))


def test_memory_does_not_grow_with_the_number_of_samples() -> None:
    graph = _tiny()
    peaks = []
    for n in (64, 1024):
        data = _data(n)
        calibrate(graph, data.take(8), batch_size=16)  # warm up
        tracemalloc.start()
        calibrate(graph, data, batch_size=16)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < peaks[0] * 1.3 + 200_000, peaks


# ------------------------------------------------------------------ bad data
def test_nan_in_the_data_names_input_and_batch() -> None:
    data = _data(40)
    data.inputs["input"][33, 1, 2, 2] = np.nan
    with pytest.raises(DataError, match=r"input 'input' holds NaN in batch 2 \(sample 33\)"):
        calibrate(_tiny(), data, batch_size=16)


def test_nan_inside_the_model_names_tensor_and_batch() -> None:
    nodes = [helper.make_node("Sub", ["input", "input"], ["zero"]),
             helper.make_node("Div", ["input", "zero"], ["ratio"]),
             helper.make_node("Relu", ["ratio"], ["out"])]
    graph = load_model(helper.make_model(helper.make_graph(
        nodes, "bad", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 3])]),
        opset_imports=[helper.make_opsetid("", 13)]))
    data = Dataset(inputs={"input": np.ones((4, 3), np.float32)})
    with pytest.raises(CalibrationError, match=r"tensor 'ratio' holds NaN or Inf in batch 0 "
                                               r"\(samples 0-1\)"):
        calibrate(graph, data, batch_size=2)


def test_wrong_data_and_options_are_one_line_errors() -> None:
    graph = _tiny()
    with pytest.raises(DataError, match=r"expects \(batch, 2, 6, 6\)"):
        calibrate(graph, Dataset(inputs={"input": np.zeros((3, 2, 5, 5), np.float32)}))
    with pytest.raises(CalibrationError, match="method 'kl' is unknown"):
        calibrate(graph, _data(4), method="kl")
    with pytest.raises(CalibrationError, match="bins 7 must be an even"):
        calibrate(graph, _data(4), bins=7)
    table = calibrate(graph, _data(8))
    with pytest.raises(CalibrationError, match="no statistics for tensor 'nope'"):
        table.range("nope")
    with pytest.raises(CalibrationError, match="use one of minmax, percentile, entropy, mse"):
        table.range("conv", method="max")


# ------------------------------------------------------------------ table files and cache
def test_save_load_round_trip_and_integrity(tmp_path: Path) -> None:
    table = calibrate(_tiny(), _data(32), method="entropy", percentile=99.9)
    table.save(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["calibration.json", "calibration.npz"]
    loaded = load_table(tmp_path)
    assert loaded.method == "entropy" and loaded.percentile == 99.9 and loaded.samples == 32
    for tensor, stats in table.tensors.items():
        np.testing.assert_array_equal(loaded.tensors[tensor].hist, stats.hist)
        for method in METHODS:
            assert loaded.range(tensor, method=method) == table.range(tensor, method=method)
    np.savez(tmp_path / "calibration.npz", hists=np.zeros((3, 4), np.int64))
    with pytest.raises(CalibrationError, match="half-written; delete it and recalibrate"):
        load_table(tmp_path)
    with pytest.raises(CalibrationError, match="no calibration table"):
        load_table(tmp_path / "absent")


def test_calibrate_cached_reuses_matching_tables(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    graph, data = _tiny(), _data(16)
    first = calibrate_cached(graph, data, tmp_path, method="minmax")
    calls = []
    real = cal.calibrate
    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = calibrate_cached(graph, data, tmp_path, method="mse")
    assert not calls and again.method == "mse"
    assert again.range("relu") == first.range("relu", method="mse")
    calibrate_cached(graph, _data(16, seed=1), tmp_path)
    assert calls == [1] and load_table(tmp_path).data_fingerprint == _data(16, 1).fingerprint


def test_weight_stats_per_channel() -> None:
    graph = _tiny()
    stats = weight_stats(graph)
    w = graph.initializers["w"]
    assert stats["w"].axis == 0 and stats["w"].shape == (4, 2, 3, 3)
    np.testing.assert_array_equal(stats["w"].channel_max, w.reshape(4, -1).max(axis=1))
    assert stats["w"].min == w.min()
    assert stats["fc"].axis == 0  # Gemm with transB: output channels are rows
    np.testing.assert_array_equal(stats["fc"].channel_min, graph.initializers["fc"].min(axis=1))


# ------------------------------------------------------------------ CLI
def test_cli_calibrate_prints_ranges_and_reuses_the_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mpsearch.cli import main

    out = tmp_path / "cal"
    args = ["calibrate", str(FIXTURES / "resnet.onnx"), "--data", str(DIGITS), "--method",
            "percentile", "--out", str(out), "--samples", "32", "--batch-size", "16"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "percentile range" in printed and "input" in printed and "32 samples" in printed
    assert load_table(out).method == "percentile"
    assert main([*args[:5], "entropy", *args[6:]]) == 0
    assert "entropy range" in capsys.readouterr().out
    bad = tmp_path / "bad.npz"
    np.savez(bad, input=np.zeros((4, 3, 8, 8), np.float32))
    assert main(["calibrate", str(FIXTURES / "resnet.onnx"), "--data", str(bad), "--out",
                 str(out)]) == 2
    assert "expects (batch, 1, 16, 16)" in capsys.readouterr().err


def test_automatic_batch_fits_the_activation_budget(digits: Dataset) -> None:
    """batch_size None: one sample is weighed, the rest runs in batches that fit the budget;
    the table equals a fixed-batch one (statistics do not depend on batching)."""
    from mpsearch.calibration import MAX_AUTO_BATCH, auto_batch

    assert auto_batch(10 << 20, 192 << 20) == 19
    assert auto_batch(1, 192 << 20) == MAX_AUTO_BATCH and auto_batch(1 << 40) == 1
    graph = load_model(FIXTURES / "resnet.onnx")
    fixed = calibrate(graph, digits, batch_size=48)
    automatic = calibrate(graph, digits, activation_budget=2 << 20)  # a few samples a batch
    assert automatic.samples == fixed.samples == len(digits)
    for name, stats in fixed.tensors.items():
        other = automatic.tensors[name]
        assert (other.count, other.min, other.max) == (stats.count, stats.min, stats.max)
        np.testing.assert_allclose(other.mean, stats.mean, rtol=1e-5, atol=1e-6)


def _masked_attention(also_read_by_relu: bool = False) -> ModelGraph:
    """scores [N, 8] + mask [N, 8] (0 or -10000) -> Softmax(axis -1): BERT's additive mask."""
    nodes = [helper.make_node("Add", ["scores", "mask"], ["masked"], name="add"),
             helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1)]
    outputs = [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["n", 8])]
    if also_read_by_relu:
        nodes.append(helper.make_node("Relu", ["masked"], ["relu"], name="relu"))
        outputs.append(helper.make_tensor_value_info("relu", TensorProto.FLOAT, ["n", 8]))
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 8])
              for n in ("scores", "mask")]
    graph = helper.make_graph(nodes, "attention", inputs, outputs)
    return load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _masked_data(n: int = 64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    scores = rng.normal(0.0, 3.0, (n, 8)).astype(np.float32)
    keep = np.arange(8)[None, :] < rng.integers(2, 9, (n, 1))  # 2-8 real tokens, then padding
    return {"scores": scores, "mask": np.where(keep, 0.0, -10000.0).astype(np.float32)}


def test_softmax_inputs_are_clipped_where_softmax_ignores_them() -> None:
    """A tensor read only by Softmax keeps the smallest row maximum it showed; its range ends
    SOFTMAX_SPAN below that (values further down weigh < 2e-9 in every row), so a -10000 mask
    does not set the scale the real scores are quantized with."""
    from mpsearch import build_qdq, load_profile, uniform_assignment
    from mpsearch.runtime import create_session

    graph, feeds = _masked_attention(), _masked_data()
    assert cal.softmax_axes(graph) == {"masked": -1}
    table = calibrate(graph, Dataset(inputs=feeds))
    masked = feeds["scores"] + feeds["mask"]
    row_max = float(masked.max(axis=-1).min())
    stats = table.tensors["masked"]
    assert stats.softmax_row_max == pytest.approx(row_max, abs=1e-6)
    assert stats.min < -9000  # the mask is still seen ...
    lo, hi = table.range("masked")  # ... but clipped
    assert (lo, hi) == pytest.approx((row_max - cal.SOFTMAX_SPAN, float(masked.max())), abs=1e-5)
    assert table.range("masked", symmetric=True) == pytest.approx((lo, -lo), abs=1e-5)
    assert table.tensors["scores"].softmax_row_max is None  # read by Add

    profile = load_profile("x86_ort_auto")
    reference = create_session(graph.model).run(feeds)["probs"]
    unclipped = dataclasses.replace(table, tensors={
        **table.tensors, "masked": dataclasses.replace(stats, softmax_row_max=None)})
    errors = {}
    for name, t in (("clipped", table), ("unclipped", unclipped)):
        model = build_qdq(graph, t, profile, uniform_assignment(graph, profile, "int8"))
        errors[name] = float(np.abs(create_session(model).run(feeds)["probs"] - reference).max())
    step = (hi - lo) / 255  # one uint8 step of the clipped range
    assert errors["clipped"] <= step  # |d softmax| <= max |d input| for rounding errors
    assert errors["unclipped"] > 0.3  # a step of ~39: the real scores collapse together


def test_a_softmax_input_read_by_other_ops_keeps_its_range(tmp_path: Path) -> None:
    graph, feeds = _masked_attention(also_read_by_relu=True), _masked_data()
    assert cal.softmax_axes(graph) == {}
    table = calibrate(graph, Dataset(inputs=feeds))
    assert table.tensors["masked"].softmax_row_max is None
    assert table.range("masked")[0] == pytest.approx(table.tensors["masked"].min)
    plain = calibrate(_masked_attention(), Dataset(inputs=feeds))
    plain.save(tmp_path)  # the row maximum survives the table's JSON
    assert load_table(tmp_path).tensors["masked"].softmax_row_max == pytest.approx(
        plain.tensors["masked"].softmax_row_max)
