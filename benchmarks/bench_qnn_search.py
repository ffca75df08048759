"""The shipped search specs under ``qnn_htp`` with the HTP emulator in the loop: does every
front point score on the emulator as it scores in ONNX Runtime's CPU EP?

Each of ``searches/*.yaml`` (the demo and the fixtures) is searched with ``profile: qnn_htp``,
objectives metric and size and ``--trials`` trials; the demo with ``verify: toolchain`` (a
configuration that would not run fully on the HTP is infeasible), the fixtures with
``verify: front`` (every front point compiled and re-measured on the emulator). Per search: the
front points, the largest |emulator - ORT| held-out metric over them, and the nodes that fall
back to the CPU with the QNN execution provider's reason.

    python -m benchmarks.bench_qnn_search [--trials 30] [--no-write]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections import Counter
from pathlib import Path

from benchmarks._results import publish
from mpsearch.pipeline import search_run
from mpsearch.rundir import Front
from mpsearch.spec import load_spec

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--no-write", action="store_true",
                        help="print only; do not write benchmarks/results/bench_qnn_search.md")
    args = parser.parse_args()
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
