"""Command-line interface: argparse sub-commands, each a thin call into the Python API.

Exit codes: 0 ok, 1 nothing feasible (a search found no configuration meeting its
constraints), 2 bad input (any :class:`~mpsearch.errors.MpsearchError`). A traceback is shown
only with ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from mpsearch import __version__
from mpsearch.cli._analyze import add_analyze_parser
from mpsearch.cli._calibrate import add_calibrate_parser
from mpsearch.cli._pipeline import add_pipeline_parsers
from mpsearch.cli._profiles import add_profiles_parser
from mpsearch.cli._report import add_report_parser
from mpsearch.cli._serve import add_serve_parser
from mpsearch.errors import MpsearchError

__all__ = ["main"]


def _summary(args: argparse.Namespace) -> int:
    from mpsearch import format_summary, load_model, summarize

    summary = summarize(load_model(args.model))
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print(format_summary(summary, top=args.top))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mpsearch",
        description="Mixed-precision (INT8/INT16/FP32) search for ONNX models under a hardware "
                    "profile.",
    )
    parser.add_argument("--version", action="version", version=f"mpsearch {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument("-q", "--quiet", action="store_true", help="only print results")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    summary = commands.add_parser("summary", help="op types, parameters, shapes and FLOPs")
    summary.add_argument("model", help="ONNX model file")
    summary.add_argument("--json", action="store_true", help="print JSON instead of a table")
    summary.add_argument("--top", type=int, default=15, help="heaviest nodes to list")
    summary.set_defaults(func=_summary)

    add_profiles_parser(commands)
    add_calibrate_parser(commands)
    add_pipeline_parsers(commands)
    add_analyze_parser(commands)
    add_report_parser(commands)
    add_serve_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except MpsearchError as e:
        if args.debug:
            raise
        print(f"mpsearch: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mpsearch: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, not bad input: exit 3, traceback only with --debug
        if args.debug:
            raise
        lines = str(e).strip().splitlines()
        detail = f"{type(e).__name__}: {lines[0][:300]}" if lines else type(e).__name__
        print(f"mpsearch: internal error: {detail}; run with --debug for the traceback",
              file=sys.stderr)
        return 3
