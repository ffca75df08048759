"""Search corpus models and compare the front's smallest point with ONNX Runtime's INT8.

Usage: ``python -m benchmarks.corpus_search KEY... [--trials N]
[--out DIR]``. Per corpus key (``mpsearch/testing/corpus.py``): the corpus search spec
(:func:`corpus.write_search`: 64 calibration, 128 search and 128 held-out samples by
construction, ``max_metric_drop: 0.05``), the whole search, the smallest front point exported
(re-measured on the held-out split), ORT's ``quantize_static`` INT8 and our uniform INT8 built
from the run's calibration split; prints one table row of file sizes and held-out metrics.

``--compare-recovery``: instead, per key, the same search twice, with the default ``recovery:
auto`` and with ``recovery: off``, and their held-out fronts' hypervolumes in one box (metric
up from the lowest of either front and the baselines, size up to 1.01x FP32's), written to
``benchmarks/results/corpus_search.md`` (``--no-write``: printed only), or with ``--part NAME``
to ``corpus_search_NAME.md`` (whole, with the command, commit, CPU int8 instruction set and
onnxruntime version): a run on another set of models regenerates its own table only.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import time
from pathlib import Path

import onnx

import mpsearch
from benchmarks._results import publish
from benchmarks.bench_pipeline import RECOVERIES
from mpsearch.pareto import hypervolume
from mpsearch.pipeline import SearchRun, export_point, prepare, search_run
from mpsearch.rundir import Front
from mpsearch.spec import load_spec
from mpsearch.testing.corpus import write_search
from mpsearch.testing.ort_baseline import ort_int8


def search_one(key: str, out: Path, trials: int) -> str:
    """The table row of one corpus model's search (files under ``out``)."""
    spec = load_spec(write_search(key, out, trials))
    start = time.perf_counter()
    run = search_run(spec, out / "run")
    minutes = (time.perf_counter() - start) / 60
    front = run.front
    smallest = min(front.points, key=lambda p: p.size)
    built = export_point(out / "run", smallest.index, out / "smallest.onnx")
    prepared = prepare(spec)
    onnx.save(prepared.graph.model, out / "fp32.onnx")
    ort_int8(out / "fp32.onnx", out / "ort_int8.onnx", dict(prepared.calibration.inputs))
    int8 = mpsearch.uniform_assignment(prepared.graph, prepared.profile, "int8")
    onnx.save(prepared.quantizer.build(int8), out / "int8.onnx")
    size = {name: (out / f"{name}.onnx").stat().st_size
            for name in ("smallest", "ort_int8", "int8")}
    counts = ", ".join(f"{f} {c}" for f, c in
                       sorted(smallest.counts.items(), key=lambda item: -item[1]))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return (f"| {key} | `{front.metric}` | {minutes:.1f} min, {len(run.result.trials)} trials, "
            f"{rss:.0f} MB peak RSS | {size['smallest']:,} B "
            f"({size['smallest'] / size['ort_int8']:.4f}x), {counts} | {smallest.metric:.3f} "
            f"(export {built.evaluation.value:.3f}) | {size['ort_int8']:,} B | "
            f"{front.uniform['int8'].metric:.3f} | {size['int8']:,} B "
            f"({size['int8'] / size['ort_int8']:.4f}x) |")


def _volumes(auto: Front, off: Front) -> tuple[float, float]:
    points = {k: [(p.metric, float(p.size)) for p in f.points]
              for k, f in (("auto", auto), ("off", off))}
    baselines = [auto.fp32, *auto.uniform.values(), off.fp32, *off.uniform.values()]
    ref_metric = min([m for pts in points.values() for m, _ in pts]
                     + [b.metric for b in baselines]) - 1e-3
    ref_size = 1.01 * auto.fp32.size
    return (hypervolume(points["auto"], ref_metric, ref_size),
            hypervolume(points["off"], ref_metric, ref_size))


def compare_one(key: str, out: Path, trials: int) -> str:
    """One table row: the held-out hypervolumes of ``recovery: auto`` and ``off``."""
    spec = load_spec(write_search(key, out, trials))
    runs: dict[str, tuple[SearchRun, float]] = {}
    for name, settings in (("auto", {}), ("off", RECOVERIES["off"])):
        start = time.perf_counter()
        recovery = dataclasses.replace(spec.recovery, **settings)
        run = search_run(dataclasses.replace(spec, recovery=recovery), out / f"run-{name}")
        runs[name] = (run, (time.perf_counter() - start) / 60)
    auto, off = runs["auto"][0], runs["off"][0]
    mine, theirs = _volumes(auto.front, off.front)
    decision = "-" if auto.recovery is None else auto.recovery.summary()
    verdict = "not below" if mine >= theirs * (1 - 1e-9) else "**below**"
    return (f"| {key} | {auto.front.metric} | {decision} | {mine:.6g} | {theirs:.6g} | "
            f"{mine / theirs if theirs else float('nan'):.4f} | {verdict} | "
            f"{runs['auto'][1]:.1f} / {runs['off'][1]:.1f} min |")


def compare(keys: list[str], out: Path, trials: int, write: bool, part: str) -> None:
    """The comparison table, printed row by row and (``write``) rewritten after each row."""
    lines = ["| model | metric | recovery: auto decided | held-out hypervolume, auto | "
             "same, off | auto / off | auto vs off | wall (auto / off) |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for key in keys:
        lines.append(compare_one(key, out / key, trials))
        print(lines[-1], flush=True)
        publish(f"corpus_search{part}", "# Recovery auto against off, corpus searches\n\n"
                + "\n".join(lines) + "\n", write, echo=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("keys", nargs="+", help="corpus keys (mpsearch/testing/corpus.py)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("corpus-searches"))
    parser.add_argument("--compare-recovery", action="store_true",
                        help="search each key with recovery auto and off; compare hypervolumes")
    parser.add_argument("--no-write", action="store_true",
                        help="with --compare-recovery: print only, do not write "
                             "benchmarks/results/corpus_search.md")
    parser.add_argument("--part", help="write corpus_search_PART.md instead")
    args = parser.parse_args()
    if args.compare_recovery:
        compare(args.keys, args.out, args.trials, not args.no_write,
                f"_{args.part}" if args.part else "")
        return
    print("| model | search metric | wall time | smallest front point (file) | its metric | "
          "ORT INT8 (file) | uniform INT8 metric | uniform INT8 (file) |")
    print("|---|---|---|---|---|---|---|---|")
    for key in args.keys:
        print(search_one(key, args.out / key, args.trials), flush=True)


if __name__ == "__main__":
    main()
