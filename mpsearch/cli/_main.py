"""Command-line interface: argparse sub-commands, each a thin call into the Python API.

Exit codes (docs/exit-codes.md): 0 ok, 1 nothing feasible (a search found no configuration
meeting its constraints), 2 bad input (any :class:`~mpsearch.errors.MpsearchError`, a bad
flag, an output that cannot be written), 3 internal error, 130 interrupted (Ctrl-C). Every
failure prints one line on stderr and leaves nothing at ``--out`` that the command created
(an interrupted search keeps a run directory ``--resume`` can continue). A traceback is shown
only with ``--debug``.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from mpsearch import __version__
from mpsearch.cli._analyze import add_analyze_parser
from mpsearch.cli._calibrate import add_calibrate_parser
from mpsearch.cli._llm import add_llm_parser
from mpsearch.cli._output import Output
from mpsearch.cli._pipeline import add_pipeline_parsers
from mpsearch.cli._profiles import add_profiles_parser
from mpsearch.cli._progress import close_bars
from mpsearch.cli._report import add_report_parser
from mpsearch.cli._serve import add_serve_parser
from mpsearch.errors import MpsearchError, interrupted

__all__ = ["main"]

#: File errors the user can fix (space, permissions, a path that is a file): exit 2.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                           errno.EFBIG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST})
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class _UsageError(Exception):
    """A bad command line (argparse's message)."""


class _Parser(argparse.ArgumentParser):
    """argparse, its errors one line (``mpsearch: error: ...``, exit 2) instead of the usage
    text and the message."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message}; see {self.prog} --help")


def _summary(args: argparse.Namespace) -> int:
    from mpsearch import format_summary, load_model, summarize

    summary = summarize(load_model(args.model))
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print(format_summary(summary, top=args.top))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    add_llm_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as e:
        print(f"mpsearch: error: {e}", file=sys.stderr)
        return 2
    level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    output = Output.of(args)
    try:
        if output is not None:
            output.check()
        code = int(args.func(args))
    except SystemExit:
        raise
    except BaseException as e:  # every way out: one line, the documented code, no half output
        close_bars()
        if args.debug and not interrupted(e):
            raise
        code, line = _failure(e)
        if code in (2, 3, 130) and output is not None:
            line += output.clean(code)
        print(line, file=sys.stderr)
        return code
    return code


def _failure(error: BaseException) -> tuple[int, str]:
    """(exit code, stderr line) for an exception that ended a command."""
    if interrupted(error):
        return 130, "mpsearch: interrupted"
    if isinstance(error, MpsearchError):
        return 2, f"mpsearch: error: {_one_line(str(error))}"
    if isinstance(error, OSError) and error.errno in _WRITE_ERRNOS:
        where = f"'{error.filename}'" if error.filename else "the output"
        if error.errno in _FULL_ERRNOS:
            return 2, (f"mpsearch: error: cannot write {where} ({error.strerror or error}); "
                       "free space or choose another --out")
        return 2, (f"mpsearch: error: cannot access {where} ({error.strerror or error}); "
                   "check the path and its permissions")
    if isinstance(error, MemoryError):
        return 2, ("mpsearch: error: out of memory; use fewer or smaller samples, a smaller "
                   "--batch-size, or a machine with more memory")
    lines = str(error).strip().splitlines()
    detail = f"{type(error).__name__}: {lines[0][:300]}" if lines else type(error).__name__
    return 3, f"mpsearch: internal error: {detail}; run with --debug for the traceback"


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "no detail"
