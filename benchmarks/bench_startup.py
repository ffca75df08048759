"""CLI start-up: ``mpsearch --version`` and ``mpsearch profiles list`` in fresh processes.

    python -m benchmarks.bench_startup [--repeat 5] [--no-write]

Each command runs ``--repeat`` times in a new interpreter (the installed console script); the
table gives the median wall time and the heavy modules the CLI process loaded (none expected:
``import mpsearch.cli`` must not pull in numba, onnxruntime, optuna or networkx; the goal is
under 0.7 s for both commands). Timed here, never asserted in a test.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks._results import publish

HEAVY = ("numba", "onnxruntime", "optuna", "networkx")
COMMANDS = (("--version",), ("profiles", "list"))


def _loaded(args: tuple[str, ...]) -> list[str]:
    probe = (f"import sys\nfrom mpsearch.cli import main\ntry:\n    main({list(args)!r})\n"
             f"except SystemExit:\n    pass\nprint('loaded:' + ','.join(m for m in {HEAVY!r} "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    return [m for m in out.removeprefix("loaded:").split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-write", action="store_true",
                        help="print only; do not write benchmarks/results/bench_startup.md")
    args = parser.parse_args()
    script = shutil.which("mpsearch")
    if script is None:
        raise SystemExit("the mpsearch console script is not on PATH; pip install -e . first")
    lines = ["## CLI start-up", "",
             f"Command: `python -m benchmarks.bench_startup --repeat {args.repeat}`; median of "
             "fresh processes of the installed console script.", "",
             "| command | median s | heavy modules loaded |", "|---|---|---|"]
    for command in COMMANDS:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            subprocess.run([script, *command], capture_output=True, check=True)
            times.append(time.perf_counter() - start)
        heavy = ", ".join(_loaded(command)) or "none"
        lines.append(f"| `mpsearch {' '.join(command)}` | {statistics.median(times):.2f} | "
                     f"{heavy} |")
    publish("bench_startup", "\n".join(lines) + "\n", write=not args.no_write)


if __name__ == "__main__":
    main()
