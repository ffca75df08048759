"""CLI sub-commands over the pipeline: quantize, eval, search, export (each one API call)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_pipeline_parsers"]


def _kb(size: float) -> str:
    """Bytes for people: 81.1 kB, 3.91 MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}" if size < 100 * scale else \
                f"{size / scale:.0f} {unit}"
    return f"{size:.0f} B"


def _quantize(args: argparse.Namespace) -> int:
    from mpsearch.assignment import load_assignment, model_size, uniform_assignment
    from mpsearch.evaluate import Evaluator
    from mpsearch.graph import load_model
    from mpsearch.pipeline import prepare, write_model
    from mpsearch.profiles import load_profile
    from mpsearch.quantize import Quantizer

    graph, profile = load_model(args.model), load_profile(args.profile)
    assignment = (uniform_assignment(graph, profile, args.uniform) if args.uniform
                  else load_assignment(args.assignment, graph, profile))  # before any work
    prepared = prepare(graph, profile, args.data, calibration_samples=args.calibration_samples,
                       method=args.method, seed=args.seed, progress=not args.quiet)
    model = Quantizer(graph, prepared.table, profile, method=args.method).build(assignment)
    write_model(args.out, model)
    evaluator = Evaluator(graph, prepared.validation, metric=args.metric)
    fp32, quantized = evaluator.fp32(), evaluator.evaluate(model)
    feeds = next(iter(prepared.validation.batches(1)))
    latency = evaluator.session(model).time_batch(feeds)
    fp32_latency = evaluator.session(graph.model).time_batch(feeds)
    size, fp32_size = model_size(graph, profile, assignment), model_size(graph, profile, {})
    print(f"wrote    {args.out}")
    print(f"size     {_kb(size)} vs FP32 {_kb(fp32_size)} ({size / fp32_size:.2f}x)")
    for name, value in quantized.metrics.items():
        print(f"{name:<8} {value:.4f} vs FP32 {fp32.metrics.get(name, float('nan')):.4f}")
    print(f"latency  {latency * 1e3:.2f} ms vs FP32 {fp32_latency * 1e3:.2f} ms "
          f"(batch 1, {fp32_latency / latency:.2f}x speed-up)")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from mpsearch.data import load_data
    from mpsearch.evaluate import Evaluator
    from mpsearch.graph import load_model

    reference = load_model(args.reference or args.model)
    evaluator = Evaluator(reference, load_data(args.data), metric=args.metric)
    result = evaluator.evaluate(load_model(args.model).model, require_finite=True)
    print(f"model    {args.model} on {result.samples} samples "
          f"(reference {args.reference or 'itself'})")
    for name, value in result.metrics.items():
        print(f"{name:<8} {value:.4f}")
    return 0


def _search(args: argparse.Namespace) -> int:
    from mpsearch.runs import search
    from mpsearch.spec import load_spec

    spec = load_spec(args.spec).with_overrides(storage=args.storage, study=args.study,
                                               trials=args.trials, seed=args.seed)
    run_dir = Path(args.out) if args.out else Path("runs") / Path(args.spec).stem
    run = search(spec, run_dir, resume=args.resume, progress=not args.quiet)
    fp32 = run.fp32
    print(f"run dir  {run.run_dir}  ({run.result.evaluations} evaluations, "
          f"{run.result.seconds:.1f} s search)")
    print(f"FP32     {run.metric} {fp32['metric']:.4f}  size {_kb(fp32['size'])}")
    for name, point in run.uniform.items():
        print(f"uniform {name:<6} {run.metric} {point['metric']:.4f}  size {_kb(point['size'])}")
    print(f"\nPareto front ({len(run.front)} points, {run.metric} on held-out data):")
    print(f"{'point':>5} {run.metric:>9} {'size':>12} {'latency':>8}  formats")
    for p in run.front:
        latency = "-" if p["latency"] is None else f"{p['latency']:.2f}x"
        counts = ", ".join(f"{k} {v}" for k, v in sorted(p["counts"].items()))
        print(f"{p['index']:>5} {p['metric']:>9.4f} {_kb(p['size']):>12} {latency:>8}  {counts}")
    if not args.no_report:
        _report(run.run_dir)
    print(f"\nexport:  mpsearch export {run.run_dir} --point K --out model.onnx")
    return 0 if run.front else 1


def _report(run_dir: Path) -> None:
    try:
        from mpsearch.report import write_report
    except ImportError:
        return
    print(f"report   {write_report(run_dir)}")


def _export(args: argparse.Namespace) -> int:
    from mpsearch.runs import export_point

    result = export_point(args.run_dir, args.point, args.out)
    fp32 = result.fp32
    print(f"wrote    {result.path} (front point {args.point})")
    print(f"size     {_kb(result.size)} vs FP32 {_kb(result.fp32_size)} "
          f"({result.size / result.fp32_size:.2f}x)")
    for name, value in result.evaluation.metrics.items():
        print(f"{name:<8} {value:.4f} vs FP32 {fp32.metrics.get(name, float('nan')):.4f}")
    print(f"latency  {result.latency_s * 1e3:.2f} ms vs FP32 {result.fp32_latency_s * 1e3:.2f} "
          f"ms (batch 1)")
    front_metric = result.point["metric"]
    print(f"front    {front_metric:.4f}; re-measured {result.evaluation.value:.4f}")
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

