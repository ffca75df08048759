"""mpsearch's QDQ builder side by side with ``onnxruntime.quantization.quantize_static``.

For each model (the fixture zoo on its held-out digits, the generated random-weight ResNet-18
and MobileNetV2 of :mod:`mpsearch.testing.architectures` and the real ImageNet MobileNetV2 /
EfficientNet-Lite0 of ``benchmarks/real_models.py`` on the bundled photos) it measures

(a) uniform INT8 quality: accuracy (labelled data) or top-1 agreement with FP32 (photos), ours
    versus ORT's, on the same validation split;
(b) throughput on ORT CPU relative to FP32 (2 intra-op threads, batch 1 and 8; warm-up, then the
    median of interleaved timing rounds, so background load hits every model alike);
(c) per-configuration overhead. Ours: ``Quantizer.build(assignment)`` + serialize + create the
    session, for uniform INT8 and seeded random mixed INT8/INT16/FP32 assignments (the weight
    cache warm, as in a search; the cold first build is shown too). ORT: ``quantize_static`` +
    create the session, which re-runs its calibration every time: that is the point, ours never
    re-calibrates (``prepare`` calibrates once; its time is reported separately).

Both sides see the same calibration samples (the seeded split of ``mpsearch.pipeline.prepare``)
and the MinMax range method. ORT: QDQ, QUInt8 activations, QInt8 per-channel weights, and
``quant_pre_process`` run once per model first (shape inference + ORT graph optimization), the
step ORT's quantization docs and examples recommend before ``quantize_static``; it is a one-time
model step, so it is not counted in ORT's per-configuration time. Each table row also counts
the QuantizeLinear/DequantizeLinear left in ORT's *optimized* session graph
(``SessionOptions.optimized_model_filepath``) for ours and ORT's model: a left-over pair is a
float round trip between integer kernels that the ORT fusions could not remove.

Run from the repository root::

    .venv/bin/python -m benchmarks.bench_quantize

``--models resnet18,mobilenetv2_imagenet`` runs a subset; ``--no-write`` skips updating the
``benchmarks/results/bench_quantize.md``; ``--profile`` prints a cProfile summary
of our warm per-configuration builds of the first model.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import os
import platform
import pstats
import re
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quant_pre_process,
    quantize_static,
)

from benchmarks._results import publish
from mpsearch.assignment import make_assignment, uniform_assignment
from mpsearch.evaluate import Evaluator
from mpsearch.graph import ModelGraph
from mpsearch.pipeline import Prepared, prepare_inputs
from mpsearch.quantize import Quantizer
from mpsearch.runtime import Session, create_session
from mpsearch.testing import architectures

ROOT = Path(__file__).resolve().parents[1]

LOG = logging.getLogger("bench_quantize")

BENCH = ROOT / "benchmarks"
FIXTURES = ROOT / "tests" / "fixtures"
SECTION = "## Quantize"
PROFILE = "x86_ort"
METHOD = "minmax"
THREADS = 2
SEED = 0
BATCHES = (1, 8)
MIXED_CONFIGS = 8
TIMING_ROUNDS = 15
ROUND_SECONDS = 0.05  # a timing round repeats a run until about this long
GOAL_SPEEDUP = 3.0  # (b) ResNet-18 uniform INT8 vs FP32
GOAL_OVERHEAD_S = 0.3  # (c) per configuration, ResNet-18
GOAL_OVERHEAD_RATIO = 10.0  # (c) x faster than quantize_static per configuration
ZOO = ("resnet", "mobilenetv2", "efficientnet", "squeezenet", "shufflenet", "transformer",
       "sensitive")


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    name: str
    group: str
    model: Path | Callable[[], onnx.ModelProto]
    data: Path
    calibration_samples: int
    validation_samples: int | None = None  # cap, to keep the run short


@dataclass(slots=True, kw_only=True)
class Row:
    """One model's measurements (filled stage by stage, printed at the end)."""

    name: str
    group: str
    metric: str = ""
    n_calib: int = 0
    n_valid: int = 0
    fp32: float = float("nan")
    ours: float = float("nan")
    ort: float = float("nan")
    speed: dict[int, tuple[float, float, float]] = field(default_factory=dict)  # fp32/ours/ort s
    calibrate_s: float = float("nan")
    preprocess_s: float = float("nan")
    cold_s: float = float("nan")
    warm_s: tuple[float, ...] = ()
    phases_s: tuple[float, float, float] = (float("nan"),) * 3  # build, serialize, session
    ort_session_s: float = float("nan")  # creating a session of ORT's INT8 model alone
    ort_config_s: float = float("nan")
    leftover: dict[str, Counter[str]] = field(default_factory=dict)  # side -> op counts
    round_trips: dict[str, Counter[str]] = field(default_factory=dict)  # side -> DQ->Q patterns
    note: str = ""

    @property
    def warm_median(self) -> float:
        return statistics.median(self.warm_s) if self.warm_s else float("nan")

    def ratio(self, batch: int, side: int) -> float:
        times = self.speed.get(batch)
        return times[0] / times[side] if times else float("nan")


# ------------------------------------------------------------------------------ models and data
def cases(work: Path) -> list[Case]:
    """Every benchmark model with its data (building the real models when missing)."""
    out = [Case(name=n, group="zoo", model=FIXTURES / f"{n}.onnx",
                data=FIXTURES / "digits_eval.npz", calibration_samples=200) for n in ZOO]
    from benchmarks import real_models

    paths: dict[str, Path] = real_models.ensure_real_models()
    for name in ("resnet18", "mobilenetv2"):
        out.append(Case(name=f"{name} (random)", group="generated",
                        model=getattr(architectures, name), data=paths["photos"],
                        calibration_samples=64, validation_samples=256))
    for name, calib in (("mobilenetv2_imagenet", 128), ("efficientnet_lite0", 64)):
        out.append(Case(name=name, group="real", model=paths[name], data=paths["photos"],
                        calibration_samples=calib))
    return out


def _model_path(case: Case, work: Path) -> Path:
    if isinstance(case.model, Path):
        return case.model
    slug = re.sub(r"\W+", "_", case.name).strip("_")
    path = work / f"{slug}.onnx"
    onnx.save(case.model(), path)
    return path


class CalibrationReader(CalibrationDataReader):  # type: ignore[misc]
    """Feeds ORT's calibrator the same calibration samples our ``prepare`` used."""

    def __init__(self, prepared: Prepared) -> None:
        self._feeds = list(prepared.calibration.batches(16))
        self._it: Iterator[Mapping[str, np.ndarray]] = iter(self._feeds)

    def get_next(self) -> Mapping[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self._feeds)


# ------------------------------------------------------------------------------ measurements
def ort_quantize(source: Path, prepared: Prepared, work: Path) -> tuple[Path, float]:
    """ORT's uniform INT8 QDQ model and the seconds quantize_static + session took."""
    target = work / f"{source.stem}.ort_int8.onnx"
    start = time.perf_counter()
    quantize_static(str(source), str(target), CalibrationReader(prepared),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=True,
                    calibrate_method=CalibrationMethod.MinMax)
    create_session(target, threads=THREADS)
    return target, time.perf_counter() - start


def random_assignments(prepared: Prepared, count: int, seed: int) -> list[Mapping[str, str]]:
    """Seeded mixed assignments: every node draws one of the formats the profile allows."""
    rng = np.random.default_rng(seed)
    graph, profile = prepared.graph, prepared.profile
    out = []
    for _ in range(count):
        formats = {}
        for node in graph.nodes.values():
            allowed = profile.formats_for_node(node)
            formats[node.name] = str(allowed[int(rng.integers(len(allowed)))])
        out.append(make_assignment(graph, profile, formats))
    return out


def ours_overhead(prepared: Prepared, row: Row) -> tuple[Quantizer, onnx.ModelProto]:
    """Cold build of uniform INT8, then warm build + serialize + session for every config."""
    quantizer = Quantizer(prepared.graph, prepared.table, prepared.profile, method=METHOD)
    uniform = uniform_assignment(prepared.graph, prepared.profile, "int8")
    start = time.perf_counter()
    model = quantizer.build(uniform)
    create_session(model.SerializeToString(), threads=THREADS)
    row.cold_s = time.perf_counter() - start
    phases = []
    for assignment in [uniform, *random_assignments(prepared, MIXED_CONFIGS, SEED)]:
        t0 = time.perf_counter()
        built = quantizer.build(assignment)
        t1 = time.perf_counter()
        payload = built.SerializeToString()
        t2 = time.perf_counter()
        create_session(payload, threads=THREADS)
        phases.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    row.warm_s = tuple(sum(p) for p in phases)
    build, serialize, session = zip(*phases, strict=True)
    row.phases_s = (statistics.median(build), statistics.median(serialize),
                    statistics.median(session))
    return quantizer, model


def session_seconds(model: Path, repeat: int = 3) -> float:
    """Median seconds to create a session of ``model`` (the floor any builder pays)."""
    payload = model.read_bytes()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        create_session(payload, threads=THREADS)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_sessions(sessions: Mapping[str, Session], feeds: Mapping[str, np.ndarray]) -> list[float]:
    """Median seconds per run of each session: warm-up, then interleaved timing rounds."""
    runs: dict[str, int] = {}
    for name, session in sessions.items():
        session.run(feeds)
        start = time.perf_counter()
        session.run(feeds)
        runs[name] = max(1, int(ROUND_SECONDS / max(time.perf_counter() - start, 1e-6)))
    samples: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(TIMING_ROUNDS):
        for name, session in sessions.items():
            start = time.perf_counter()
            for _ in range(runs[name]):
                session.run(feeds)
            samples[name].append((time.perf_counter() - start) / runs[name])
    return [statistics.median(samples[name]) for name in sessions]


def throughput(prepared: Prepared, models: Mapping[str, Any], row: Row) -> None:
    sessions = {name: create_session(m, threads=THREADS, label=name)
                for name, m in models.items()}
    for batch in BATCHES:
        feeds = next(iter(prepared.validation.batches(batch)))
        if len(next(iter(feeds.values()))) != batch:
            continue
        fp32, ours, theirs = time_sessions(sessions, feeds)
        row.speed[batch] = (fp32, ours, theirs)


def optimized_graph(
    model: onnx.ModelProto | Path, work: Path, tag: str, graph: ModelGraph
) -> tuple[Counter[str], Counter[str]]:
    """Op counts of ORT's optimized session graph (what actually runs) and its float round
    trips: every DequantizeLinear -> QuantizeLinear chain, named by the ops around it and the
    FP32 op whose output the QuantizeLinear quantizes (``producer -> DQ -> Q(op output) ->
    consumer``)."""
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(work / f"{tag}.optimized.onnx")
    ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    nodes = list(onnx.load(options.optimized_model_filepath).graph.node)
    producer = {t: n for n in nodes for t in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for t in n.input:
            consumers.setdefault(t, []).append(n)
    trips: Counter[str] = Counter()
    for dq in (n for n in nodes if n.op_type == "DequantizeLinear"):
        before = producer.get(dq.input[0])
        for q in (c for c in consumers.get(dq.output[0], []) if c.op_type == "QuantizeLinear"):
            after = {c.op_type for c in consumers.get(q.output[0], [])} or {"output"}
            writes = _op_of(q.name, graph)
            trips[f"{before.op_type if before else 'input'} -> DQ -> Q({writes} output) -> "
                  f"{'/'.join(sorted(after))}"] += 1
    return Counter(n.op_type for n in nodes), trips


def _op_of(q_name: str, graph: ModelGraph) -> str:
    """FP32 op type producing the tensor a QuantizeLinear node quantizes, from the node's name
    (ours: ``<tensor>__<tag>_Q``; ORT: ``<tensor>_QuantizeLinear``)."""
    tensor = re.sub(r"(__[^_].*|_QuantizeLinear)$", "", q_name)
    producer = graph.producer(tensor)
    if producer is not None:
        return graph.nodes[producer].op_type
    return "input" if tensor in {t.name for t in graph.inputs} else "?"


def run_case(case: Case, work: Path, *, profile_build: bool) -> Row:
    row = Row(name=case.name, group=case.group)
    source = _model_path(case, work)
    start = time.perf_counter()
    prepared = prepare_inputs(source, PROFILE, case.data,
                              calibration_samples=case.calibration_samples, method=METHOD,
                              seed=SEED, threads=THREADS)
    row.calibrate_s = time.perf_counter() - start
    if case.validation_samples is not None:
        prepared = replace(prepared, validation=prepared.validation.take(case.validation_samples))
    row.n_calib, row.n_valid = len(prepared.calibration), len(prepared.validation)
    quantizer, ours_model = ours_overhead(prepared, row)
    if profile_build:
        print_profile(quantizer, prepared)
    pre = work / f"{source.stem}.pre.onnx"
    start = time.perf_counter()
    quant_pre_process(str(source), str(pre))
    row.preprocess_s = time.perf_counter() - start
    ort_model, row.ort_config_s = ort_quantize(pre, prepared, work)
    row.ort_session_s = session_seconds(ort_model)
    evaluator = Evaluator(prepared.graph, prepared.validation, threads=THREADS)
    row.metric = evaluator.primary.name
    row.fp32 = evaluator.fp32().value
    row.ours = evaluator.evaluate(ours_model).value
    row.ort = evaluator.evaluate(ort_model.read_bytes()).value
    if case.group != "zoo":  # 16x16 toy nets: sub-millisecond runs, ratios are noise
        throughput(prepared, {"fp32": prepared.graph.model, "ours": ours_model,
                              "ort": ort_model.read_bytes()}, row)
    for side, model in (("ours", ours_model), ("ort", ort_model)):
        row.leftover[side], row.round_trips[side] = optimized_graph(
            model, work, f"{source.stem}.{side}", prepared.graph)
    return row


def print_profile(quantizer: Quantizer, prepared: Prepared) -> None:
    """cProfile of warm builds + serialize + session (what a search pays per configuration)."""
    configs = random_assignments(prepared, MIXED_CONFIGS, SEED + 1)
    for assignment in configs:  # warm the weight cache for these formats first
        quantizer.build(assignment)
    profiler = cProfile.Profile()
    profiler.enable()
    for assignment in configs:
        create_session(quantizer.build(assignment).SerializeToString(), threads=THREADS)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
    print(text.getvalue())


# ------------------------------------------------------------------------------ report
def _f(value: float, digits: int = 3) -> str:
    return "n/a" if value != value else f"{value:.{digits}f}"


def _x(ratio: float) -> str:
    return "-" if ratio != ratio else f"{ratio:.2f}x"


def table(rows: list[Row]) -> str:
    head = ("| model | metric (N calib / N valid) | FP32 | ours INT8 | ORT INT8 "
            "| speed-up b1 ours / ORT | speed-up b8 ours / ORT "
            "| per-config ours median (max; cold) | per-config ORT | ORT / ours "
            "| Q+DQ left ours / ORT |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        left = {k: c["QuantizeLinear"] + c["DequantizeLinear"] for k, c in r.leftover.items()}
        lines.append(
            f"| {r.name} | {r.metric} ({r.n_calib}/{r.n_valid}) | {_f(r.fp32)} | {_f(r.ours)} "
            f"| {_f(r.ort)} | {_x(r.ratio(1, 1))} / {_x(r.ratio(1, 2))} "
            f"| {_x(r.ratio(8, 1))} / {_x(r.ratio(8, 2))} "
            f"| {_f(r.warm_median)} s ({_f(max(r.warm_s, default=float('nan')))}; "
            f"{_f(r.cold_s)}) | {_f(r.ort_config_s, 2)} s "
            f"| {_f(r.ort_config_s / r.warm_median, 0)}x "
            f"| {left.get('ours', 0)} / {left.get('ort', 0)} |")
    return "\n".join(lines)


def goals(rows: list[Row]) -> list[str]:
    out = []
    worse = [r for r in rows if r.ours < r.ort]
    out.append("(a) uniform INT8 quality >= ORT's: "
               + ("met on every model" if not worse else "shortfall on " + ", ".join(
                   f"{r.name} ({_f(r.ours)} vs {_f(r.ort)})" for r in worse)))
    r18 = next((r for r in rows if r.name.startswith("resnet18")), None)
    if r18 is None:
        out.append("(b), (c): ResNet-18 (mpsearch/testing/architectures.py) was not in this run")
        return out
    for batch in BATCHES:
        ours, theirs = r18.ratio(batch, 1), r18.ratio(batch, 2)
        verdict = ("met" if ours >= GOAL_SPEEDUP
                   else f"NOT met (shortfall {GOAL_SPEEDUP - ours:.2f}x)")
        out.append(f"(b) ResNet-18 INT8 speed-up vs FP32, batch {batch}: ours {_f(ours, 2)}x, "
                   f"ORT {_f(theirs, 2)}x; goal >= {GOAL_SPEEDUP}x {verdict}")
    overhead, ratio = r18.warm_median, r18.ort_config_s / r18.warm_median
    fast = "met" if overhead <= GOAL_OVERHEAD_S else "NOT met"
    faster = "met" if ratio >= GOAL_OVERHEAD_RATIO else "NOT met"
    build, serialize, session = r18.phases_s
    out.append(f"(c) ResNet-18 per-configuration overhead: ours {_f(overhead)} s (goal <= "
               f"{GOAL_OVERHEAD_S} s: {fast}; build {_f(build)} + serialize {_f(serialize)} + "
               f"session {_f(session)} s, where a session of ORT's own INT8 model takes "
               f"{_f(r18.ort_session_s)} s), {_f(ratio, 1)}x faster than quantize_static + "
               f"session (goal >= {GOAL_OVERHEAD_RATIO:.0f}x: {faster})")
    return out


def diagnosis(rows: list[Row]) -> list[str]:
    """What the optimized graphs say about a gap (each line only when its evidence is there)."""
    out = []
    act = [r.name for r in rows if any(re.search(r"Q\((Relu|Clip) output\)", p)
                                       for p in r.round_trips.get("ours", ()))]
    if act:
        out.append(
            "Relu/Clip after a quantized Conv/Add (" + ", ".join(act) + "): ours quantizes the "
            "Conv/Add output on its own calibrated range (signed, unclipped) and the Relu/Clip "
            "output again on the activation's range. ORT's quantizer (QDQRemovableActivation -> "
            "try_replacing_upstream_output) deletes a Relu/Clip whose input has no other "
            "consumer and quantizes the producer's output directly on the activation's range "
            "(uint8 zero point 0, range <= 6: the Q does the clamping). Ours therefore wastes "
            "grid on values the activation discards (accuracy) and leaves the "
            "DequantizeLinear -> QuantizeLinear round trips listed above, which the ORT "
            "fusions cannot remove because the two scales differ (speed, session time).")
    pads = [r.name for r in rows
            if r.leftover.get("ours", Counter())["Pad"] > r.leftover.get("ort", Counter())["Pad"]]
    if pads:
        out.append(
            "Pad (" + ", ".join(pads) + "): mpsearch fuses only constant zero Pads read by "
            "nothing but Convs (graph load); these Pads are not, so each runs in float between "
            "a DequantizeLinear and a QuantizeLinear.")
    return out


def cpu_description() -> str:
    """Model name, family/model and the int8 dot-product instructions ORT's kernels can use."""
    try:
        info = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return (f"{fields.get('model name', platform.machine())} (family {fields.get('cpu family')} "
            f"model {fields.get('model')}; {', '.join(isa) or 'no AVX2'})")


def environment(start_load: tuple[float, ...]) -> str:
    cpu = cpu_description()
    start, end = (" ".join(f"{x:.1f}" for x in load) for load in (start_load, os.getloadavg()))
    return (f"{cpu}, {os.cpu_count()} cores, onnxruntime {ort.__version__}, onnx "
            f"{onnx.__version__}, Python {platform.python_version()}; load average (1/5/15 min) "
            f"at the start {start}, at the end {end} (the machine is shared with other work: "
            "timings carry that noise)")


def section(
    rows: list[Row], command: str, seconds: float, start_load: tuple[float, ...]
) -> str:
    details = []
    for r in rows:
        ours, theirs = r.leftover.get("ours", Counter()), r.leftover.get("ort", Counter())
        extra = ", ".join(f"{op} {ours[op]} vs {theirs[op]}" for op in sorted(set(ours) |
                          set(theirs)) if ours[op] != theirs[op])
        build, serialize, session = r.phases_s
        details.append(f"- {r.name}: calibrate once {_f(r.calibrate_s, 2)} s; per-config ours "
                       f"= build {_f(build)} + serialize {_f(serialize)} + session "
                       f"{_f(session)} s (medians; a session of ORT's INT8 model alone: "
                       f"{_f(r.ort_session_s)} s); ORT quant_pre_process {_f(r.preprocess_s, 2)}"
                       f" s; optimized-graph ops that differ (ours vs ORT): {extra or 'none'}")
        for side in ("ours", "ort"):
            trips = r.round_trips.get(side, Counter())
            if trips:
                details.append(f"  - {side} float round trips left: " + "; ".join(
                    f"{n} x {pattern}" for pattern, n in trips.most_common()))
    return "\n".join([
        SECTION, "", f"Command: `{command}` ({seconds / 60:.1f} min).", "",
        f"Machine: {environment(start_load)}.", "",
        "Speed-up = FP32 seconds per batch / INT8 seconds per batch on ORT CPU, 2 intra-op "
        f"threads, median of {TIMING_ROUNDS} interleaved rounds after a warm-up. Per-config "
        "ours = Quantizer.build + SerializeToString + create the session, median over uniform "
        f"INT8 and {MIXED_CONFIGS} seeded random mixed INT8/INT16/FP32 assignments with the "
        "weight cache warm (cold = the first build); per-config ORT = quantize_static (which "
        "re-calibrates) + create the session. Same calibration samples and MinMax on both "
        "sides; ORT gets quant_pre_process once per model (its documented recommended step, "
        "not counted per config). Q+DQ left = QuantizeLinear + DequantizeLinear nodes still in "
        "ORT's optimized session graph. The fixture zoo (16x16 toy nets, sub-millisecond runs) "
        "is not timed for speed. The INT8 speed-up is a property of the CPU as much as of "
        "the model: ORT's integer kernels use AVX-512 VNNI or AVX-VNNI where the CPU has "
        "them and AVX2's VPMADDUBSW otherwise, so compare ours with ORT's own quantized model "
        "on the same machine (the Machine line lists the instructions present).", "",
        table(rows), "", *[f"- {g}" for g in goals(rows)], "", *details, "",
        *[f"Diagnosis: {d}\n" for d in diagnosis(rows)],
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", help="comma-separated subset (names as printed)")
    parser.add_argument("--no-write", action="store_true",
                        help="print only; do not write benchmarks/results/bench_quantize.md")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile our warm per-config builds of the first model")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("bench_quantize").setLevel(logging.INFO)
    command = " ".join([".venv/bin/python", "benchmarks/bench_quantize.py",
                        *map(shlex.quote, sys.argv[1:])])
    begin, start_load = time.perf_counter(), os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_quantize.") as tmp:
        work = Path(tmp)
        selected = cases(work)
        if args.models:
            wanted = set(args.models.split(","))
            selected = [c for c in selected if c.name in wanted or c.name.split()[0] in wanted]
        for i, case in enumerate(selected):
            start = time.perf_counter()
            rows.append(run_case(case, work, profile_build=args.profile and i == 0))
            LOG.info("%s done in %.0f s", case.name, time.perf_counter() - start)
    seconds = time.perf_counter() - begin
    text = section(rows, command, seconds, start_load)
    publish("bench_quantize", text, write=not args.no_write)


if __name__ == "__main__":
    main()
