"""``mpsearch report RUN_DIR [--out FILE]``: thin CLI over :func:`mpsearch.report.write_report`."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_report_parser"]


def add_report_parser(subparsers: Any) -> None:
    """Register ``report``: write the self-contained HTML report of a run directory."""
    report = subparsers.add_parser(
        "report", help="write a run directory's self-contained HTML report",
        description="Write one HTML file (works offline) with the model summary, hardware "
                    "profile, sensitivity, distributions, node-by-node curve and Pareto front "
                    "of a run directory. Sections whose files are missing say 'not run'.")
    report.add_argument("run_dir", metavar="RUN_DIR",
                        help="directory written by `mpsearch search` or `mpsearch analyze`")
    report.add_argument("--out", metavar="FILE", default=None,
                        help="HTML file to write (default: RUN_DIR/report.html)")
    report.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from mpsearch import write_report  # plotly is imported only when a report is made

    print(write_report(args.run_dir, args.out))
    return 0
