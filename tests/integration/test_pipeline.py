"""The composer: one measurer shared by the analysis and the search, time budgets, run-directory
round trips, and the metric-drop constraint for a lower-is-better metric."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import optuna
import pytest
from _paths import ROOT
from onnx import numpy_helper

from mpsearch import (
    estimate_latency,
    host_int8_isa,
    load_model,
    load_profile,
    summarize,
    write_report,
)
from mpsearch._io import write_json
from mpsearch.analysis import assignment_key, wilson_interval
from mpsearch.analysis._analysis import curve_steps
from mpsearch.demo import DEMO_DATA, DEMO_MODEL
from mpsearch.errors import SearchError
from mpsearch.pareto import dominated_flags
from mpsearch.pipeline import (
    REPORT_VIEW_NODES,
    SearchRun,
    export_point,
    prepare_inputs,
    search_run,
    with_objectives,
)
from mpsearch.profiles import measures_latency
from mpsearch.rundir import Baseline, Front, FrontPoint, RunDir
from mpsearch.search import MEASURE_ABOVE, group_nodes
from mpsearch.spec import Budget, DataSpec, EvaluationSpec, SearchSpec, load_spec

pytestmark = pytest.mark.slow  # whole searches, servers, browsers, toolchains


def _spec(**changes: object) -> SearchSpec:
    base = SearchSpec(model=str(DEMO_MODEL), profile="x86_ort_auto",
                      data=DataSpec(source=str(DEMO_DATA), calibration=64), metric="accuracy",
                      budget=Budget(trials=12), evaluation=EvaluationSpec(sensitivity_samples=64),
                      seed=0)
    return base.with_overrides(**changes)


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> SearchRun:
    return search_run(_spec(), tmp_path_factory.mktemp("run"))


def test_search_measures_no_single_node_configuration_twice(searched: SearchRun) -> None:
    """The analysis's rows are the search's one-node group costs: every (node, format) alone is
    measured exactly once, and no configuration twice on the same samples."""
    analysis = searched.analysis
    assert analysis is not None and analysis.sensitivity
    measured = list(searched.measured)
    assert len(measured) == len(set(measured))
    bases = [key.partition("@")[0] for key in measured]
    for row in analysis.sensitivity:
        assert bases.count(assignment_key({row.node: row.format})) == 1, row
    resolved = json.loads((searched.run_dir / "run.json").read_text())["resolved_profile"]
    groups = group_nodes(load_model(DEMO_MODEL), load_profile(resolved))
    single = [g for g in groups if len(g.nodes) == 1]
    assert single  # the demo has one-node groups, whose costs came from the rows above


def test_report_views_are_bounded_and_say_so(searched: SearchRun) -> None:
    """In a search the reverse view and the curves measure at most REPORT_VIEW_NODES
    configurations each; the analysis and the report name the subsets."""
    analysis = searched.analysis
    assert analysis is not None
    nodes = len({r.node for r in analysis.sensitivity})
    assert nodes > REPORT_VIEW_NODES
    assert len(analysis.reverse) == REPORT_VIEW_NODES
    for order in ("topological", "sensitivity"):
        steps = [p.step for p in analysis.curve if p.order == order]
        assert steps == [0, *curve_steps(nodes, REPORT_VIEW_NODES)] and steps[-1] == nodes
    search_split = (450 - 64) // 2  # the demo's samples less calibration, half held out
    cost = {(r.node, r.format): 10 ** (-r.sqnr / 10) + max(r.drop or 0.0, 0.0)
            for r in analysis.sensitivity if r.sqnr is not None}
    floor = MEASURE_ABOVE * max(c for (_, f), c in cost.items() if f == "int8")
    formats = ("int8", "int16", "a16w16", "fp16w")  # the profile's lower formats, by rank
    for below, fmt in itertools.pairwise(formats):  # a format is measured where the one below
        measured = {n for n, f in cost if f == fmt}  # costs at least the floor
        assert measured == {n for (n, f), c in cost.items() if f == below and c >= floor > 0}
    assert 0 < len({n for n, f in cost if f == "int16"}) < nodes
    rows = len(analysis.sensitivity)
    assert analysis.notes[:4] == (
        f"every configuration measured on the first 64 of {search_split} samples",
        "a higher format measured only where the one below costs at least 10% of the worst "
        f"node's ({rows} of {len(formats) * nodes} rows)",
        f"reverse view: the {REPORT_VIEW_NODES} most sensitive of {nodes} nodes",
        f"curves: {REPORT_VIEW_NODES} evenly spaced of {nodes} steps")
    partial = re.fullmatch(r"(\d+) configurations ran only the nodes they change, fed with FP32 "
                           r"tensors \(the whole model's values up to float rounding\)",
                           analysis.notes[4])
    assert partial and 0 < int(partial[1]) <= rows and len(analysis.notes) == 5
    html = write_report(searched.run_dir).read_text()
    assert "Subsets and shortcuts: every configuration measured on the first 64 of " in html
    assert "configurations ran only the nodes they change" in html
    assert f"reverse view: the {REPORT_VIEW_NODES} most sensitive of {nodes} nodes" in html
    header = html[:html.index("<nav>")]  # title and the run line: names, never folders
    assert "<title>mpsearch report: demo.onnx</title>" in header
    assert str(DEMO_MODEL.parent) not in header and str(searched.run_dir) not in header


def test_front_latency_is_timed_where_this_host_runs_the_target(searched: SearchRun) -> None:
    """x86 ORT on an x86 host: every front point and baseline carries its median batch-1 and
    batch-N ORT times (the held-out cache's latency entries), relative to FP32's, with the
    profile's estimate beside them."""
    front = searched.front
    profile = load_profile(json.loads((searched.run_dir / "run.json").read_text())[
        "resolved_profile"])
    if not measures_latency(profile):
        pytest.skip(f"this host does not run the target of {profile.name} "
                    f"({host_int8_isa().describe()})")
    assert front.latency_source == "measured" and front.latency_batch == 8
    fp32 = front.fp32
    assert fp32.latency == 1.0 and fp32.latency_ms is not None and fp32.batch_latency_ms
    assert fp32.latency_abs == pytest.approx(fp32.latency_ms / 1e3)
    fp32_estimate = estimate_latency(load_model(DEMO_MODEL), summarize(load_model(DEMO_MODEL)),
                                     profile, {})
    assert fp32_estimate is not None
    for item in (*front.points, *front.uniform.values()):
        assert item.latency_ms is not None and item.batch_latency_ms is not None
        assert item.latency == pytest.approx(item.latency_ms / fp32.latency_ms)
    for item in (fp32, *front.points, *front.uniform.values()):  # medians inside their spread
        assert item.latency_ms_interval and item.batch_latency_ms_interval
        assert item.latency_ms_interval[0] <= item.latency_ms <= item.latency_ms_interval[1]
        low, high = item.batch_latency_ms_interval
        assert low <= item.batch_latency_ms <= high
    for point in front.points:
        estimate = estimate_latency(load_model(DEMO_MODEL), summarize(load_model(DEMO_MODEL)),
                                    profile, point.assignment)
        assert estimate is not None
        assert point.latency_estimate == pytest.approx(estimate / fp32_estimate)


def test_curve_steps_keep_the_ends() -> None:
    assert curve_steps(5, None) == [1, 2, 3, 4, 5]
    assert curve_steps(5, 8) == [1, 2, 3, 4, 5]
    assert curve_steps(36, 4) == [1, 13, 24, 36]


def test_front_json_round_trips_through_rundir(searched: SearchRun, tmp_path: Path) -> None:
    run = RunDir(searched.run_dir)
    front = run.read_front()
    assert isinstance(front, Front) and front == searched.front
    write_json(tmp_path / "front.json", front.to_dict())  # non-finite floats as null
    assert run.front_json.read_text() == (tmp_path / "front.json").read_text()
    assert any(p.metrics["sqnr"] == math.inf for p in front.points)  # FP32's output: no noise
    timed = measures_latency(load_profile(json.loads(run.run_json.read_text())[
        "resolved_profile"]))  # the default objectives: latency too where it is timed
    assert front.objectives == (("metric", "size", "latency") if timed else ("metric", "size"))
    held = json.loads(run.measurements.read_text())["splits"]["held-out"]["entries"]
    (n,) = {entry["samples"] for entry in held.values() if "metrics" in entry}
    for point in front.points:  # accuracy: Wilson interval of k correct of the held-out n
        assert point.interval == wilson_interval(round(point.metric * n), n)
        assert point.interval[0] <= point.metric <= point.interval[1]
    def objectives(item: Baseline | FrontPoint) -> tuple[float, float, float | None]:
        return (item.metric, float(item.size), item.latency if timed else None)

    def spreads(item: Baseline | FrontPoint) -> tuple[tuple[float, float] | None, ...]:
        return item.latency_ms_interval, item.batch_latency_ms_interval

    references = (front.fp32, *front.uniform.values())
    baselines = [objectives(b) for b in references]
    flags = dominated_flags(  # the baselines are candidates of the front; timed latencies
        [objectives(p) for p in front.points], higher_is_better=True,  # count measurably
        by=baselines, spreads=([spreads(p) for p in front.points],
                               [spreads(b) for b in references]) if timed else None)
    assert tuple(p.dominated for p in front.points) == flags
    shown = {f"point {p.index}" for p in front.shown}  # else tied with the one point shown
    assert tuple(not p.shown for p in front.points) == tuple(
        flag or p.beaten_by in shown for flag, p in zip(flags, front.points, strict=True))
    spec = load_spec(run.spec_yaml)  # the run directory's spec reads back as the same spec
    assert dataclasses.replace(spec, path=None) == with_objectives(_spec())


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "searches").glob("*.yaml")
              if "task: language-model" not in p.read_text()), ids=lambda p: p.stem)
def test_spec_to_yaml_round_trips(path: Path, tmp_path: Path) -> None:
    spec = load_spec(path)
    copy = tmp_path / "copy.yaml"
    copy.write_text(spec.to_yaml())
    assert dataclasses.replace(load_spec(copy), path=None) == dataclasses.replace(spec, path=None)


def test_spec_fingerprint_keeps_the_flat_names() -> None:
    """A study's spec fingerprint digests the settings a search depends on under their flat
    names (a section's as ``_FLAT_NAMES`` spells them), so a study's journal written by the
    flat spec resumes."""
    from mpsearch.pipeline._prepare import _digest
    from mpsearch.pipeline._search import _spec_fingerprint

    spec = _spec(max_size_bytes=10**6, memory_budget=False, cle=True, patience=5, trials=99)
    flat = {"metric": "accuracy", "objectives": (), "calibration_samples": 64,
            "held_out": 0.5, "data_seed": 0, "min_metric": None, "max_metric_drop": None,
            "max_size_bytes": 10**6, "use_memory_budget": False, "patience": 5,
            "method": "minmax", "batch_size": 64, "threads": spec.evaluation.threads,
            "formats": None, "sensitivity_limit": 64, "chunks": 4, "search_score": "auto",
            "seeding": True, "cle": True, "bias_correction": None, "gptq": None,
            "smoothquant": None, "smoothquant_alpha": 0.5, "verify": "none"}
    assert _spec_fingerprint(spec) == _digest(flat)
    assert _spec_fingerprint(spec.with_overrides(trials=5, seed=3)) == _digest(flat)


def test_time_budget_ends_the_search_with_a_saved_front(tmp_path: Path) -> None:
    run = search_run(_spec(trials=10_000, timeout_s=4.0, analysis=False), tmp_path / "run")
    complete = [r for r in run.result.trials if r.state in ("complete", "pruned")]
    assert 0 < len(complete) < 10_000
    saved = RunDir(run.run_dir).read_front()
    assert saved.points and saved == run.front


def test_patience_ends_the_search_when_the_front_stops_moving(tmp_path: Path) -> None:
    """budget.patience: the search stops as soon as that many finished trials in a row, after
    the last seed, found nothing an earlier trial did not match within one sample of the
    metric (accuracy) and 0.5 % of size; front.json says so, and a resume runs no more
    trials."""
    # metric and size: the rule below leaves out latency (the default where it is timed)
    spec = _spec(trials=500, patience=4, analysis=False, objectives=("metric", "size"))
    run = search_run(spec, tmp_path / "run")
    trials = sorted(run.result.trials, key=lambda r: r.trial)
    assert 4 < len(trials) < 500
    samples = max(int(key.rpartition("@")[2]) for key in run.measured
                  if key.rpartition("@")[2].isdigit())  # the search split

    def moves(index: int) -> bool:
        new = trials[index]
        return new.state == "complete" and not any(
            old.state == "complete" and old.score >= new.score - 1 / samples
            and old.size <= 1.005 * new.size for old in trials[:index])

    moved = max(i for i in range(len(trials)) if moves(i))
    seeds = max(i for i, r in enumerate(trials) if r.source not in ("sampler", "front neighbour"))
    assert len(trials) - 1 - max(moved, seeds) == 4  # stopped at the first trial it could
    assert run.front.stopped == (f"the front did not change in the last 4 trials: stopped "
                                 f"after {len(trials)} trials (budget.patience 4; set 0 to run "
                                 "every trial)")
    assert RunDir(run.run_dir).read_front().stopped == run.front.stopped
    resumed = search_run(spec, tmp_path / "run", resume=True)
    assert len(resumed.result.trials) == len(trials)
    assert resumed.front.stopped == run.front.stopped


def test_max_metric_drop_binds_a_lower_is_better_metric(tmp_path: Path) -> None:
    """mse: FP32 scores 0; a drop of 1e-4 admits only points within 1e-4 of it."""
    run = search_run(_spec(metric="mse", max_metric_drop=1e-4, trials=8, analysis=False),
                     tmp_path / "run")
    assert run.front.fp32.metric == 0.0 and run.front.higher_is_better is False
    searched = [r for r in run.result.trials if r.metric is not None]
    assert any(r.metric > 1e-4 for r in searched)  # uniform INT8 is worse than that
    assert run.front.points
    assert all(p.search_metric is not None and p.search_metric <= 1e-4
               for p in run.front.points)
    for point in run.front.points:  # mse: a bootstrap interval over the held-out samples
        assert point.interval is not None and point.interval[0] <= point.interval[1]
        if point.metric == 0.0:  # the FP32 model itself: every resample scores 0
            assert point.interval == (0.0, 0.0)
        else:
            assert point.interval[0] < point.metric < point.interval[1]


def test_a_user_metric_marked_as_a_proportion_gets_wilson_intervals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user metric that returns the share of samples that pass (``fn.proportion = True``,
    as the corpus's ``*_share`` metrics) is a k-of-n count: Wilson intervals, as accuracy's,
    not a bootstrap that cannot widen past n of n."""
    (tmp_path / "share_metrics.py").write_text(
        "import numpy as np\n"
        "def kept(outputs, reference, labels):\n"
        "    return float(np.mean(outputs.argmax(1) == reference.argmax(1)))\n"
        "kept.proportion = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = search_run(_spec(metric="share_metrics:kept", trials=6, analysis=False),
                     tmp_path / "run")
    held = json.loads(RunDir(run.run_dir).measurements.read_text())["splits"]["held-out"]
    (n,) = {entry["samples"] for entry in held["entries"].values() if "metrics" in entry}
    assert run.front.points
    for point in run.front.points:
        assert point.interval == wilson_interval(round(point.metric * n), n)
    fp32_like = [p for p in run.front.points if p.metric == 1.0]
    assert all(p.interval is not None and p.interval[0] < 1.0 for p in fp32_like)
    sys.modules.pop("share_metrics", None)


def _study(run_dir: Path) -> optuna.Study:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(run_dir / "study.journal")))
    return optuna.load_study(study_name="mpsearch", storage=storage)


def test_resume_with_other_inputs_is_refused_before_writing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    search_run(_spec(trials=3, analysis=False), run_dir)
    spec_text = (run_dir / "spec.yaml").read_text()
    with pytest.raises(SearchError, match=r"made from other inputs \(changed: spec\)"):
        search_run(_spec(trials=6, analysis=False, metric="agreement"), run_dir, resume=True)
    assert (run_dir / "spec.yaml").read_text() == spec_text  # nothing rewritten
    more = search_run(_spec(trials=5, analysis=False), run_dir, resume=True)  # same inputs
    assert len([r for r in more.result.trials if r.state in ("complete", "pruned")]) == 5


def test_interrupted_trial_and_torn_journal_line_are_recovered(tmp_path: Path) -> None:
    """A trial left RUNNING by a killed worker is failed and its configuration retried; a
    record cut off mid-write is dropped; the study ends with exactly the budgeted trials."""
    run_dir = tmp_path / "run"
    search_run(_spec(trials=3, analysis=False), run_dir)
    study = _study(run_dir)
    finished = [t for t in study.trials if t.state.is_finished()]
    cut = study.ask(fixed_distributions=finished[0].distributions)  # a worker dies in it
    with (run_dir / "study.journal").open("a") as f:
        f.write('{"op_code": 5, "worker_id": "dead", "trial_id": 9')  # the disk filled up
    resumed = search_run(_spec(trials=5, analysis=False), run_dir, resume=True)
    trials = _study(run_dir).trials
    assert trials[cut.number].state == optuna.trial.TrialState.FAIL
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    states = [r.state for r in resumed.result.trials]
    assert states.count("complete") + states.count("pruned") == 5
    retry = [t for t in trials
             if t.user_attrs.get("source") == f"retry of interrupted trial {cut.number}"]
    assert len(retry) == 1  # queued behind the seeds still waiting


def test_recovery_runs_through_search_and_export(tmp_path: Path) -> None:
    """recovery: {cle, bias_correction, gptq, smoothquant} reaches the run's spec, keys its
    measurements and makes the exported model the corrected build: only integer codes differ
    from plain (GPTQ's weight codes, the corrected int32 biases), every scale and zero point
    is the plain builder's (the demo model has no LayerNorm, so smoothing changes nothing)."""
    spec = _spec(trials=4, analysis=False, cle=True, bias_correction=True, gptq=True,
                 smoothquant=True, smoothquant_alpha=0.75)
    run = search_run(spec, tmp_path / "run")
    rundir = RunDir(run.run_dir)
    saved = load_spec(rundir.spec_yaml).recovery
    assert (saved.cle, saved.bias_correction, saved.gptq, saved.smoothquant) == (True,) * 4
    assert saved.smoothquant_alpha == 0.75
    splits = json.loads(rundir.measurements.read_text())["splits"]
    assert splits["search"]["key"]["bias_correction"] is True
    assert splits["search"]["key"]["gptq"] is True
    built = export_point(run.run_dir, 0, tmp_path / "point.onnx")
    ours = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(built.path)).graph.initializer}
    plain = prepare_inputs(spec.model, spec.profile, spec.data.source,
                           calibration_samples=spec.data.calibration, seed=spec.data.seed,
                           cle=True).quantizer.build(built.assignment)
    reference = {t.name: numpy_helper.to_array(t) for t in plain.graph.initializer}
    assert ours.keys() == reference.keys()
    differ = sorted(n for n in ours if not np.array_equal(ours[n], reference[n]))
    assert all(n.endswith("_q") for n in differ)
    biases = [n for n in differ if n.endswith("__i32_q")]
    assert biases and len(biases) < len(differ)  # weight codes moved too


def test_sqnr_racing_slack_is_calibrated_on_the_model_s_completed_trials() -> None:
    """Racing by SQNR: until ten completed trials passed a stage the slack is the fixed
    3 dB * sqrt(32 / n); then 1.5 times the largest rise from that stage to the final score
    they showed (at least 0.5 dB), each rise the difference of two real measurements."""
    from mpsearch.analysis import Measurer
    from mpsearch.pipeline import prepare
    from mpsearch.pipeline._search import _search_settings
    from mpsearch.search._race import sqnr_slack
    from mpsearch.search._score import score
    from mpsearch.search._study import _Objective

    spec = _spec(metric="agreement", chunks=4)
    prepared = prepare(spec)
    search_split = prepared.validation.take(128)
    measurer = Measurer(prepared.quantizer, search_split, metric="agreement")
    groups = group_nodes(prepared.graph, prepared.profile)
    objective = _Objective(measurer, prepared.summary, _search_settings(spec), groups, None,
                           None)
    assert objective.by_sqnr
    gains = objective.gains
    assert sqnr_slack(32, gains) == 3.0 and sqnr_slack(64, gains) == 3.0 * math.sqrt(0.5)
    rng = np.random.default_rng(0)
    rises: dict[int, list[float]] = {32: [], 64: []}
    for count in range(10):
        choice = {g.name: int(rng.integers(len(g.formats))) for g in groups}
        formats = objective.assignment(choice)
        stages = {n: score(measurer.measure(formats, samples=n), higher=objective.higher,
                           by_sqnr=objective.by_sqnr) for n in (32, 64)}
        result = measurer.measure(formats)
        final = score(result, higher=objective.higher, by_sqnr=objective.by_sqnr)
        objective.record_gains(formats, result)
        for n, stage in stages.items():
            rises[n].append(final - stage)
        if count < 9:  # not calibrated yet
            assert sqnr_slack(32, gains) == 3.0
    assert objective.gains == rises
    for n in (32, 64):
        assert sqnr_slack(n, gains) == max(0.5, 1.5 * max(rises[n]))
    assert len({round(r, 6) for r in rises[32]}) > 1  # real, differing measurements
