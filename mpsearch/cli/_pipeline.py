"""CLI sub-commands over the pipeline: quantize, eval, search, export (each one API call)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mpsearch.cli._output import search_dir
from mpsearch.cli._progress import BarProgress
from mpsearch.errors import EXIT_NO_VERIFIED_POINT
from mpsearch.rundir import (
    Baseline,
    Front,
    FrontPoint,
    format_bytes,
    formats_text,
    versus_fp32,
)

__all__ = ["add_pipeline_parsers"]


def _latency_line(latency_s: float | None, fp32_latency_s: float | None) -> str:
    """The export's batch-1 latency against FP32's, in ms and in words."""
    if latency_s is None or fp32_latency_s is None:
        return "latency  not timed (this machine does not run the profile's target)"
    return (f"latency  {latency_s * 1e3:.3g} ms vs FP32 {fp32_latency_s * 1e3:.3g} ms "
            f"(batch 1, {versus_fp32(latency_s / fp32_latency_s)})")


def _ms(value: float | None, interval: tuple[float, float] | None) -> str:
    """A median in ms with its interval: "0.175 [0.171-0.182]"; "-" when unknown."""
    if value is None:
        return "-"
    return f"{value:.3g}" + ("" if interval is None else
                             f" [{interval[0]:.3g}-{interval[1]:.3g}]")


def _front_table(front: Front, show_all: bool) -> None:
    """The front (shown points, or every point with ``show_all``) and its baselines."""
    metric, batch = front.metric, front.latency_batch
    points = front.points if show_all else front.shown
    rows: list[tuple[str, float, int, Baseline | FrontPoint]] = [
        ("FP32", front.fp32.metric, front.fp32.size, front.fp32)]
    rows += [(f"uniform {k}", b.metric, b.size, b) for k, b in front.uniform.items()]
    rows += [(f"point {p.index}" + ("" if p.shown else f" (beaten by {p.beaten_by})")
              + (" (target failed)" if p.target_failure else ""), p.metric, p.size, p)
             for p in points]
    timed = front.latency_source == "measured"
    width = max(len(row[0]) for row in rows)
    head = f"{'':<{width}} {metric:>9} {'size':>9}"
    if timed:
        head += f"  {'ms, batch 1':>20}  {f'ms, batch {batch}':>20}"
    print(head + "  latency")
    for name, value, size, item in rows:
        line = f"{name:<{width}} {value:>9.4f} {format_bytes(size):>9}"
        if timed:
            line += (f"  {_ms(item.latency_ms, item.latency_ms_interval):>20}"
                     f"  {_ms(item.batch_latency_ms, item.batch_latency_ms_interval):>20}")
        words = front.latency_words(item) if item is not front.fp32 else ""
        print(f"{line}  {words}".rstrip())
        if isinstance(item, FrontPoint):
            print(f"{'':<{width}} formats: {formats_text(item.counts)}")


def _quantize(args: argparse.Namespace) -> int:
    from mpsearch.pipeline import quantize_one
    from mpsearch.spec import CalibrationSpec, DataSpec, SearchSpec

    spec = SearchSpec(model=args.model, profile=args.profile,
                      data=DataSpec(source=args.data, calibration=args.calibration_samples,
                                    seed=args.seed),
                      calibration=CalibrationSpec(method=args.method), metric=args.metric)
    result = quantize_one(spec, args.out, uniform=args.uniform, assignment=args.assignment,
                          progress=BarProgress(not args.quiet))
    fp32, quantized = result.fp32, result.evaluation
    print(f"wrote    {result.path}")
    print(f"size     {format_bytes(result.size)} vs FP32 {format_bytes(result.fp32_size)} "
          f"({result.size / result.fp32_size:.2f}x)")
    for name, value in quantized.metrics.items():
        print(f"{name:<8} {value:.4f} vs FP32 {fp32.metrics.get(name, float('nan')):.4f}")
    print(_latency_line(result.latency_s, result.fp32_latency_s))
    return 0


def _eval(args: argparse.Namespace) -> int:
    from mpsearch.pipeline import evaluate_model

    result = evaluate_model(args.model, args.data, reference=args.reference, metric=args.metric)
    print(f"model    {args.model} on {result.samples} samples "
          f"(reference {args.reference or 'itself'})")
    for name, value in result.metrics.items():
        print(f"{name:<8} {value:.4f}")
    return 0


def _search(args: argparse.Namespace) -> int:
    from mpsearch.pipeline import search_run
    from mpsearch.spec import load_spec

    spec = load_spec(args.spec).with_overrides(storage=args.storage, study=args.study,
                                               trials=args.trials, seed=args.seed)
    run_dir = search_dir(args)
    progress = BarProgress(not args.quiet)
    run = search_run(spec, run_dir, resume=args.resume, progress=progress)
    progress.close()
    front = run.front
    print(f"run dir  {run.run_dir}  ({run.result.evaluations} evaluations, "
          f"{run.result.seconds:.1f} s search)")
    if run.recovery is not None:
        print(f"recovery {run.recovery.summary()}")
    shown = len(front.points) if args.all else len(front.shown)
    print(f"\nPareto front ({shown} of {len(front.points)} points, {front.metric} on held-out "
          "data, with the baselines):")
    _front_table(front, args.all)
    _print_targets(front.shown if not args.all else front.points)
    note = front.hidden_note()
    if note and not args.all:
        print(f"\n{note} (--all lists them)")
    print(f"\n{front.recommendation}")
    unverified = _no_verified_point(front)
    if unverified:
        print(unverified)
    if not args.no_report:
        _report(run.run_dir)
    print(f"\nexport:  mpsearch export {run.run_dir} --point K --out model.onnx")
    if unverified:
        return EXIT_NO_VERIFIED_POINT
    return 0 if front.points else 1


def _no_verified_point(front: Front) -> str | None:
    """Why no shown point passed the target's verification (None when one did, or when the
    run verified nothing)."""
    shown = front.shown
    if not shown or any(p.target_placement is None or not p.target_failure for p in shown):
        return None
    tool = (shown[0].target_placement or {}).get("toolchain", "the target")
    reasons = "; ".join(f"point {p.index}: {_clip(str(p.target_failure))}" for p in shown)
    return (f"no verified point: all {len(shown)} shown point(s) failed verification on "
            f"{tool} ({reasons})")


def _print_targets(points: Any) -> None:
    """The front re-measured on the profile's toolchain (``verify: toolchain`` or ``front``)."""
    checked = [p for p in points if p.target_placement is not None]
    if not checked:
        return
    first = checked[0].target_placement
    samples = next((p.target_placement.get("samples") for p in checked
                    if p.target_placement.get("ort_metric") is not None), None)
    where = "held-out" if samples is None else (
        f"the first {samples} held-out samples (evaluation.target_samples), ORT on the same")
    print(f"\non {first.get('toolchain')} ({first.get('version', '')}), {where}:")
    print(f"{'point':>5} {'ORT':>9} {'target':>9} {'diff':>8} {'on CPU':>6} {'cycles':>10}"
          "  verdict")
    for p in checked:
        placed = p.target_placement
        verdict = "FAILED" if p.target_failure else "ok"
        ort = p.metric if placed.get("ort_metric") is None else placed["ort_metric"]
        if p.target_metric is None:
            print(f"{p.index:>5} {ort:>9.4f} {'-':>9} {'-':>8} {'-':>6} {'-':>10}  "
                  f"{verdict}")
        else:
            cycles = (p.target_cost or {}).get("cycles")
            print(f"{p.index:>5} {ort:>9.4f} {p.target_metric:>9.4f} "
                  f"{p.target_metric - ort:>+8.4f} {len(placed['fallback']):>6} "
                  f"{'-' if cycles is None else f'{cycles:.0f}':>10}  {verdict}")
        if p.target_failure:
            print(f"      failed  {p.target_failure}")
        for node in placed["fallback"]:
            print(f"      cpu  {node['node']}: {node['reason']}")


def _clip(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _report(run_dir: Path) -> None:
    try:
        from mpsearch import write_report
    except ImportError:
        return
    print(f"report   {write_report(run_dir)}")


def _export(args: argparse.Namespace) -> int:
    from mpsearch.pipeline import export_point

    result = export_point(args.run_dir, args.point, args.out, target=args.target)
    fp32 = result.fp32
    print(f"wrote    {result.path} (front point {args.point})")
    print(f"size     {format_bytes(result.size)} vs FP32 {format_bytes(result.fp32_size)} "
          f"({result.size / result.fp32_size:.2f}x)")
    for name, value in result.evaluation.metrics.items():
        print(f"{name:<8} {value:.4f} vs FP32 {fp32.metrics.get(name, float('nan')):.4f}")
    print(_latency_line(result.latency_s, result.fp32_latency_s))
    if result.point is not None:
        print(f"front    {result.point.metric:.4f}; re-measured {result.evaluation.value:.4f}")
    if result.target_placement is not None and result.target_metric is not None:
        placed = result.target_placement
        print(f"target   {result.target_artifact} ({placed['toolchain']}, {placed['version']})")
        print(f"         {result.evaluation.primary}"
              f" {result.target_metric:.4f} on the target vs {result.evaluation.value:.4f} in "
              f"ONNX Runtime; {placed['on_accelerator']} of {placed['nodes']} nodes on the "
              f"accelerator; cost {dict(result.target_cost or {})}")
        for node in placed["fallback"]:
            print(f"         cpu  {node['node']}: {node['reason']}")
    return 0


def add_pipeline_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    quantize = commands.add_parser("quantize", help="build one QDQ model and measure it")
    quantize.add_argument("model")
    quantize.add_argument("--profile", required=True, help="shipped profile name or YAML path")
    quantize.add_argument("--data", required=True, help=".npz/.npy, image folder or mod:func")
    which = quantize.add_mutually_exclusive_group(required=True)
    which.add_argument("--uniform", metavar="FORMAT", help="every node that allows it")
    which.add_argument("--assignment", metavar="FILE.json", help="{node: format}")
    quantize.add_argument("--out", required=True)
    quantize.add_argument("--method", default="minmax",
                          choices=("minmax", "percentile", "entropy", "mse"))
    quantize.add_argument("--metric", default=None)
    quantize.add_argument("--calibration-samples", type=int, default=256)
    quantize.add_argument("--seed", type=int, default=0)
    quantize.set_defaults(func=_quantize)

    evaluate = commands.add_parser("eval", help="score a model against FP32 outputs")
    evaluate.add_argument("model")
    evaluate.add_argument("--data", required=True)
    evaluate.add_argument("--reference", help="FP32 model (default: the model itself)")
    evaluate.add_argument("--metric", default=None)
    evaluate.set_defaults(func=_eval)

    search = commands.add_parser("search", help="run a mixed-precision search from a spec")
    search.add_argument("spec", help="search spec YAML (see searches/)")
    search.add_argument("--out", help="run directory (default runs/<spec name>)")
    search.add_argument("--resume", action="store_true", help="continue the run in --out")
    search.add_argument("--storage", help="Optuna storage URL (sqlite:///..., postgresql://...)")
    search.add_argument("--study", help="study name in the storage")
    search.add_argument("--trials", type=int, help="total trials (overrides the spec)")
    search.add_argument("--seed", type=int, help="sampler seed (overrides the spec)")
    search.add_argument("--no-report", action="store_true", help="do not write report.html")
    search.add_argument("--all", action="store_true",
                        help="list the points a baseline or another point beats too")
    search.set_defaults(func=_search)

    export = commands.add_parser("export", help="write a front point as a QDQ model")
    export.add_argument("run_dir")
    export.add_argument("--point", type=int, required=True)
    export.add_argument("--out", required=True)
    export.add_argument("--target", action="store_true",
                        help="also write the profile toolchain's artifact beside it "
                             "(QNN context binary, .rknn, Vela TFLite)")
    export.set_defaults(func=_export)

