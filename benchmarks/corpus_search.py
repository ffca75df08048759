"""Search corpus models and compare the front's smallest point with ONNX Runtime's INT8.

Usage: ``PYTHONPATH=benchmarks:tests python benchmarks/corpus_search.py KEY... [--trials N]
[--out DIR]``. Per corpus key (``benchmarks/corpus.py``): the corpus search spec
(:func:`corpus.write_search`: 64 calibration, 128 search and 128 held-out samples by
construction, ``max_metric_drop: 0.05``), the whole search, the smallest front point exported
(re-measured on the held-out split), ORT's ``quantize_static`` INT8 and our uniform INT8 built
from the run's calibration split; prints one RESULTS.md row of file sizes and held-out metrics.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import onnx
from corpus import write_search  # benchmarks/ on PYTHONPATH
from ort_baseline import ort_int8  # tests/ on PYTHONPATH

import mpsearch
from mpsearch.pipeline import export_point, prepare, search_run
from mpsearch.spec import load_spec


def search_one(key: str, out: Path, trials: int) -> str:
    """The RESULTS.md row of one corpus model's search (files under ``out``)."""
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
    onnx.save(prepared.quantizer().build(int8), out / "int8.onnx")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("keys", nargs="+", help="corpus keys (benchmarks/corpus.py)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("corpus-searches"))
    args = parser.parse_args()
    print("| model | search metric | wall time | smallest front point (file) | its metric | "
          "ORT INT8 (file) | uniform INT8 metric | uniform INT8 (file) |")
    print("|---|---|---|---|---|---|---|---|")
    for key in args.keys:
        print(search_one(key, args.out / key, args.trials), flush=True)


if __name__ == "__main__":
    main()
