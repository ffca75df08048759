"""The recommendation rule (mpsearch._recommend), the tie collapse and the one latency wording,
on fronts built by hand."""

from __future__ import annotations

from dataclasses import replace

from mpsearch._recommend import Limits, recommend
from mpsearch._results import collapse_ties, judge
from mpsearch.rundir import Baseline, Front, FrontPoint, latency_words

Spread = tuple[float, float] | None
LATENCY = ("metric", "size", "latency")


def _point(index: int, metric: float, size: int, b1: Spread = None, bn: Spread = None,
           counts: dict[str, int] | None = None, half: float = 0.01) -> FrontPoint:
    return FrontPoint(index=index, trial=index, metric=metric, search_metric=metric, size=size,
                      latency=None if b1 is None else sum(b1) / 2, metrics={"accuracy": metric},
                      assignment={}, counts=counts or {"int8": 3}, differs_from_int8=(),
                      source="search", interval=(metric - half, min(1.0, metric + half)),
                      latency_ms=None if b1 is None else sum(b1) / 2, latency_ms_interval=b1,
                      batch_latency_ms=None if bn is None else sum(bn) / 2,
                      batch_latency_ms_interval=bn)


FP32 = Baseline(metric=0.97, size=1000, latency=1.0, latency_ms=1.0,
                latency_ms_interval=(0.9, 1.1), batch_latency_ms=50.0,
                batch_latency_ms_interval=(45.0, 55.0))


def _front(*points: FrontPoint, objectives: tuple[str, ...] = ("metric", "size")) -> Front:
    return Front(metric="accuracy", higher_is_better=True, objectives=objectives,
                 fp32=FP32, uniform={}, points=points, evaluations=1, seconds=1.0,
                 latency_source="measured", latency_batch=64)


def test_smallest_point_whose_interval_meets_the_constraint() -> None:
    front = _front(_point(0, 0.90, 300), _point(1, 0.965, 400), _point(2, 0.97, 600))
    index, line = recommend(front, Limits(max_metric_drop=0.02))
    assert index == 1  # point 0's interval [0.89, 0.91] misses 0.95; point 1's [0.955, ...] meets
    assert line == ("deploy point 1: 400 B (2.5x smaller than FP32), accuracy 0.9650 (-0.0050 "
                    "vs FP32, 95 % CI [0.9550, 0.9750]); latency unknown (latency did not "
                    "count: not one of the objectives); stopped: trial budget used")


def test_latency_wording_at_both_batches_with_the_ratio_spread() -> None:
    slow = _point(0, 0.97, 400, b1=(1.2, 1.4), bn=(60.0, 70.0))
    assert latency_words(slow, FP32, batch=64, source="measured") == (
        "1.30x slower than FP32 [1.09-1.56] at batch 1, 1.30x slower [1.09-1.56] at batch 64")
    quick = _point(0, 0.97, 400, b1=(0.5, 0.6), bn=(20.0, 30.0))
    assert latency_words(quick, FP32, batch=64, source="measured") == (
        "1.82x faster than FP32 [1.50-2.20] at batch 1, 2.00x faster [1.50-2.75] at batch 64")
    one = _point(0, 0.97, 400, b1=(0.95, 1.2), bn=(20.0, 30.0))  # measurable at batch 64 only
    assert latency_words(one, FP32, batch=64, source="measured") == (
        "as fast as FP32 (within the spread) at batch 1, 2.00x faster than FP32 [1.50-2.75] "
        "at batch 64")
    same = _point(0, 0.97, 400, b1=(0.95, 1.2), bn=(50.0, 52.0))
    assert latency_words(same, FP32, batch=64, source="measured") == (
        "as fast as FP32 (within the spread) at batch 1 and at batch 64")
    estimated = replace(_point(0, 0.97, 400), latency=0.5)
    assert latency_words(estimated, FP32, batch=None, source="estimated") == (
        "2.00x faster than FP32 (the profile's estimate)")
    # the same words from front.json's dicts (the report and the web page read those)
    assert latency_words(slow.to_dict(), FP32.to_dict(), batch=64, source="measured") == (
        latency_words(slow, FP32, batch=64, source="measured"))
    # a hidden point a timed front left untimed, and a shown one it could not time
    untimed = _point(0, 0.97, 400)
    assert latency_words(replace(untimed, shown=False), FP32, batch=64,
                         source="measured") == "not timed (hidden)"
    assert latency_words(untimed, FP32, batch=64, source="measured") == "unknown"


def test_latency_decides_nothing_when_it_is_not_an_objective() -> None:
    slow = _point(0, 0.97, 400, b1=(2.0, 2.5), bn=(60.0, 70.0))     # slower at both batches
    quick = _point(1, 0.97, 400, b1=(0.2, 0.3), bn=(15.0, 20.0))
    index, line = recommend(_front(slow, quick), Limits(max_metric_drop=0.02))
    assert index == 0  # the lower index of equals: latency is not an objective
    assert "latency did not count: not one of the objectives" in line
    # judged without latency, the slower point is not hidden either
    judged = judge([slow, quick], {"fp32": FP32}, higher_is_better=True, timed=False)
    assert [p.shown for p in judged] == [True, False]  # quick ties slow in size and metric
    assert judged[1].beaten_by == "point 0" and not judged[1].dominated


def test_a_point_slower_than_fp32_at_every_batch_is_passed_over() -> None:
    slow = _point(0, 0.97, 400, b1=(2.0, 2.5), bn=(60.0, 70.0))     # slower at both batches
    mixed = _point(1, 0.97, 401, b1=(1.2, 1.3), bn=(15.0, 20.0))    # slower at 1, faster at 64
    index, line = recommend(_front(slow, mixed, objectives=LATENCY), Limits(max_metric_drop=0.02))
    assert index == 1
    assert line.endswith("; latency 1.25x slower than FP32 [1.09-1.44] at batch 1, 2.86x "
                         "faster [2.25-3.67] at batch 64; stopped: trial budget used")


def test_only_slow_points_still_get_a_recommendation() -> None:
    slow = _point(0, 0.97, 400, b1=(2.0, 2.5), bn=(60.0, 70.0))
    index, _ = recommend(_front(slow, objectives=LATENCY), Limits(max_metric_drop=0.02))
    assert index == 0


def test_overlapping_spreads_are_not_slower() -> None:
    near = _point(0, 0.97, 400, b1=(1.05, 1.4), bn=(50.0, 60.0))   # overlaps FP32 at both
    quick = _point(1, 0.97, 500, b1=(0.5, 0.6), bn=(20.0, 25.0))
    front = _front(near, quick, objectives=LATENCY)
    assert recommend(front, Limits(max_metric_drop=0.02))[0] == 0


def test_size_ties_go_to_the_point_measurably_faster_at_the_spec_batch() -> None:
    # overlapping at batch 1 (medians 0.40 vs 0.42 decide nothing); b is faster at batch 64
    a = _point(0, 0.97, 400, b1=(0.36, 0.44), bn=(10.0, 12.0), counts={"int16": 3})
    b = _point(1, 0.97, 400, b1=(0.35, 0.49), bn=(4.0, 5.0), counts={"int8": 3})
    front = _front(a, b, objectives=LATENCY)
    assert recommend(front, Limits(max_metric_drop=0.02))[0] == 1
    # noise alone (overlap at both batches): the better metric, then the simpler point
    c = _point(2, 0.97, 400, b1=(0.3, 0.5), bn=(4.5, 11.0), counts={"int8": 2, "int16": 1})
    d = _point(3, 0.97, 400, b1=(0.35, 0.45), bn=(4.0, 12.0), counts={"int16": 3})
    assert recommend(_front(c, d, objectives=LATENCY), Limits(max_metric_drop=0.02))[0] == 3


def test_judge_hides_only_on_measurable_latency() -> None:
    # same metric and size; a is 0.7 % faster by the medians but the spreads overlap
    a = _point(0, 0.95, 400, b1=(0.40, 0.60), bn=(10.0, 12.0), half=0.0)
    b = _point(1, 0.96, 400, b1=(0.41, 0.61), bn=(10.1, 12.1), half=0.0)
    judged = judge([a, b], {"fp32": FP32}, higher_is_better=True, timed=True)
    assert [(p.shown, p.beaten_by) for p in judged] == [(False, "point 1"), (True, None)]
    # c is more accurate but measurably slower at batch 64: both stay, a trade-off
    c = _point(1, 0.96, 400, b1=(0.40, 0.60), bn=(20.0, 22.0), half=0.0)
    judged = judge([a, c], {"fp32": FP32}, higher_is_better=True, timed=True)
    assert [p.shown for p in judged] == [True, True]


def test_ties_collapse_to_one_shown_point() -> None:
    points = [_point(0, 0.950, 10000, counts={"int8": 2, "int16": 2}),
              _point(1, 0.955, 10000, counts={"int16": 4}),
              _point(2, 0.952, 10005, counts={"int8": 1, "int16": 3}),
              _point(3, 0.990, 10000, counts={"int8": 4}),     # outside the others' interval
              _point(4, 0.950, 12000, counts={"int8": 4})]     # beyond the size tie
    out = collapse_ties(points, higher_is_better=True, timed=False)
    assert [(p.index, p.shown, p.beaten_by) for p in out] == [
        (0, False, "point 1"), (1, True, None), (2, False, "point 1"), (3, True, None),
        (4, True, None)]
    for p in out:
        for q in out:
            if p.shown and q.shown and p is not q:
                assert not (max(p.size, q.size) <= min(p.size, q.size) * 1.001
                            and q.interval[0] <= p.metric <= q.interval[1]
                            and p.interval[0] <= q.metric <= p.interval[1])


def test_no_point_meets_the_constraint_keep_fp32() -> None:
    index, line = recommend(_front(_point(0, 0.80, 300)), Limits(max_metric_drop=0.02))
    assert index is None
    assert line == ("keep FP32: nothing quantized meets accuracy >= 0.9500 (FP32: accuracy "
                    "0.9700, 1 kB); stopped: trial budget used")
    _, line = recommend(_front(_point(0, 0.80, 300)),
                        Limits(max_metric_drop=0.02, accelerator=True))
    assert line.startswith("keep FP32 on the CPU: no point that runs on the accelerator meets "
                           "accuracy >= 0.9500")


def test_fp32_as_the_front_point_reads_keep_fp32() -> None:
    fp32_point = _point(1, 0.97, 1000, counts={"fp32": 3})
    index, line = recommend(_front(_point(0, 0.90, 300), fp32_point),
                            Limits(max_metric_drop=0.01))
    assert index == 1
    assert line.startswith("keep FP32: nothing quantized meets accuracy >= 0.9600 (FP32: "
                           "accuracy 0.9700, 1 kB; point 1 is FP32 itself)")
    assert "deploy" not in line and "smaller" not in line


def test_a_point_the_target_rejects_is_never_recommended() -> None:
    good = _point(0, 0.97, 300)
    rejected = replace(_point(1, 0.97, 200), target_failure="qnn: the HTP emulator crashed")
    assert recommend(_front(good, rejected), Limits(max_metric_drop=0.02))[0] == 0
    index, line = recommend(_front(rejected), Limits(max_metric_drop=0.02))
    assert index is None
    assert line == ("no verified point: qnn: the HTP emulator crashed; stopped: trial budget "
                    "used")


def test_a_point_wholly_on_the_cpu_is_no_accelerator_answer() -> None:
    """For an accelerator profile a point its toolchain put wholly on the CPU is passed over;
    when only such points meet the constraint, the answer is FP32 on the CPU."""
    def placed(point: FrontPoint, on: int) -> FrontPoint:
        return replace(point, target_placement={"toolchain": "vela", "nodes": 7,
                                                "on_accelerator": on})
    cpu, npu = placed(_point(0, 0.97, 200), 0), placed(_point(1, 0.97, 300), 7)
    accelerator = Limits(max_metric_drop=0.02, accelerator=True)
    assert recommend(_front(cpu, npu), accelerator)[0] == 1
    assert recommend(_front(cpu, npu), Limits(max_metric_drop=0.02))[0] == 0  # a CPU target
    index, line = recommend(_front(cpu), accelerator)
    assert index is None
    assert line.startswith("keep FP32 on the CPU: no point that runs on the accelerator meets "
                           "accuracy >= 0.9500")


def test_an_fp32_sized_point_the_accelerator_runs_is_deployed() -> None:
    """qnn_htp and rk3588 run float as fp16 on the accelerator: FP32's size is then fp16's,
    and a verified point of that size is deployed there, not "keep FP32 on the CPU"."""
    small = _point(0, 0.90, 300)  # misses accuracy >= 0.95
    fp16 = replace(_point(1, 0.97, 1000, counts={"fp16": 3}),
                   target_placement={"toolchain": "qnn", "nodes": 7, "on_accelerator": 7,
                                     "counts": {"accelerator:fp16": 7}})
    accelerator = Limits(max_metric_drop=0.02, accelerator=True)
    index, line = recommend(_front(small, fp16), accelerator)
    assert index == 1
    assert line.startswith("deploy point 1: 1 kB (1.0x smaller than FP32), accuracy 0.9700")
    keep = "keep FP32 on the CPU: no point that runs on the accelerator meets accuracy >= 0.9500"
    unplaced = replace(fp16, target_placement=None)  # not verified: FP32 itself, as before
    index, line = recommend(_front(small, unplaced), accelerator)
    assert index == 1 and line.startswith(keep)
    # Vela: one int32 node on the NPU, the float ones on the Cortex-M: FP32 on the CPU
    cpu = replace(fp16, target_placement={"toolchain": "vela", "nodes": 7, "on_accelerator": 1,
                                          "counts": {"accelerator:int32": 1, "cpu:fp32": 6}})
    index, line = recommend(_front(small, cpu), accelerator)
    assert index == 1 and line.startswith(keep) and "point 1 is FP32 itself" in line


def test_nothing_within_the_size_limit() -> None:
    index, line = recommend(_front(_point(0, 0.97, 300)), Limits(max_size=200))
    assert index is None
    assert line == ("no recommendation: no shown point meets the constraints (size <= 200 B); "
                    "stopped: trial budget used")
    assert recommend(_front(), Limits())[1] == ("no recommendation: no point is shown; "
                                                "stopped: trial budget used")
