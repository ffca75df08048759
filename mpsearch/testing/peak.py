"""The CLI in a child process that reports its own peak memory: the hostile tests' and the
benchmarks' one way to measure a command's memory.

Not ``ru_maxrss``: Linux carries the parent's peak into a child across exec, so a child of a
test process that once held a large model reports that model's size. ``VmHWM`` is the exec'd
process's own high-water mark.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["PEAK_WRAPPER", "cli", "read_peak"]

#: Runs the CLI and, at exit, writes the child's own peak RSS (VmHWM, kB) to the file named
#: first (then the CLI's arguments).
PEAK_WRAPPER = """
import atexit, sys
peak_file = sys.argv[1]
sys.argv = ["mpsearch", *sys.argv[2:]]

def _peak():
    with open("/proc/self/status") as f:
        hwm = next(line for line in f if line.startswith("VmHWM:"))
    with open(peak_file, "w") as f:
        f.write(hwm.split()[1])

atexit.register(_peak)
from mpsearch.cli import main
sys.exit(main())
"""


def cli(peak_file: Path, *argv: str) -> list[str]:
    """The command line of ``mpsearch argv`` that writes its peak RSS to ``peak_file``."""
    return [sys.executable, "-c", PEAK_WRAPPER, str(peak_file), *argv]


def read_peak(peak_file: Path) -> int:
    """The peak RSS (kB) the child wrote, the file then removed."""
    kb = int(peak_file.read_text())
    peak_file.unlink()
    return kb
