"""The latency clock: identical sessions timed in turn, with ONNX Runtime's thread spinning on
and off.

    python -m benchmarks.bench_clock [--sessions 5] [--no-write]

Opens ``--sessions`` sessions of one model (all the same model, so every honest clock gives
them the same figure) and times them with :func:`mpsearch.clock.time_runs`, as the held-out
front times its points: interleaved, at batch 1 and 64. With the intra-op threads spinning (ONNX
Runtime's default), the pool of the session that just ran keeps the cores busy while the next
runs; mpsearch's sessions do not spin (:func:`mpsearch.runtime.create_session`). The first table
gives, per setting, the spread of the sessions' medians (slowest / fastest: 1.00 is a clock
that tells identical sessions apart by nothing) and the widest run interval. The second times
one session with the input placed at each of the clock's page offsets
(:data:`mpsearch.clock.OFFSETS`), which is why the clock moves the input every round.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks._results import HERE, publish
from mpsearch.clock import OFFSETS, placed_at, time_runs

MODELS = (("resnet fixture", HERE.parent / "tests" / "fixtures" / "resnet.onnx"),
          ("MobileNetV2", HERE / "_models" / "mobilenetv2_imagenet.onnx"))


def _session(path: Path, spinning: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    options.add_session_config_entry("session.intra_op.allow_spinning",
                                     "1" if spinning else "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _median_ms(session: ort.InferenceSession, feeds: dict[str, np.ndarray], calls: int
               ) -> float:
    session.run(None, feeds)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--no-write", action="store_true",
                        help="print only; do not write benchmarks/results/bench_clock.md")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lines = ["## The latency clock: identical sessions timed in turn", "",
             f"{args.sessions} sessions of one model, timed interleaved by "
             "`mpsearch.clock.time_runs`. *median spread*: slowest / fastest of the sessions' "
             "medians (1.00: no difference between identical sessions); *widest run interval*: "
             "the widest slowest-run / fastest-run ratio of one session.", "",
             "| model | batch | spinning | medians, ms | median spread | widest run interval |",
             "|---|---|---|---|---|---|"]
    for label, path in MODELS:
        if not path.exists():
            lines.append(f"| {label} | | | not found: {path.relative_to(HERE.parent)} "
                         "(benchmarks/real_models.py makes it) | | |")
            continue
        model = onnx.load(str(path), load_external_data=False)
        first = model.graph.input[0]
        dims = [d.dim_value or 1 for d in first.type.tensor_type.shape.dim][1:]
        for batch in (1, 64):
            feeds = {first.name: rng.standard_normal((batch, *dims)).astype(np.float32)}
            for spinning in (True, False):
                sessions = [_session(path, spinning) for _ in range(args.sessions)]
                timings = time_runs([partial(s.run, None) for s in sessions], feeds)
                medians = [1e3 * t.seconds for t in timings]
                widest = max(t.high / t.low for t in timings)
                lines.append(f"| {label} | {batch} | {'on' if spinning else 'off'} | "
                             f"{' '.join(f'{m:.3f}' for m in medians)} | "
                             f"{max(medians) / min(medians):.2f} | {widest:.2f} |")
                del sessions
    lines += ["", "## Where the input starts", "",
              "One session (spinning off), the input placed at each offset within a page; "
              "median of 200 calls per offset.", "",
              "| model | batch | median ms by offset | slowest / fastest |", "|---|---|---|---|"]
    for label, path in MODELS:
        if not path.exists():
            continue
        model = onnx.load(str(path), load_external_data=False)
        first = model.graph.input[0]
        dims = [d.dim_value or 1 for d in first.type.tensor_type.shape.dim][1:]
        session = _session(path, spinning=False)
        for batch in (1, 64):
            feeds = {first.name: rng.standard_normal((batch, *dims)).astype(np.float32)}
            medians = [_median_ms(session, placed_at(feeds, offset),
                                  calls=200 if batch == 1 or "fixture" in label else 10)
                       for offset in OFFSETS]
            lines.append(f"| {label} | {batch} | {' '.join(f'{m:.3f}' for m in medians)} | "
                         f"{max(medians) / min(medians):.2f} |")
    publish("bench_clock", "\n".join(lines) + "\n", write=not args.no_write)


if __name__ == "__main__":
    main()
