"""CLI sub-commands over the pipeline: quantize, eval, search, export (each one API call)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mpsearch.cli._progress import BarProgress

__all__ = ["add_pipeline_parsers"]


def _kb(size: float) -> str:
    """Bytes for people: 81.1 kB, 3.91 MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}" if size < 100 * scale else \
                f"{size / scale:.0f} {unit}"
    return f"{size:.0f} B"


def _quantize(args: argparse.Namespace) -> int:
    from mpsearch.pipeline import quantize_one
    from mpsearch.spec import SearchSpec

    spec = SearchSpec(model=args.model, profile=args.profile, data=args.data,
                      calibration_samples=args.calibration_samples, data_seed=args.seed,
                      method=args.method, metric=args.metric)
    result = quantize_one(spec, args.out, uniform=args.uniform, assignment=args.assignment,
                          progress=BarProgress(not args.quiet))
    fp32, quantized = result.fp32, result.evaluation
    print(f"wrote    {result.path}")
    print(f"size     {_kb(result.size)} vs FP32 {_kb(result.fp32_size)} "
          f"({result.size / result.fp32_size:.2f}x)")
    for name, value in quantized.metrics.items():
        print(f"{name:<8} {value:.4f} vs FP32 {fp32.metrics.get(name, float('nan')):.4f}")
    print(f"latency  {result.latency_s * 1e3:.2f} ms vs FP32 {result.fp32_latency_s * 1e3:.2f} "
          f"ms (batch 1, {result.fp32_latency_s / result.latency_s:.2f}x speed-up)")
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
    run_dir = Path(args.out) if args.out else Path("runs") / Path(args.spec).stem
    progress = BarProgress(not args.quiet)
    run = search_run(spec, run_dir, resume=args.resume, progress=progress)
    progress.close()
    front, metric = run.front, run.front.metric
    print(f"run dir  {run.run_dir}  ({run.result.evaluations} evaluations, "
          f"{run.result.seconds:.1f} s search)")
    if front.stopped:
        print(f"stopped  {front.stopped}")
    if run.recovery is not None:
        print(f"recovery {run.recovery.summary()}")
    print(f"FP32     {metric} {front.fp32.metric:.4f}  size {_kb(front.fp32.size)}")
    for name, point in front.uniform.items():
        print(f"uniform {name:<6} {metric} {point.metric:.4f}  size {_kb(point.size)}")
    print(f"\nPareto front ({len(front.points)} points, {metric} on held-out data):")
    print(f"{'point':>5} {metric:>9} {'size':>12} {'latency':>8}  formats")
    for p in front.points:
        latency = "-" if p.latency is None else f"{p.latency:.2f}x"
        counts = ", ".join(f"{k} {v}" for k, v in sorted(p.counts.items()))
        print(f"{p.index:>5} {p.metric:>9.4f} {_kb(p.size):>12} {latency:>8}  {counts}")
    if not args.no_report:
        _report(run.run_dir)
    print(f"\nexport:  mpsearch export {run.run_dir} --point K --out model.onnx")
    return 0 if front.points else 1


def _report(run_dir: Path) -> None:
    try:
        from mpsearch import write_report
    except ImportError:
        return
    print(f"report   {write_report(run_dir)}")


def _export(args: argparse.Namespace) -> int:
    from mpsearch.pipeline import export_point

    result = export_point(args.run_dir, args.point, args.out)
    fp32 = result.fp32
    print(f"wrote    {result.path} (front point {args.point})")
    print(f"size     {_kb(result.size)} vs FP32 {_kb(result.fp32_size)} "
          f"({result.size / result.fp32_size:.2f}x)")
    for name, value in result.evaluation.metrics.items():
        print(f"{name:<8} {value:.4f} vs FP32 {fp32.metrics.get(name, float('nan')):.4f}")
    print(f"latency  {result.latency_s * 1e3:.2f} ms vs FP32 {result.fp32_latency_s * 1e3:.2f} "
          f"ms (batch 1)")
    if result.point is not None:
        print(f"front    {result.point.metric:.4f}; re-measured {result.evaluation.value:.4f}")
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
    search.set_defaults(func=_search)

    export = commands.add_parser("export", help="write a front point as a QDQ model")
    export.add_argument("run_dir")
    export.add_argument("--point", type=int, required=True)
    export.add_argument("--out", required=True)
    export.set_defaults(func=_export)

