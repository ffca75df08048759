"""``mpsearch analyze MODEL --profile P --data D --out RUN_DIR``: thin CLI over
:func:`mpsearch.pipeline.analyze_run`; prints the most sensitive nodes, their class and flags."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpsearch.cli._progress import BarProgress
from mpsearch.spec import Thresholds

if TYPE_CHECKING:
    from mpsearch import Analysis

__all__ = ["add_analyze_parser", "format_analysis"]


def add_analyze_parser(subparsers: Any) -> None:
    """Register ``analyze``."""
    parser = subparsers.add_parser(
        "analyze", help="per-node sensitivity, distributions and the node-by-node curve",
        description="Quantize each node alone (and all but one), rank the nodes, histogram "
                    "their weights and activations, and write JSON/CSV into the run directory.")
    parser.add_argument("model", help="ONNX model file")
    parser.add_argument("--profile", required=True, help="hardware profile name or YAML file")
    parser.add_argument("--data", required=True, help="calibration/validation data (.npz)")
    parser.add_argument("--out", required=True, help="run directory to write (reused as cache)")
    parser.add_argument("--method", default="minmax",
                        help="activation range method of the calibration table")
    parser.add_argument("--calibration-samples", type=int, default=256,
                        help="samples used for calibration (the rest validates)")
    parser.add_argument("--metric", default=None,
                        help="primary metric (default: accuracy with labels, else agreement)")
    parser.add_argument("--proxy", action="store_true",
                        help="fast proxy: each node's own output SQNR from a few batches")
    parser.add_argument("--formats", default=None,
                        help="comma-separated formats to analyze (default: every format below "
                             "FP32 in the profile)")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="validation samples used per evaluation (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the calibration split")
    parser.add_argument("--top", type=int, default=10, help="sensitive nodes to print")
    defaults = Thresholds()
    for name, unit in (("high_drop", "metric units"), ("medium_drop", "metric units"),
                       ("high_sqnr", "dB"), ("medium_sqnr", "dB")):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float,
                            default=getattr(defaults, name),
                            help=f"class threshold ({unit}; default %(default)s)")
    parser.add_argument("--no-reverse", action="store_true", help="skip the reverse view")
    parser.add_argument("--no-curve", action="store_true", help="skip the node-by-node curve")
    parser.add_argument("--no-report", action="store_true",
                        help="do not write report.html into the run directory")
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    from mpsearch.pipeline import analyze_run
    from mpsearch.spec import CalibrationSpec, DataSpec, EvaluationSpec, SearchSpec

    out = Path(args.out)
    formats = None if args.formats is None else tuple(
        f.strip() for f in args.formats.split(",") if f.strip())
    spec = SearchSpec(model=args.model, profile=args.profile,
                      data=DataSpec(source=args.data, calibration=args.calibration_samples,
                                    seed=args.seed),
                      calibration=CalibrationSpec(method=args.method), metric=args.metric,
                      formats=formats,
                      evaluation=EvaluationSpec(sensitivity_samples=args.limit))
    progress = BarProgress()
    analysis = analyze_run(spec, out, proxy=args.proxy,
                           reverse=False if args.no_reverse else None,
                           curve=False if args.no_curve else None,
                           thresholds=Thresholds(high_drop=args.high_drop,
                                                 medium_drop=args.medium_drop,
                                                 high_sqnr=args.high_sqnr,
                                                 medium_sqnr=args.medium_sqnr),
                           progress=progress)
    progress.close()
    print(format_analysis(analysis, top=args.top))
    print(f"wrote {out}/sensitivity.json, curve.json, distributions.json (+ CSV)")
    if not args.no_report:
        from mpsearch import write_report

        print(f"wrote {write_report(out)}")
    return 0


def _num(value: float | None, digits: int = 4) -> str:
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value + 0.0:.{digits}g}" if value != 0 else "0"


def format_analysis(analysis: Analysis, top: int = 10) -> str:
    """A short table: the most sensitive nodes of the lowest format, their class and flags."""
    fmt = analysis.formats[0]
    fp32 = analysis.fp32.get(analysis.metric)
    flags = {d.node: d.codes for d in analysis.distributions}
    gains = {r.node: r.gain for r in analysis.reverse}
    counts = {c: sum(1 for r in analysis.sensitivity if r.format == fmt and r.cls == c)
              for c in ("high", "medium", "low")}
    lines = [f"{analysis.model} on {analysis.profile}: {analysis.metric} FP32 {_num(fp32)} "
             f"({analysis.samples} samples, {analysis.mode.replace('_', '-')}); "
             f"{fmt}: {counts['high']} high, {counts['medium']} medium, {counts['low']} low",
             f"{'rank':>4}  {'node':<36} {'op':<12} {'class':<6} {'drop':>8} "
             f"{'sqnr dB':>8} {'restore':>8}  flags"]
    for row in analysis.most_sensitive(top):
        sqnr = row.sqnr if row.sqnr is not None else row.proxy_sqnr
        name = row.node if len(row.node) <= 36 else "..." + row.node[-33:]
        lines.append(f"{row.rank:>4}  {name:<36} {row.op_type:<12} {row.cls:<6} "
                     f"{_num(row.drop):>8} {_num(sqnr, 3):>8} {_num(gains.get(row.node)):>8}"
                     f"  {', '.join(flags.get(row.node, ())) or '-'}")
    return "\n".join(lines)
