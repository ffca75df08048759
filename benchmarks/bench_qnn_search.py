"""The shipped search specs under ``qnn_htp`` with the HTP emulator in the loop: does every
front point score on the emulator as it scores in ONNX Runtime's CPU EP?

Each of ``searches/*.yaml`` (the demo and the fixtures) is searched with ``profile: qnn_htp``,
objectives metric and size and ``--trials`` trials; the demo with ``verify: toolchain`` (a
configuration that would not run fully on the HTP is infeasible), the fixtures with
``verify: front`` (every front point compiled and re-measured on the emulator). Per search: the
front points, the largest |emulator - ORT| held-out metric over them, and the nodes that fall
back to the CPU with the QNN execution provider's reason.

    python -m benchmarks.bench_qnn_search [--trials 30] [--no-write]

``--corpus KEY`` instead times one corpus model's search (``mpsearch.testing.corpus``, e.g.
``magika``, the 1-D CNN) under ``qnn_htp`` with ``verify: front`` and ``--target-samples N``
(``evaluation.target_samples``; default the spec's, ``auto``): wall and CPU seconds of the
whole run and of its ``verify`` stage, the shown points, how many the target rejected and the
largest |target - ORT| on the same samples. Written to ``bench_qnn_search_corpus.md``.

    python -m benchmarks.bench_qnn_search --corpus magika --target-samples 32
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks._results import publish
from mpsearch.pipeline import search_run
from mpsearch.progress import Progress
from mpsearch.rundir import Front, FrontPoint
from mpsearch.spec import load_spec
from mpsearch.testing.corpus import write_search

SEARCHES = Path(__file__).resolve().parent.parent / "searches"


def _fallbacks(front: Front) -> str:
    """The CPU nodes of every point, counted by the toolchain's reason."""
    reasons: Counter[str] = Counter()
    failed = []
    for point in front.points:
        placement = point.target_placement or {}
        if placement.get("error"):
            failed.append(f"point {point.index}: {placement['error'][:120]}")
        for node in placement.get("fallback", ()):
            reasons[str(node.get("reason", ""))[:100]] += 1
    parts = [f"{n} x {reason}" for reason, n in reasons.most_common()] + failed
    return "; ".join(parts) or "none"


def row(name: str, trials: int, out: Path) -> str:
    spec = load_spec(SEARCHES / f"{name}.yaml")
    spec = dataclasses.replace(
        spec, profile="qnn_htp", objectives=("metric", "size"),
        verify="toolchain" if name == "demo" else "front",
        budget=dataclasses.replace(spec.budget, trials=trials))
    front = search_run(spec, out / name).front
    measured = [(p.metric, p.target_metric) for p in front.points
                if p.target_metric is not None]
    worst = max((abs(target - ort) for ort, target in measured), default=float("nan"))
    metrics = sorted({f"{ort:.4f}" for ort, _ in measured})
    return (f"| {name} (`verify: {spec.verify}`) | {len(front.points)} | {len(measured)} | "
            f"{worst:.4f} | {', '.join(metrics)} | {_fallbacks(front)} |")


class _Stages:
    """When each progress stage was first and last heard from (wall seconds)."""

    def __init__(self) -> None:
        self.seen: dict[str, list[float]] = {}

    def __call__(self, progress: Progress) -> None:
        now = time.perf_counter()
        self.seen.setdefault(progress.stage, [now, now])[1] = now

    def seconds(self, stage: str) -> float:
        first, last = self.seen.get(stage, [0.0, 0.0])
        return last - first


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _ort(point: FrontPoint) -> float:
    """ONNX Runtime's metric on the samples the target ran (all held-out ones, or fewer)."""
    ort = (point.target_placement or {}).get("ort_metric")
    return point.metric if ort is None else float(ort)


def corpus_row(key: str, trials: int, samples: int | None, out: Path) -> str:
    """One corpus model searched under qnn_htp with ``verify: front``, timed."""
    spec = load_spec(write_search(key, out / key, trials))
    spec = dataclasses.replace(spec, profile="qnn_htp", verify="front")
    if samples is not None:
        spec = dataclasses.replace(
            spec, evaluation=dataclasses.replace(spec.evaluation, target_samples=samples))
    stages, load = _Stages(), os.getloadavg()[0]
    start, cpu = time.perf_counter(), _cpu_seconds()
    front = search_run(spec, out / key / "run", progress=stages).front
    wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    shown = front.shown
    diffs = [abs(p.target_metric - _ort(p)) for p in shown if p.target_metric is not None]
    failed = [f"{p.index}: {p.target_failure}" for p in shown if p.target_failure]
    return (f"| {key} | {trials} | {samples or 'auto'} | {len(shown)} | "
            f"{max(diffs, default=float('nan')):.4f} | {'; '.join(failed) or 'none'} | "
            f"{stages.seconds('verify'):.0f} | {wall:.0f} | {cpu:.0f} | {load:.1f} |")


def corpus(args: argparse.Namespace) -> None:
    lines = ["| model | trials | target samples | shown points | largest abs(target - ORT) | "
             "rejected by the target | verify stage s | whole run s | CPU s | load average "
             "at start |", "|---|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        lines.append(corpus_row(args.corpus, args.trials, args.target_samples, Path(tmp)))
    print(lines[-1], flush=True)
    publish("bench_qnn_search_corpus", "# A corpus model under qnn_htp, verify: front\n\n"
            f"`{args.corpus}` searched with `profile: qnn_htp`, `verify: front`, {args.trials} "
            "trials, the rest of its corpus spec as written (`write_search`); the HTP "
            "emulator runs the first `target samples` held-out samples of each shown point "
            "(ORT on the same samples). Wall seconds on a machine shared with other jobs: the "
            "load average is given.\n\n" + "\n".join(lines) + "\n", not args.no_write,
            echo=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--no-write", action="store_true",
                        help="print only; do not write benchmarks/results/bench_qnn_search.md")
    parser.add_argument("--corpus", metavar="KEY", help="time one corpus model instead")
    parser.add_argument("--target-samples", type=int, default=None)
    args = parser.parse_args()
    if args.corpus:
        corpus(args)
        return
    names = sorted(p.stem for p in SEARCHES.glob("*.yaml"))
    lines = ["| search | front points | measured on the emulator | largest abs(emulator - ORT) | "
             "ORT held-out metrics | nodes on the CPU (count x the EP's reason) |",
             "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            lines.append(row(name, args.trials, Path(tmp)))
            print(lines[-1], flush=True)
    publish("bench_qnn_search", "# qnn_htp searches with the HTP emulator in the loop\n\n"
            f"Shipped specs under `qnn_htp`, {args.trials} trials, objectives metric and size; "
            "held-out metric of every front point in ONNX Runtime's CPU EP and on "
            "onnxruntime-qnn's HTP emulator (the profile's `htp_arch` and `soc_model`).\n\n"
            + "\n".join(lines) + "\n", not args.no_write, echo=False)


if __name__ == "__main__":
    main()
