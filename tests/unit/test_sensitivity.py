"""Layer-wise sensitivity: a node made sensitive on purpose ranks first (end to end, proxy and
reverse view), classification, the curve, the run-directory files and their cache, the CLI."""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from _paths import FIXTURES
from onnx import TensorProto, helper, numpy_helper

from mpsearch.analysis import (
    Analysis,
    Measurement,
    Measurer,
    NodeSensitivity,
    Thresholds,
    kendall_tau,
    output_kl,
    rank_sensitivity,
)
from mpsearch.assignment import assignment_key
from mpsearch.cli._analyze import add_analyze_parser
from mpsearch.clock import ROUNDS
from mpsearch.data import Dataset, load_data
from mpsearch.errors import MpsearchError, QuantizationError, SpecError
from mpsearch.evaluate import Evaluator
from mpsearch.pipeline import Prepared, analyze_prepared, prepare_inputs

OUTLIER_NODE = "mm2"


def outlier_mlp(seed: int = 0) -> onnx.ModelProto:
    """x -> MatMul mm1 -> Relu -> MatMul mm2 -> Relu -> MatMul mm3 -> logits.

    Column 5 of mm1's weight is 0, so channel 5 after the ReLU is always 0 and row 5 of mm2's
    weight does nothing in FP32; that row is set to +-1000. Per output channel of mm2 the
    weight range is then +-1000 and every other weight rounds to 0 in INT8: mm2, and only
    mm2, is very sensitive.
    """
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.5, (16, 32)).astype(np.float32)
    w1[:, 5] = 0.0
    w2 = rng.normal(0, 0.3, (32, 32)).astype(np.float32)
    w2[5] = np.where(np.arange(32) % 2 == 0, 1000.0, -1000.0)
    w3 = rng.normal(0, 0.3, (32, 10)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
             helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
             helper.make_node("MatMul", ["r1", "w2"], ["h2"], name=OUTLIER_NODE),
             helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
             helper.make_node("MatMul", ["r2", "w3"], ["logits"], name="mm3")]
    graph = helper.make_graph(
        nodes, "outlier_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(w, n) for n, w in (("w1", w1), ("w2", w2), ("w3", w3))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def mlp() -> Prepared:
    x = np.random.default_rng(1).normal(size=(160, 16)).astype(np.float32)
    return prepare_inputs(outlier_mlp(), "x86_ort", Dataset(inputs={"x": x}, source="mlp"),
                   calibration_samples=64)


@pytest.fixture(scope="module")
def mlp_analysis(mlp: Prepared, tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    return analyze_prepared(mlp, tmp_path_factory.mktemp("run"))


def test_outlier_node_ranks_first_in_every_format(mlp_analysis: Analysis) -> None:
    """mm2's +-1000 weight row ruins every integer weight grid; float16 weights keep it."""
    assert mlp_analysis.formats == ("int8", "int16", "a16w16", "fp16w")
    half = [r for r in mlp_analysis.sensitivity if r.format == "fp16w"]
    assert len(half) == 5 and all(r.drop == 0.0 and r.sqnr is not None and r.sqnr > 60
                                  for r in half)
    for fmt in ("int8", "int16", "a16w16"):
        top = mlp_analysis.ranking(fmt)[0]
        row = next(r for r in mlp_analysis.sensitivity if r.node == top and r.format == fmt)
        assert top == OUTLIER_NODE
        assert row.rank == 1 and row.cls == "high"
        # 16-bit weights round the other rows 256x finer: 2 points lost, not 20
        assert row.drop is not None and row.drop > (0.01 if fmt == "a16w16" else 0.2)
        others = [r.sqnr for r in mlp_analysis.sensitivity if r.format == fmt and r.node != top]
        margin = 3 if fmt == "a16w16" else 10  # the others' SQNR is capped by range clipping
        assert row.sqnr is not None and row.sqnr < min(o for o in others if o is not None) - margin


def test_rows_cover_every_node_and_format_in_topological_order(mlp_analysis: Analysis) -> None:
    pairs = [(r.node, r.format) for r in mlp_analysis.sensitivity]
    nodes = ["mm1", "relu1", "mm2", "relu2", "mm3"]
    formats = ("int8", "int16", "a16w16", "fp16w")
    assert pairs == [(n, f) for n in nodes for f in formats]
    for fmt in formats:
        ranks = sorted(r.rank for r in mlp_analysis.sensitivity if r.format == fmt)
        assert ranks == [1, 2, 3, 4, 5]


def test_fp32_metric_is_the_evaluators(mlp: Prepared, mlp_analysis: Analysis) -> None:
    evaluator = Evaluator(mlp.graph, mlp.validation)
    assert mlp_analysis.metric == "agreement"
    assert dict(mlp_analysis.fp32) == dict(evaluator.fp32().metrics)
    assert math.isinf(mlp_analysis.fp32["sqnr"])


def test_reverse_view_restoring_the_outlier_node_gains_most(mlp_analysis: Analysis) -> None:
    assert mlp_analysis.reverse_base is not None
    assert mlp_analysis.reverse_base["formats"] == {n: "int8" for n in
                                                    ("mm1", "relu1", "mm2", "relu2", "mm3")}
    best = min(mlp_analysis.reverse, key=lambda r: r.rank)
    assert best.node == OUTLIER_NODE and best.gain > 0.2
    assert best.sqnr_gain is not None and best.sqnr_gain > 10


def test_curve_steps_sizes_and_orders(mlp: Prepared, mlp_analysis: Analysis) -> None:
    by_order: dict[str, list] = {}
    for point in mlp_analysis.curve:
        by_order.setdefault(point.order, []).append(point)
    assert set(by_order) == {"topological", "sensitivity"}
    topo, sens = by_order["topological"], by_order["sensitivity"]
    assert [p.node for p in topo] == [None, "mm1", "relu1", "mm2", "relu2", "mm3"]
    assert sens[-1].node == OUTLIER_NODE  # least sensitive first, the outlier node last
    assert topo[0].drop == 0 and topo[0].size_ratio == 1
    sizes = [p.size for p in topo]
    assert sizes[0] > sizes[1] and sizes[-1] < sizes[0] / 3
    assert topo[-1].size == sens[-1].size and topo[-1].metric == sens[-1].metric
    assert sens[-2].drop < 0.1 < sens[-1].drop  # the curve breaks at the outlier node


def test_run_directory_files_and_schema(mlp_analysis: Analysis, tmp_path: Path,
                                        mlp: Prepared) -> None:
    analysis = analyze_prepared(mlp, formats=["int8"], run_dir=tmp_path, distributions=False)
    for name in ("sensitivity.json", "sensitivity.csv", "reverse.csv", "curve.json",
                 "curve.csv", "distributions.json", "distributions.csv", "summary.json",
                 "profile.json", "cache/measurements.json"):
        assert (tmp_path / name).is_file(), name
    doc = json.loads((tmp_path / "sensitivity.json").read_text())
    assert doc["metric"] == "agreement" and doc["formats"] == ["int8"]
    assert doc["ranking"]["int8"][0] == OUTLIER_NODE
    assert set(doc["nodes"][0]) == set(NodeSensitivity.__dataclass_fields__)
    assert doc["fp32"]["sqnr"] is None  # +inf is written as null
    assert doc["reverse"]["rows"] and doc["reverse"]["base"]["formats"]
    curve = json.loads((tmp_path / "curve.json").read_text())
    assert set(curve["orders"]) == {"topological", "sensitivity"}
    assert curve["fp32_metric"] == analysis.fp32["agreement"]
    with (tmp_path / "sensitivity.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5 and {r["cls"] for r in rows} <= {"low", "medium", "high"}


def test_rerun_is_free_and_identical(mlp: Prepared, tmp_path: Path) -> None:
    first = analyze_prepared(mlp, formats=["int8"], run_dir=tmp_path, distributions=False)
    assert first.evaluations > 0
    again = analyze_prepared(mlp, formats=["int8"], run_dir=tmp_path, distributions=False)
    assert again.evaluations == 0
    assert again.sensitivity == first.sensitivity
    assert again.reverse == first.reverse and again.curve == first.curve
    other = analyze_prepared(mlp, tmp_path, formats=["int8"], distributions=False, samples=40,
                             reverse=False, curve=False)
    assert other.evaluations == 5  # other data: the cache does not apply


def test_thresholds_only_reclassify(mlp: Prepared, tmp_path: Path) -> None:
    strict = Thresholds(high_drop=0.0, medium_drop=0.0, high_sqnr=1000, medium_sqnr=1000)
    loose = Thresholds(high_drop=10, medium_drop=10, high_sqnr=-1000, medium_sqnr=-1000)
    a = analyze_prepared(mlp, formats=["int8"], thresholds=strict, reverse=False, curve=False,
                distributions=False, run_dir=tmp_path)
    b = analyze_prepared(mlp, formats=["int8"], thresholds=loose, reverse=False, curve=False,
                distributions=False, run_dir=tmp_path)
    assert b.evaluations == 0
    assert {r.cls for r in a.sensitivity} == {"high"} and {r.cls for r in b.sensitivity} == {"low"}
    assert [r.rank for r in a.sensitivity] == [r.rank for r in b.sensitivity]


def test_proxy_mode_ranks_the_outlier_node_first(mlp: Prepared, tmp_path: Path) -> None:
    proxy = analyze_prepared(mlp, proxy=True, proxy_samples=16, run_dir=tmp_path)
    assert proxy.mode == "proxy" and proxy.evaluations == 0
    assert proxy.reverse == () and proxy.curve == ()
    assert proxy.formats == ("int8", "int16", "a16w16", "fp16w")
    for fmt in proxy.formats[:-1]:  # the integer weight grids; fp16w keeps the row
        assert proxy.ranking(fmt)[0] == OUTLIER_NODE
    row = proxy.most_sensitive(1)[0]
    assert row.drop is None and row.sqnr is None and row.proxy_sqnr is not None
    assert row.proxy_sqnr < 10
    again = analyze_prepared(mlp, proxy=True, proxy_samples=16, run_dir=tmp_path)
    assert again.sensitivity == proxy.sensitivity


def test_outlier_fixture_top_node_touches_the_outlier_tensor() -> None:
    data = load_data(FIXTURES / "digits_eval.npz")
    prepared = prepare_inputs(FIXTURES / "sensitive.onnx", "x86_ort", data,
                              calibration_samples=128)
    analysis = analyze_prepared(prepared, formats=["int8"], samples=96, reverse=False,
                                curve=False, distributions=False)
    graph = prepared.graph
    stem = graph.nodes["/stem/stem.0/Conv"].outputs[0]
    tainted = {stem}  # the outlier channel flows through the stem and block 0
    for name in graph.order:
        node = graph.nodes[name]
        if name.startswith(("/stem", "/blocks/blocks.0/")) and set(node.inputs) & tainted:
            tainted.update(node.outputs)
    top = graph.nodes[analysis.ranking("int8")[0]]
    assert set(top.inputs) & tainted or set(top.outputs) & tainted
    assert analysis.most_sensitive(1)[0].cls == "high"


def test_format_errors(mlp: Prepared) -> None:
    with pytest.raises(QuantizationError, match="float reference"):
        analyze_prepared(mlp, formats=["fp32"])
    with pytest.raises(MpsearchError, match="no format 'int4'"):
        analyze_prepared(mlp, formats=["int4"])


def test_thresholds_classify_and_validate() -> None:
    t = Thresholds(high_drop=0.01, medium_drop=0.002, high_sqnr=20, medium_sqnr=30)
    assert t.classify(0.01, 50) == "high" and t.classify(0.0, 19.9) == "high"
    assert t.classify(0.002, 50) == "medium" and t.classify(0.0, 25) == "medium"
    assert t.classify(0.0, math.inf) == "low" and t.classify(None, None) == "low"
    assert t.classify(-0.05, 40) == "low"
    with pytest.raises(SpecError, match="medium_drop <= high_drop"):
        Thresholds(high_drop=0.001, medium_drop=0.01)
    with pytest.raises(SpecError, match="high_sqnr <= medium_sqnr"):
        Thresholds(high_sqnr=40, medium_sqnr=30)


def test_ranking_breaks_drop_ties_by_sqnr() -> None:
    rows = [NodeSensitivity(node=n, op_type="Conv", format="int8", index=i, drop=d, sqnr=s)
            for i, (n, d, s) in enumerate((("a", 0.0, 40.0), ("b", 0.0, 25.0),
                                          ("c", 0.05, 35.0), ("d", 0.0, math.inf)))]
    ranked = {r.node: (r.rank, r.cls) for r in rank_sensitivity(rows, Thresholds())}
    assert ranked == {"c": (1, "high"), "b": (2, "medium"), "a": (3, "low"), "d": (4, "low")}


def _tau_b(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b straight from its definition (pairs, ties excluded per variable)."""
    concordant = discordant = tie_x = tie_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tie_x += 1
            elif dy == 0:
                tie_y += 1
            elif dx * dy > 0:
                concordant += 1
            else:
                discordant += 1
    n1, n2 = concordant + discordant + tie_y, concordant + discordant + tie_x
    return (concordant - discordant) / math.sqrt(n1 * n2)


def test_kendall_tau_matches_its_definition() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, 40).astype(float)
    y = x + rng.integers(0, 3, 40)
    assert kendall_tau(x, y) == pytest.approx(_tau_b(list(x), list(y)), abs=1e-12)
    assert kendall_tau([1, 2, 3], [1, 2, 3]) == 1.0
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))


def test_output_kl_and_measurement_round_trip() -> None:
    logits = np.random.default_rng(0).normal(size=(8, 10)).astype(np.float32)
    assert output_kl(logits, logits) == pytest.approx(0.0, abs=1e-12)
    assert output_kl(logits, logits + np.eye(10, dtype=np.float32)[0]) > 0
    assert output_kl(logits[:, :1], logits[:, :1]) is None
    m = Measurement(metrics={"agreement": 1.0, "sqnr": math.inf}, primary="agreement", kl=0.0)
    restored = Measurement.from_dict(json.loads(json.dumps(
        {**m.to_dict(), "metrics": {"agreement": 1.0, "sqnr": None}})))
    assert restored.value == 1.0 and restored.sqnr == math.inf


def test_cli_handler_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    model = tmp_path / "mlp.onnx"
    onnx.save(outlier_mlp(), model)
    x = np.random.default_rng(1).normal(size=(96, 16)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=x)
    parser = argparse.ArgumentParser()
    add_analyze_parser(parser.add_subparsers())
    args = parser.parse_args(["analyze", str(model), "--profile", "x86_ort", "--data",
                              str(tmp_path / "data.npz"), "--out", str(tmp_path / "run"),
                              "--formats", "int8", "--limit", "32", "--no-curve",
                              "--no-report", "--top", "3"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "agreement FP32 1" in lines[0] and "int8: " in lines[0]
    assert lines[2].split()[:4] == ["1", OUTLIER_NODE, "MatMul", "high"]
    assert "heavy_tails" in lines[2]
    assert (tmp_path / "run" / "sensitivity.json").is_file()
    assert not (tmp_path / "run" / "report.html").exists()


def test_latency_is_timed_by_the_clock_once_and_cached(mlp: Prepared) -> None:
    """A latency is :mod:`mpsearch.clock`'s median of its repeat policy, kept in the
    measurement cache (a rerun does not time again) beside the measurement it leaves alone."""
    measurer = Measurer(mlp.quantizer, mlp.validation, batch_size=16)
    formats = {node.name: "int8" for node in mlp.graph.quantizable_nodes()}
    measured = measurer.measure(formats, samples=64)
    seconds = measurer.latency(formats, batch=16)
    assert 0 < seconds < 10
    key = f"{assignment_key(measurer.canonical(formats))}@latency16"
    assert measurer.cache[key] == {"seconds": seconds, "batch": 16, "repeat": ROUNDS}
    assert measurer.latency(formats, batch=16) == seconds  # from the cache
    assert measurer.measure(formats, samples=64) == measured


def test_outputs_of_the_configuration_just_measured_come_without_a_second_pass(
        mlp: Prepared) -> None:
    """The held-out bootstrap interval resamples the outputs the measurement gathered: equal
    to a fresh pass of the built model, and no batch runs again."""
    measurer = Measurer(mlp.quantizer, mlp.validation, batch_size=16)
    formats = {node.name: "int8" for node in mlp.graph.quantizable_nodes()}
    measurer.measure(formats)
    state = measurer._open
    assert state is not None
    runs = len(state.outputs)
    outputs = measurer.outputs(formats)
    assert measurer._open is state and len(state.outputs) == runs
    fresh = measurer.evaluator.outputs(mlp.quantizer.build(formats))
    np.testing.assert_array_equal(outputs, fresh)
    assert len(outputs) == len(mlp.validation)
    fp32 = measurer.outputs({})  # another configuration: its own session, one pass
    assert measurer._open is not state
    np.testing.assert_array_equal(fp32, measurer.evaluator.reference)
