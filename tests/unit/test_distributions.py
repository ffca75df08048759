"""Distributions: weight and activation histograms (FP32 vs quantized), statistics and flags on a
depthwise convolution whose channels have very different ranges (the MobileNet case)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mpsearch.analysis import (
    STAT_COLUMNS,
    FlagRules,
    NodeDistribution,
    analyze_distributions,
    tensor_flags,
)
from mpsearch.data import Dataset
from mpsearch.pipeline import Prepared, prepare_inputs

WIDE_CHANNEL = 3
FACTOR = 200.0


def depthwise_model() -> onnx.ModelProto:
    """x -> depthwise Conv ``dw`` (channel 3 weights x200) -> Relu -> GAP -> Flatten -> Gemm."""
    rng = np.random.default_rng(0)
    dw = rng.normal(0, 0.3, (8, 1, 3, 3)).astype(np.float32)
    dw[WIDE_CHANNEL] *= FACTOR
    fc = rng.normal(0, 0.3, (4, 8)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "dw_w"], ["c"], name="dw", group=8, pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc_w"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(
        nodes, "depthwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                           ["N", 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(dw, "dw_w"), numpy_helper.from_array(fc, "fc_w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _prepare(method: str = "minmax") -> Prepared:
    x = np.random.default_rng(1).normal(size=(64, 8, 6, 6)).astype(np.float32)
    return prepare_inputs(depthwise_model(), "x86_ort", Dataset(inputs={"x": x}, source="dw"),
                   calibration_samples=48, method=method)


@pytest.fixture(scope="module")
def prepared() -> Prepared:
    return _prepare()


@pytest.fixture(scope="module")
def dists(prepared: Prepared) -> dict[str, NodeDistribution]:
    return {d.node: d for d in analyze_distributions(
        prepared.graph, prepared.profile, prepared.table, method=prepared.method,
        formats=["int8", "int16"])}


def test_every_quantizable_node_in_topological_order(dists: dict[str, NodeDistribution]
                                                     ) -> None:
    assert list(dists) == ["dw", "relu", "gap", "fc"]  # Flatten only moves data
    assert [d.index for d in dists.values()] == [0, 1, 2, 4]


def test_weight_histograms_and_channel_ranges(prepared: Prepared,
                                              dists: dict[str, NodeDistribution]) -> None:
    weight = dists["dw"].weight
    assert weight is not None and weight.tensor == "dw_w" and weight.format == "int8"
    array = prepared.graph.initializers["dw_w"]
    assert len(weight.edges) == len(weight.fp32) + 1
    assert sum(weight.fp32) == array.size
    assert set(weight.formats) == {"int8", "int16"}
    for entry in weight.formats.values():
        assert sum(entry["quantized"]) == array.size
        assert entry["granularity"] == "per_channel" and entry["sqnr"] > 30
    assert weight.channels is not None and weight.channels["axis"] == 0
    spans = np.array(weight.channels["max"]) - np.array(weight.channels["min"])
    assert len(spans) == 8 and int(np.argmax(spans)) == WIDE_CHANNEL
    assert weight.stats["channel_range_ratio"] > FACTOR / 3
    assert "channel_ranges" in dists["dw"].codes
    flat = array.astype(np.float64).ravel()
    d = flat - flat.mean()
    kurtosis = np.mean(d**4) / np.mean(d**2) ** 2 - 3
    assert weight.stats["mean"] == pytest.approx(flat.mean())
    assert weight.stats["kurtosis"] == pytest.approx(kurtosis, rel=1e-6)


def test_activation_histograms_from_the_table(prepared: Prepared,
                                              dists: dict[str, NodeDistribution]) -> None:
    act = dists["dw"].activation
    assert act is not None and act.tensor == "c" and act.role == "output"
    stats = prepared.table.tensors["c"]
    assert sum(act.fp32) == pytest.approx(stats.count, rel=1e-6)
    assert sum(act.quantized or ()) == pytest.approx(stats.count, rel=1e-6)
    assert act.stats["min"] == stats.min and act.stats["max"] == stats.max
    assert act.stats["mean"] == pytest.approx(stats.mean, abs=0.05 * stats.std)
    assert act.stats["clipped"] == 0.0  # minmax ranges clip nothing
    lo, hi = act.clip or (0.0, 0.0)
    step = (hi - lo) / 255  # uint8 grid; the zero point's rounding moves it by < 1/2 step
    assert lo <= stats.min + step / 2 and hi >= stats.max - step / 2
    assert [t.tensor for t in dists["dw"].inputs] == ["x"]
    assert {"heavy_tails", "outliers"} & set(dists["dw"].codes)  # one channel is 200x wider


def test_symmetric_vs_asymmetric_error(dists: dict[str, NodeDistribution]) -> None:
    relu = dists["relu"].activation
    assert relu is not None
    assert relu.stats["sqnr_asymmetric"] > relu.stats["sqnr_symmetric"] + 3  # one-sided
    weight = dists["dw"].weight
    assert weight is not None
    assert abs(weight.stats["sqnr_asymmetric"] - weight.stats["sqnr_symmetric"]) < 6


def test_mse_ranges_clip_the_tail() -> None:
    mse = _prepare("mse")
    clipped = {d.node: d for d in analyze_distributions(mse.graph, mse.profile, mse.table,
                                                        method=mse.method, formats=["int8"])}
    act = clipped["dw"].activation
    assert act is not None and act.stats["clipped"] > 0
    assert act.formats["int8"]["clipped"] == act.stats["clipped"]


def test_json_and_csv_rows(dists: dict[str, NodeDistribution]) -> None:
    for dist in dists.values():
        text = json.dumps(dist.to_dict())
        back = json.loads(text)
        assert set(back) == {"node", "op_type", "index", "weight", "activation", "inputs",
                             "flags", "codes"}
        for row in dist.rows():
            assert set(row) == set(STAT_COLUMNS)
    assert dists["gap"].weight is None and dists["fc"].weight is not None


def test_flag_rules() -> None:
    rules = FlagRules()
    quiet = {"min": -1.0, "max": 1.0, "kurtosis": 0.0, "skew": 0.0, "span999": 1.9,
             "levels_used": 200.0, "channel_range_ratio": 2.0, "clipped": 0.0}
    assert tensor_flags("t", quiet, rules, symmetric=False) == []
    loud = {"min": 0.0, "max": 100.0, "kurtosis": 50.0, "skew": 5.0, "span999": 2.0,
            "levels_used": 3.0, "channel_range_ratio": 80.0, "clipped": 0.01}
    codes = [c for c, _ in tensor_flags("t", loud, rules, symmetric=True)]
    assert codes == ["heavy_tails", "outliers", "narrow", "skewed", "channel_ranges",
                     "clipping"]
    messages = dict(tensor_flags("t", loud, rules, symmetric=True))
    assert "80x" in messages["channel_ranges"] and "1.00 %" in messages["clipping"]
    assert "symmetric grid" in messages["skewed"]
