"""The search: space and seeds, a real Optuna study end to end, kill-and-resume, two workers on
PostgreSQL, export of a front point re-measured on held-out data."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pytest
from _paths import FIXTURES

from mpsearch.cli import main
from mpsearch.demo import DEMO_MODEL
from mpsearch.graph import load_model
from mpsearch.pipeline import export_point, search_run
from mpsearch.profiles import load_profile
from mpsearch.rundir import Baseline, Front, FrontPoint
from mpsearch.search import (
    MEASURE_ABOVE,
    Group,
    compress,
    group_costs,
    group_nodes,
    knapsack,
    race_stages,
)
from mpsearch.search._callbacks import best_trials
from mpsearch.spec import load_spec

pytestmark = pytest.mark.slow  # whole searches, servers, browsers, toolchains


def _spec(tmp_path: Path, model: str = "shufflenet", trials: int = 14, extra: str = "",
          profile: str = "x86_ort") -> Path:
    path = tmp_path / f"{model}.yaml"
    onnx_file = DEMO_MODEL if model == "demo" else FIXTURES / (model + ".onnx")
    path.write_text(
        f"model: {onnx_file}\n"
        f"profile: {profile}\n"
        f"data: {{source: {FIXTURES / 'digits_eval.npz'}, calibration: 64, held_out: 0.5}}\n"
        "metric: accuracy\n"
        f"budget: {{trials: {trials}}}\n"
        "evaluation: {sensitivity_samples: 96}\n"
        f"seed: 0\n{extra}"
    )
    return path


def test_knapsack_matches_brute_force() -> None:
    rng = np.random.default_rng(3)
    groups = [Group(name=f"g{i}", nodes=(f"g{i}",), formats=("int8", "int16", "fp32"))
              for i in range(6)]
    cost, extra = {}, {}
    for g in groups:
        noise = rng.uniform(0.001, 0.1)
        size = float(rng.integers(100, 1000))
        cost.update({(g.name, "int8"): noise, (g.name, "int16"): noise / 50,
                     (g.name, "fp32"): 0.0})
        extra.update({(g.name, "int8"): 0.0, (g.name, "int16"): size / 2,
                      (g.name, "fp32"): size * 3})
    capacity = 2500.0
    best = min(
        (sum(cost[(g.name, f)] for g, f in zip(groups, choice, strict=True)), choice)
        for choice in itertools.product(*(g.formats for g in groups))
        if sum(extra[(g.name, f)] for g, f in zip(groups, choice, strict=True)) <= capacity
    )
    found = knapsack(groups, cost, extra, capacity, bins=5000)
    assert found is not None
    assert sum(extra[(g, f)] for g, f in found.items()) <= capacity
    assert sum(cost[(g, f)] for g, f in found.items()) == pytest.approx(best[0], rel=1e-6)


def test_compress_sheds_the_cheapest_promotions_first() -> None:
    groups = [Group(name=f"g{i}", nodes=(f"g{i}",), formats=("int8", "int16", "fp32"))
              for i in range(8)]
    levels = {g.name: i % 3 for i, g in enumerate(groups)}
    cost = {(g.name, f): c for i, g in enumerate(groups)
            for f, c in zip(g.formats, (0.1 * (i + 1), 0.01 * (i + 1), 0.0), strict=True)}
    for seed in range(20):
        moved = compress(groups, levels, cost, np.random.default_rng(seed))
        down = {n for n in levels if moved[n] != levels[n]}
        assert down and all(moved[n] == levels[n] - 1 for n in down)
        assert all(moved[n] >= 0 for n in moved)
        below = {g.name: cost[(g.name, g.formats[levels[g.name] - 1])]
                 for g in groups if levels[g.name] > 0}
        # the demoted groups are exactly those at most as costly one format down as a threshold
        assert max(below[n] for n in down) < min(
            (below[n] for n in below if n not in down), default=np.inf)


def test_group_costs_measure_int16_only_above_the_floor() -> None:
    graph = load_model(FIXTURES / "shufflenet.onnx")
    profile = load_profile("x86_ort")
    groups = group_nodes(graph, profile)
    int8 = {g.name: 0.5 ** i for i, g in enumerate(groups)}  # 1, 1/2, 1/4, ...
    calls: list[tuple[str, str]] = []

    def measure(group: Group, fmt: str) -> float:
        calls.append((group.name, fmt))
        return int8[group.name] if fmt == "int8" else int8[group.name] / 100

    costs = group_costs(graph, profile, groups, measure)
    above = [g.name for g in groups if int8[g.name] >= MEASURE_ABOVE]  # 1, 1/2, 1/4, 1/8
    assert calls == [(g.name, "int8") for g in groups] + [(n, "int16") for n in above]
    assert all(costs[(n, "int16")] == int8[n] / 100 for n in above)
    # a16w16 and fp16w are never measured here: int16 already costs < the floor everywhere,
    # so their costs are int16's scaled by the grids' noise power ratio
    assert all(costs[(g.name, "fp32")] == 0.0 for g in groups)
    assert len(costs) == 5 * len(groups)
    # noise powers add: A16W8 rounds on a 16-bit and an 8-bit grid, A16W16 on two 16-bit ones
    a16w16_over_int16 = 2 * 4.0 ** -16 / (4.0 ** -16 + 4.0 ** -8)
    assert all(costs[(g.name, "a16w16")] == costs[(g.name, "int16")] * a16w16_over_int16
               for g in groups if any(graph.nodes[n].weights for n in g.nodes))


def test_groups_cover_quantizable_nodes_once() -> None:
    graph = load_model(FIXTURES / "resnet.onnx")
    profile = load_profile("x86_ort")
    groups = group_nodes(graph, profile)
    members = [n for g in groups for n in g.nodes]
    assert len(members) == len(set(members))
    assert all(graph.nodes[g.name].weights for g in groups if len(g.nodes) > 1)
    assert all(g.formats == ("int8", "int16", "a16w16", "fp16w", "fp32") for g in groups)
    assert len(groups) < len(graph.quantizable_nodes())  # activations follow their producer


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("search")
    # The demo loses INT8 accuracy by construction on every CPU; x86_ort_auto keeps ORT's fused
    # int8 kernels exact on this machine (x86_ort with VNNI, x86_ort_avx2 without).
    # Metric and size (the default adds latency where it is timed: a noisy third objective
    # these checks of the front's shape leave out); the default recovery (auto), which leaves
    # the demo's outlier weights in place (tests/fixtures/build_demo.py)
    spec = _spec(tmp, model="demo", profile="x86_ort_auto",
                 extra="objectives: [metric, size]\n")
    run = search_run(load_spec(spec), tmp / "run")
    assert run.front.points
    return run.run_dir


def test_search_writes_a_front(finished_run: Path) -> None:
    front = json.loads((finished_run / "front.json").read_text())
    points = front["points"]
    assert points and front["metric"] == "accuracy"
    sizes = [p["size"] for p in points]
    metrics = [p["search_metric"] for p in points]
    assert sizes == sorted(sizes)
    # Non-dominated: the metric never falls as size grows (equal counts are ordered by the
    # SQNR tie-break, so a larger point may share its smaller neighbour's count).
    assert all(b >= a for a, b in zip(metrics, metrics[1:], strict=False))
    assert front["fp32"]["size"] > min(sizes)
    assert "int8" in front["uniform"]
    trials = (finished_run / "trials.csv").read_text().splitlines()
    assert trials[0].startswith("trial,state,metric,size") and len(trials) == 15
    assert any("uniform int8" in line for line in trials)
    assert any("knapsack" in line or "greedy" in line for line in trials)


def test_front_beats_uniform_int8_where_int8_loses_accuracy(finished_run: Path) -> None:
    front = json.loads((finished_run / "front.json").read_text())
    int8 = front["uniform"]["int8"]
    fp32 = front["fp32"]
    assert fp32["metric"] - int8["metric"] >= 0.05  # the demo is built to be hard for INT8
    best_small = [p for p in front["points"] if p["size"] <= 1.25 * int8["size"]]
    assert max(p["metric"] for p in best_small) >= fp32["metric"] - 0.01


def test_export_matches_the_front(finished_run: Path, tmp_path: Path) -> None:
    front = json.loads((finished_run / "front.json").read_text())
    k = len(front["points"]) - 1
    result = export_point(finished_run, k, tmp_path / "point.onnx")
    assert result.path.is_file()
    assert result.evaluation.value == pytest.approx(front["points"][k]["metric"], abs=1e-9)
    assert result.size == front["points"][k]["size"]


def test_trials_are_raced_on_doubling_sample_counts() -> None:
    """A trial is measured on a first chunk, then twice as many samples, up to all of them."""
    assert race_stages(128, 4) == (32, 64, 128)
    assert race_stages(100, 4) == (25, 50, 100)
    assert race_stages(100, 3) == (33, 66, 100)
    assert race_stages(128, 1) == (128,)
    assert race_stages(1, 4) == (1,)


def test_int16_is_measured_only_where_int8_costs_something(finished_run: Path) -> None:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(finished_run / "study.journal")))
    costs = {(g, f): c for g, f, c in optuna.load_study(
        study_name="mpsearch", storage=storage).user_attrs["group_costs"]}
    graph = load_model(DEMO_MODEL)
    profile = load_profile("x86_ort_auto")
    groups = group_nodes(graph, profile)
    assert set(costs) == {(g.name, f) for g in groups for f in g.formats}
    int8 = {g.name: costs[(g.name, "int8")] for g in groups}
    floor = MEASURE_ABOVE * max(int8.values())
    assert all(costs[(g.name, "fp32")] == 0.0 for g in groups)
    estimated = [g for g in groups if int8[g.name] < floor]
    assert estimated and len(estimated) < len(groups)
    # Not measured: scaled by the ratio of noise powers, each summed over the grids a node
    # rounds on (4 ** -bits each). A16W8's weights are 8-bit; INT8's are 8-bit too, or 7 where
    # the profile reduces their range (AVX2).
    int8_weight_bits = 8 - profile.format("int8").weight.reduce_range
    for group in estimated:
        weighted = any(graph.nodes[n].weights for n in group.nodes)
        ratio = ((4.0 ** -16 + 4.0 ** -8) / (4.0 ** -8 + 4.0 ** -int8_weight_bits)
                 if weighted else 4.0 ** -8)
        assert costs[(group.name, "int16")] == pytest.approx(int8[group.name] * ratio,
                                                             rel=1e-12)


def test_study_is_a_real_journal(finished_run: Path) -> None:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(finished_run / "study.journal")))
    study = optuna.load_study(study_name="mpsearch", storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 14 and len(study.directions) == 2
    assert all(t.user_attrs["assignment"] for t in finished if t.values)


def test_rerun_without_resume_refuses(finished_run: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path)
    assert main(["-q", "search", str(spec), "--out", str(finished_run), "--no-report"]) == 2
    assert "--resume" in capsys.readouterr().err


def _completed(journal: Path) -> int:
    if not journal.exists():
        return 0
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal)))
    try:
        study = optuna.load_study(study_name="mpsearch", storage=storage)
    except KeyError:
        return 0
    return len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))


def test_killed_search_resumes_with_every_finished_trial(tmp_path: Path) -> None:
    spec = _spec(tmp_path, trials=24)
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "mpsearch", "-q", "search", str(spec), "--out",
               str(run_dir), "--no-report"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = run_dir / "study.journal"
    deadline = time.time() + 240
    while _completed(journal) < 6 and time.time() < deadline and process.poll() is None:
        time.sleep(0.5)
    assert process.poll() is None, "the search finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal)))
    before = {t.number: t.values for t in optuna.load_study(
        study_name="mpsearch", storage=storage).get_trials(
            states=(optuna.trial.TrialState.COMPLETE,))}
    assert 6 <= len(before) < 24
    assert main(["-q", "search", str(spec), "--out", str(run_dir), "--resume",
                 "--no-report"]) == 0
    after = optuna.load_study(study_name="mpsearch", storage=storage).get_trials()
    assert not [t for t in after if t.state == optuna.trial.TrialState.RUNNING]
    done = {t.number: t.values for t in after if t.state == optuna.trial.TrialState.COMPLETE}
    assert all(done[n] == v for n, v in before.items())  # nothing lost, nothing re-run
    finished = [t for t in after if t.state in (optuna.trial.TrialState.COMPLETE,
                                                optuna.trial.TrialState.PRUNED)]
    assert len(finished) == 24



def test_two_workers_share_one_postgres_study(tmp_path: Path,
                                              postgres_study: tuple[str, str]) -> None:
    url, study = postgres_study
    spec = _spec(tmp_path, trials=16)
    workers = [subprocess.Popen(
        [sys.executable, "-m", "mpsearch", "-q", "search", str(spec), "--out",
         str(tmp_path / f"w{i}"), "--storage", url, "--study", study, "--no-report"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
    outputs = [w.communicate(timeout=600) for w in workers]
    assert all(w.returncode == 0 for w in workers), [
        (w.returncode, err.decode(errors="replace")[-3000:]) for w, (_, err) in zip(
            workers, outputs, strict=True)]
    trials = optuna.load_study(study_name=study, storage=url).get_trials()
    finished = [t for t in trials if t.state.is_finished()]
    assert len(finished) >= 16
    workers_seen = {t.user_attrs.get("worker") for t in finished}
    assert len(workers_seen) == 2, workers_seen
    shutil.rmtree(tmp_path / "w0", ignore_errors=True)


def test_score_breaks_ties_between_equal_counts_by_output_noise() -> None:
    """The sampler's value for an accuracy-like metric: the count decides; among equal counts
    the configuration with the higher output SQNR ranks higher, always below one more sample;
    other metrics are their own value."""
    from mpsearch.analysis import Measurement
    from mpsearch.search._score import SQNR_CAP
    from mpsearch.search._score import score as trial_score

    def score(primary: str, value: float, sqnr: float, higher: bool = True,
              by_sqnr: bool = False) -> float:
        result = Measurement(metrics={primary: value, "sqnr": sqnr}, primary=primary,
                             samples=128)
        return trial_score(result, higher=higher, by_sqnr=by_sqnr)

    assert score("agreement", 127 / 128, 30.0) == pytest.approx((127 + 0.5) / 128, abs=1e-12)
    assert score("agreement", 127 / 128, 0.0) == 127 / 128
    assert score("agreement", 127 / 128, -4.0) == 127 / 128  # floored at 0 dB
    assert score("agreement", 127 / 128, 40.0) > score("agreement", 127 / 128, 20.0)
    assert score("agreement", 126 / 128, math.inf) < score("agreement", 127 / 128, 0.0)
    assert score("accuracy", 126 / 128, math.inf) < 127 / 128
    assert score("cosine", 0.99, 30.0) == 0.99
    assert score("mse", 0.2, 30.0, higher=False) == 0.2
    # search_score sqnr: the SQNR itself (capped: an output identical to FP32's is infinite)
    assert score("agreement", 0.5, 31.5, by_sqnr=True) == 31.5
    assert score("mse", 0.2, -3.0, higher=False, by_sqnr=True) == -3.0
    assert score("agreement", 1.0, math.inf, by_sqnr=True) == SQNR_CAP
    assert score("agreement", 1.0, math.nan, by_sqnr=True) == -SQNR_CAP


@pytest.mark.parametrize(("setting", "metric", "expected"), [
    ("auto", "agreement", True), ("auto", "accuracy", False), ("auto", "cosine", False),
    ("metric", "agreement", False), ("sqnr", "accuracy", True)])
def test_search_score_setting(setting: str, metric: str, expected: bool) -> None:
    """``evaluation.search_score``: ``auto`` searches by SQNR exactly when the metric is
    agreement with FP32; the other two say which."""
    from types import SimpleNamespace

    from mpsearch.search import SearchSettings
    from mpsearch.search._study import search_by_sqnr

    settings = SearchSettings(search_score=setting)
    measurer = SimpleNamespace(fp32=lambda: SimpleNamespace(primary=metric))
    assert search_by_sqnr(settings, measurer) is expected  # type: ignore[arg-type]


def test_sizes_a_few_bytes_apart_tie_on_the_front() -> None:
    """Uniform A16W8 is a few bytes of 16-bit zero points larger than uniform INT8 and far
    more accurate: within SIZE_TIE the sizes tie, so INT8 leaves the front; a point 1 % larger
    stays, and with latency as an objective the faster INT8 stays too."""
    from mpsearch.pareto import SIZE_TIE
    from mpsearch.search._study import TrialRecord, _front

    def record(trial: int, score: float, size: int, latency: float | None = None
               ) -> TrialRecord:
        return TrialRecord(trial=trial, state="complete", metric=score / 100, score=score,
                           size=size, latency=latency, source="seed", assignment={})

    int8, int16 = record(0, 14.4, 3777042), record(1, 35.5, 3777108)
    larger = record(2, 37.6, int(3777108 * (1 + 10 * SIZE_TIE)))
    assert [r.trial for r in _front([int8, int16, larger], None, True)] == [1, 2]
    timed = [record(0, 14.4, 3777042, 1.0), record(1, 35.5, 3777108, 3.0)]
    assert [r.trial for r in _front(timed, None, True)] == [0, 1]


def test_thin_front_keeps_the_ends_and_spreads_the_rest() -> None:
    from mpsearch.search._study import TrialRecord, thin_front

    front = [TrialRecord(trial=i, state="complete", metric=0.5 + 0.5 * i / 29,
                         size=int(1000 * 1.1 ** i), latency=None, source="sampler",
                         assignment={}) for i in range(30)]
    kept = thin_front(front, 12)
    assert len(kept) == 12 and kept[0] is front[0] and kept[-1] is front[-1]
    trials = [r.trial for r in kept]
    assert trials == sorted(trials)  # still by size
    # A straight front in (log size, metric): the marks fall at evenly spaced trials.
    assert trials == [round(29 * k / 11) for k in range(12)]
    assert thin_front(front[:5], 12) == tuple(front[:5])


@pytest.mark.parametrize("directions", [["maximize", "minimize"],
                                        ["maximize", "minimize", "minimize"]])
def test_best_trials_without_a_deep_copy_match_optuna_s(directions: list[str]) -> None:
    """The callbacks' Pareto front equals Study.best_trials, ties on a coarse grid included."""
    rng = np.random.default_rng(3)
    study = optuna.create_study(directions=directions)
    for _ in range(60):  # a metric that costs size: a front of several points
        metric = int(rng.integers(0, 8))
        latency = rng.integers(0, 4, len(directions) - 2)
        values = [metric, metric + int(rng.integers(0, 3)), *latency]
        study.add_trial(optuna.trial.create_trial(values=[float(v) for v in values]))
    ours = sorted(t.number for t in best_trials(study))
    assert ours == sorted(t.number for t in study.best_trials)
    assert 3 <= len(ours) < 30


def test_the_same_configuration_times_alike_in_three_searches(tmp_path: Path) -> None:
    """Latency is the median of interleaved runs with their spread (fastest, slowest): three
    searches of the same spec report, for FP32, uniform INT8 and every point they share,
    batch-1 and batch-N intervals that overlap."""
    spec = _spec(tmp_path, "resnet", trials=3, profile="x86_ort_auto",
                 extra="analysis: false\nobjectives: [metric, size, latency]\n")
    runs = [search_run(load_spec(spec), tmp_path / f"run{i}") for i in range(3)]
    fronts = [run.front for run in runs]
    assert all(f.latency_source == "measured" for f in fronts)
    shared = set.intersection(*({json.dumps(dict(p.assignment), sort_keys=True)
                                 for p in f.points} for f in fronts))

    def items(front: Front) -> dict[str, Baseline | FrontPoint]:
        found: dict[str, Baseline | FrontPoint] = {"fp32": front.fp32,
                                                   "int8": front.uniform["int8"]}
        for p in front.points:
            key = json.dumps(dict(p.assignment), sort_keys=True)
            if key in shared:
                found[key] = p
        return found

    per_run = [items(f) for f in fronts]
    assert len(per_run[0]) >= 3 and all(r.keys() == per_run[0].keys() for r in per_run)
    for name in per_run[0]:
        for field in ("latency_ms_interval", "batch_latency_ms_interval"):
            intervals = [getattr(r[name], field) for r in per_run]
            assert all(i is not None and i[0] <= i[1] for i in intervals), (name, field)
            low, high = max(i[0] for i in intervals), min(i[1] for i in intervals)
            assert low <= high, (name, field, intervals)
