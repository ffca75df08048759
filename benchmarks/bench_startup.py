"""CLI start-up: ``mpsearch --version`` and ``mpsearch profiles list`` in fresh processes.

    python -m benchmarks.bench_startup [--repeat 7] [--no-write]

Each command runs ``--repeat`` times in a new interpreter (the installed console script),
interleaved with the anchor, a fresh ``python -c "import onnxruntime, numba"``, so both see the
same machine state; the table gives the median wall times, their ratio and the heavy modules
the CLI process loaded (none expected: ``import mpsearch.cli`` must not pull in onnx, numba,
onnxruntime, optuna, networkx or plotly; the goal is a ratio of at most 0.5). Timed here,
never asserted in a test.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks._results import publish

HEAVY = ("onnx", "numba", "onnxruntime", "optuna", "networkx", "plotly")
COMMANDS = (("--version",), ("profiles", "list"))


def _loaded(args: tuple[str, ...]) -> list[str]:
    probe = (f"import sys\nfrom mpsearch.cli import main\ntry:\n    main({list(args)!r})\n"
             f"except SystemExit:\n    pass\nprint('loaded:' + ','.join(m for m in {HEAVY!r} "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    return [m for m in out.removeprefix("loaded:").split(",") if m]


def _timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, check=True)
    return time.perf_counter() - start


def startup_lines(repeat: int) -> list[str]:
    """The start-up table: each command's median over ``repeat`` fresh processes beside the
    anchor's, their ratio and the heavy modules the command loaded."""
    script = shutil.which("mpsearch")
    if script is None:
        raise SystemExit("the mpsearch console script is not on PATH; pip install -e . first")
    anchor = [sys.executable, "-c", "import onnxruntime, numba"]
    lines = ["| command | median s | anchor median s | ratio | heavy modules loaded |",
             "|---|---|---|---|---|"]
    for command in COMMANDS:
        times: list[float] = []
        anchors: list[float] = []
        for _ in range(repeat):
            times.append(_timed([script, *command]))
            anchors.append(_timed(anchor))
        ours, theirs = statistics.median(times), statistics.median(anchors)
        heavy = ", ".join(_loaded(command)) or "none"
        lines.append(f"| `mpsearch {' '.join(command)}` | {ours:.3f} | {theirs:.3f} | "
                     f"{ours / theirs:.2f} | {heavy} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-write", action="store_true",
                        help="print only; do not write benchmarks/results/bench_startup.md")
    args = parser.parse_args()
    lines = ["## CLI start-up", "",
             f"Command: `python -m benchmarks.bench_startup --repeat {args.repeat}`; median of "
             "fresh processes of the installed console script, each run interleaved with the "
             "anchor `python -c \"import onnxruntime, numba\"`.", "",
             *startup_lines(args.repeat)]
    publish("bench_startup", "\n".join(lines) + "\n", write=not args.no_write)


if __name__ == "__main__":
    main()
