"""Calibration, side by side with ``onnxruntime.quantization``'s calibrators, in one run.

For N in --samples (default 128 and 512) it measures, each job in a fresh subprocess so peak RSS
is the job's own (``VmHWM``; not ``ru_maxrss``, which Linux carries from the parent into a child
across exec):

* ``fp32``: a plain FP32 inference pass over the N samples (ORT, all graph optimizations);
* ``mpsearch``: :func:`mpsearch.calibration.calibrate` (the one streaming pass) and then the
  ranges of every tensor for each method (minmax, percentile, entropy, mse);
* ``cli``: ``mpsearch calibrate MODEL --data DATA --out DIR --method METHOD`` with default
  flags otherwise (the batch chosen from the activation memory budget; ``--method``, default
  entropy), as a user runs it: its wall time includes the process start, imports and model
  load; its peak RSS is the command's own;
* ``ort-minmax``, ``ort-percentile``, ``ort-entropy``: ``create_calibrator`` with ONNX Runtime's
  defaults (Percentile: 2048 bins, 99.999 %, symmetric; Entropy: 128 bins, 128 quantized bins).
  ORT's histogram calibrators keep every activation of every batch in memory, so at large N
  they are skipped when their projected footprint (linear in N, from the smallest N) would not
  fit comfortably in this machine's free memory; the projection is printed.

Then it compares the ranges at the smallest N (min-max must be identical; percentile and
entropy within a stated tolerance, else compared by the fake-quantization MSE on real
activations) and times every kernel against its NumPy twin, and the fused statistics kernel
against the NumPy reference doing the same work and against ``x.max()``.

Model: ``resnet18()`` / ``mobilenetv2()`` of :mod:`mpsearch.testing.architectures`. Data:
``benchmarks/_models/photos.npz`` when present (ImageNet-preprocessed photos), else seeded
smooth random images.

Run: ``python -m benchmarks.bench_calibration --model resnet18`` (add ``--quick`` for a smoke
run with small N; ``--jobs fp32 cli --samples 256`` for the command's memory row alone;
``--write`` also writes the table to ``benchmarks/results/bench_calibration.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from benchmarks._results import publish
from mpsearch.testing import architectures
from mpsearch.testing.peak import cli, read_peak

ROOT = Path(__file__).resolve().parent


METHODS = ("minmax", "percentile", "entropy", "mse")
JOBS = ("fp32", "exposed", "mpsearch", "mpsearch-noopt", "cli", "ort-minmax", "ort-percentile",
        "ort-entropy")
ORT_METHODS = ("minmax", "percentile", "entropy")


def build_model(name: str, out: Path) -> str:
    """Write the benchmark model to ``out``; returns a description."""
    if Path(name).suffix == ".onnx":
        onnx.save(onnx.load(name), out)
        return name
    if name not in ("resnet18", "mobilenetv2"):
        raise SystemExit(f"--model {name}: resnet18, mobilenetv2 or an .onnx path")
    onnx.save(getattr(architectures, name)(), out)
    return f"mpsearch.testing.architectures.{name}()"


def build_data(n: int, seed: int = 0) -> tuple[np.ndarray, str]:
    photos = ROOT / "_models" / "photos.npz"
    if photos.exists():
        with np.load(photos) as archive:
            x = archive["input"]
        if len(x) >= n:
            return np.ascontiguousarray(x[:n]), "photos.npz (ImageNet-preprocessed photos)"
    rng = np.random.default_rng(seed)
    coarse = rng.standard_normal((n, 3, 28, 28)).astype(np.float32)
    x = np.repeat(np.repeat(coarse, 8, axis=2), 8, axis=3)  # smooth-ish 224x224 images
    x += 0.1 * rng.standard_normal(x.shape).astype(np.float32)
    return x, "seeded random 224x224 images"


# ------------------------------------------------------------------ worker jobs
def _rss_mb() -> float:
    """This process's own peak RSS (MB): ``VmHWM``, else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0




def _batches(x: np.ndarray, size: int) -> list[dict[str, np.ndarray]]:
    return [{"input": x[i:i + size]} for i in range(0, len(x), size)]


def job_fp32(model: str, x: np.ndarray, batch: int, threads: int) -> dict[str, Any]:
    from mpsearch.runtime import create_session

    session = create_session(model, threads=threads)
    session.run({"input": x[:batch]})  # warm-up, as every other job's session creation
    start = time.perf_counter()
    for feeds in _batches(x, batch):
        session.run(feeds)
    return {"seconds": time.perf_counter() - start}


def job_exposed(model: str, x: np.ndarray, batch: int, threads: int) -> dict[str, Any]:
    """The ORT part of mpsearch's pass alone: every calibrated tensor exposed, no statistics."""
    from mpsearch.graph import load_model
    from mpsearch.runtime import create_session

    graph = load_model(model)
    tensors = [t for t in graph.activation_tensors() if t not in {i.name for i in graph.inputs}]
    session = create_session(graph.model, threads=threads, extra_outputs=tensors)
    session.run({"input": x[:batch]}, tensors)
    start = time.perf_counter()
    floats = 0
    for feeds in _batches(x, batch):
        floats += sum(v.size for v in session.run(feeds, tensors).values())
    return {"seconds": time.perf_counter() - start, "floats_per_sample": floats / len(x),
            "exposed": len(tensors)}


def job_mpsearch(model: str, x: np.ndarray, batch: int, threads: int,
                 optimize: bool) -> dict[str, Any]:
    from mpsearch import kernels
    from mpsearch.calibration import calibrate
    from mpsearch.data import Dataset
    from mpsearch.graph import load_model

    graph = load_model(model)
    kernels.tensor_stats(np.zeros(8, np.float32), 0.0, 1.0, 8)  # JIT cache load, not timed
    data = Dataset(inputs={"input": x}, source="bench")
    start = time.perf_counter()
    table = calibrate(graph, data, batch_size=batch, threads=threads, optimize=optimize)
    pass_seconds = time.perf_counter() - start
    derive: dict[str, float] = {}
    ranges: dict[str, dict[str, list[float]]] = {}
    for method in METHODS:
        start = time.perf_counter()
        ranges[method] = {t: list(table.range(t, method=method)) for t in table.tensors}
        derive[method] = time.perf_counter() - start
    ranges["percentile_sym"] = {t: list(table.range(t, method="percentile", symmetric=True))
                                for t in table.tensors}
    return {"seconds": pass_seconds, "derive": derive, "ranges": ranges,
            "tensors": len(table.tensors)}


def job_cli(model: str, data: str, method: str) -> dict[str, Any]:
    """``mpsearch calibrate --method METHOD`` with default flags otherwise, in its own
    process; its own peak RSS."""
    with tempfile.TemporaryDirectory() as out:
        peak = Path(out) / "peak"
        start = time.perf_counter()
        subprocess.run(cli(peak, "calibrate", model, "--data", data, "--out",
                           str(Path(out) / "table"), "--method", method),
                       check=True, capture_output=True)
        seconds = time.perf_counter() - start
        child = read_peak(peak) / 1024.0
    return {"seconds": seconds, "command_rss_mb": child, "method": method}


def job_ort(model: str, x: np.ndarray, batch: int, method: str) -> dict[str, Any]:
    from onnxruntime.quantization.calibrate import (
        CalibrationDataReader,
        CalibrationMethod,
        create_calibrator,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(_batches(x, batch))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    kind = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
            "entropy": CalibrationMethod.Entropy}[method]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        calibrator = create_calibrator(model, augmented_model_path=os.path.join(tmp, "aug.onnx"),
                                       calibrate_method=kind)
        calibrator.collect_data(Reader())
        data = calibrator.compute_data()
        seconds = time.perf_counter() - start
    ranges = {name: [float(np.asarray(v).reshape(-1)[0]) for v in d.range_value]
              for name, d in data.data.items()}
    return {"seconds": seconds, "ranges": ranges, "tensors": len(ranges)}


def worker(args: argparse.Namespace) -> None:
    import contextlib
    import io

    x = np.load(args.data)
    base = _rss_mb()
    with contextlib.redirect_stdout(io.StringIO()):  # ORT's calibrators print
        if args.worker == "cli":
            result = job_cli(args.model_path, args.data, args.method)
        elif args.worker == "fp32":
            result = job_fp32(args.model_path, x, args.batch_size, args.threads)
        elif args.worker == "exposed":
            result = job_exposed(args.model_path, x, args.batch_size, args.threads)
        elif args.worker.startswith("mpsearch"):
            result = job_mpsearch(args.model_path, x, args.batch_size, args.threads,
                                  optimize=not args.worker.endswith("noopt"))
        else:
            result = job_ort(args.model_path, x, args.batch_size, args.worker.split("-", 1)[1])
    result.update(peak_rss_mb=_rss_mb(), rss_after_data_mb=base, data_mb=x.nbytes / 2**20)
    if "command_rss_mb" in result:  # the command's process, which loads the data itself
        result["peak_rss_mb"] = result.pop("command_rss_mb")
    print("RESULT " + json.dumps(result))


def run_job(job: str, model: Path, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", job, "--model-path", str(model), "--data",
           str(data), "--batch-size", str(args.batch_size), "--threads", str(args.threads),
           "--method", args.method]
    env = dict(os.environ, PYTHONPATH=str(ROOT.parent))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    raise RuntimeError(f"{job} failed:\n{proc.stderr[-3000:]}")


# ------------------------------------------------------------------ range comparison
def compare_ranges(model: Path, x: np.ndarray, ours: dict[str, Any], ort: dict[str, Any],
                   samples: int) -> list[str]:
    from mpsearch import kernels
    from mpsearch.runtime import create_session

    lines = []
    mine, theirs = ours["ranges"], {m: ort[m]["ranges"] for m in ort}
    common = [t for t in mine["minmax"] if t in theirs.get("minmax", {})]
    if "minmax" in theirs:
        diffs = [max(abs(mine["minmax"][t][i] - theirs["minmax"][t][i])
                     / max(abs(theirs["minmax"][t][i]), 1e-30) for i in (0, 1)) for t in common]
        same = sum(d == 0 for d in diffs)
        lines.append(f"min-max: {same}/{len(common)} tensors identical to ORT MinMax "
                     f"(largest relative difference {max(diffs):.2g})")
    session = create_session(str(model), threads=2, extra_outputs=common)
    acts = session.run({"input": x[:samples]}, common)

    def qmse(tensor: str, rng: list[float]) -> float:
        lo, hi = min(rng[0], 0.0), max(rng[1], 0.0)
        scale = (hi - lo) / 255.0 if hi > lo else 1.0
        zero = float(np.clip(np.round(-lo / scale), 0, 255))
        value = acts[tensor]
        return kernels.error_stats(value, kernels.fake_quantize(value, scale, zero, 0, 255))[0]

    # ORT clamps its symmetric percentile threshold to [min, max]; do the same with ours
    mine["percentile_clamped"] = {
        t: [max(r[0], mine["minmax"][t][0]), min(r[1], mine["minmax"][t][1])]
        for t, r in mine["percentile_sym"].items()}
    for method, key in (("percentile", "percentile_clamped"), ("entropy", "entropy")):
        if method not in theirs:
            continue
        rel, better, worse_by, worst = [], 0, [], []
        for t in common:
            a, b = mine[key][t], theirs[method][t]
            span = max(abs(mine["minmax"][t][0]), abs(mine["minmax"][t][1])) or 1.0
            rel.append(max(abs(a[0] - b[0]), abs(a[1] - b[1])) / span)
            m_ours, m_ort = qmse(t, a), qmse(t, b)
            if m_ours <= m_ort * 1.0001:
                better += 1
            else:
                worse_by.append(m_ours / m_ort)
                worst.append((m_ours / m_ort, t, a, b))
        rel_a = np.array(rel)
        lines.append(
            f"{method}: |ours - ORT| / max|x|: median {np.median(rel_a):.2%}, max "
            f"{rel_a.max():.2%}; within 1%: {int((rel_a <= 0.01).sum())}/{len(rel)}; "
            f"uint8 fake-quant MSE on {samples} samples: ours <= ORT on {better}/{len(common)}"
            + (f" (elsewhere ours is {np.median(worse_by):.2f}x ORT's, median)" if worse_by
               else ""))
        for ratio, t, a, b in sorted(worst, reverse=True)[:3]:
            lines.append(f"  {method} worst: {t}: ours [{a[0]:.4g}, {a[1]:.4g}] vs ORT "
                         f"[{b[0]:.4g}, {b[1]:.4g}], MSE {ratio:.2f}x")
    return lines


# ------------------------------------------------------------------ kernels
def _best(fn: Any, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_kernels(size: int, repeat: int) -> list[str]:
    from mpsearch import kernels as k

    k.set_threads(2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(size).astype(np.float32)
    lo, hi = float(x.min()), float(x.max())

    def numpy_reference() -> None:
        np.min(x), np.max(x), np.mean(x), np.var(x), np.histogram(x, 2048, range=(lo, hi))

    t_fused = _best(lambda: k.tensor_stats(x, lo, hi, 2048), repeat)
    t_ref = _best(numpy_reference, max(1, repeat // 2))
    t_max = _best(lambda: x.max(), repeat)
    lines = [f"fused stats on {size / 1e6:.0f} M float32 (min, max, sum, sumsq, 2048-bin "
             f"histogram): {t_fused * 1e3:.1f} ms; NumPy reference (np.min, np.max, np.mean, "
             f"np.var, np.histogram) {t_ref * 1e3:.1f} ms -> {t_ref / t_fused:.1f}x faster; "
             f"x.max() {t_max * 1e3:.1f} ms -> fused = {t_fused / t_max:.1f}x x.max()"]
    small = x[: size // 5 // 3136 * 3136]
    y = small + 0.01 * rng.standard_normal(small.size).astype(np.float32)
    hist = k.tensor_stats(x, lo, hi, 2048)[4].astype(np.float64)
    act = small.reshape(-1, 64, 49)
    scales = np.full(64, 0.02, np.float32)
    zps = np.zeros(64, np.float32)
    cases = [
        ("tensor_stats", f"{size / 1e6:.0f} M", (x, lo, hi, 2048), {}),
        ("histogram_rebin", "2048 -> 2048 bins", (hist, lo, hi, 2 * lo, 2 * hi, 2048), {}),
        ("histogram_merge", "2 x 2048 bins", (hist, lo, hi, hist, 2 * lo, 2 * hi), {}),
        ("percentile_range", "2048 bins", (hist, lo, hi, 99.99), {}),
        ("entropy_threshold", "2048 bins, 8 bit", (hist, lo, hi, 8), {}),
        ("mse_threshold", "2048 bins, 8 bit", (hist, lo, hi, 8), {"symmetric": False}),
        ("fake_quantize", f"{small.size / 1e6:.0f} M", (small, 0.02, 128, 0, 255), {}),
        ("fake_quantize_per_channel", f"{small.size / 1e6:.0f} M, 64 ch",
         (act, scales, zps, 1, -128, 127), {}),
        ("error_stats", f"{small.size / 1e6:.0f} M", (small, y), {}),
    ]
    lines.append("| kernel | input | numba | NumPy twin | speedup |")
    lines.append("|---|---|---|---|---|")
    for name, what, a, kw in cases:
        fast = _best(lambda n=name, a=a, kw=kw: getattr(k, n)(*a, **kw), repeat)
        twin_repeat = 1 if name in ("entropy_threshold", "mse_threshold") else repeat
        slow = _best(lambda n=name, a=a, kw=kw: getattr(k, f"{n}_numpy")(*a, **kw), twin_repeat)
        lines.append(f"| {name} | {what} | {fast * 1e3:.2f} ms | {slow * 1e3:.2f} ms | "
                     f"{slow / fast:.1f}x |")
    return lines


# ------------------------------------------------------------------ main
def _free_mb() -> float:
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) for line in f}
    return info.get("MemAvailable", 0) / 1024.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18",
                        help="resnet18 | mobilenetv2 (mpsearch.testing.architectures) "
                             "or an .onnx path")
    parser.add_argument("--samples", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernel-size", type=int, default=50_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compare-samples", type=int, default=8,
                        help="samples whose activations score the ranges by quantization MSE")
    parser.add_argument("--skip-ort-histograms", action="store_true")
    parser.add_argument("--quick", action="store_true", help="N = 16, 32; small kernel array")
    parser.add_argument("--jobs", nargs="+", choices=JOBS, default=None,
                        help="run only these jobs (fp32 is always run); skips the range "
                             "comparison and the kernels")
    parser.add_argument("--method", choices=METHODS, default="entropy",
                        help="the cli job's --method (the pass is the same for every method)")
    parser.add_argument("--write", action="store_true",
                        help="also write the table to benchmarks/results/bench_calibration.md")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.samples, args.kernel_size, args.repeat = [16, 32], 5_000_000, 2
    import onnxruntime

    tmp = Path(tempfile.mkdtemp(prefix="bench_calibration_"))
    model = tmp / "model.onnx"
    described = build_model(args.model, model)
    x_all, data_described = build_data(max(args.samples))
    print(f"# Calibration benchmark\nmodel: {described}; data: {data_described}; batch "
          f"{args.batch_size}; {args.threads} threads; onnxruntime {onnxruntime.__version__}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n")
    results: dict[int, dict[str, dict[str, Any]]] = {}
    ort_mb_per_sample: float | None = None
    for n in sorted(args.samples):
        data = tmp / f"data{n}.npy"
        np.save(data, x_all[:n])
        jobs = ["fp32", "exposed", "mpsearch", "mpsearch-noopt", "cli", "ort-minmax"]
        if args.jobs:
            jobs = ["fp32", *(j for j in args.jobs if j != "fp32")]
        elif not args.skip_ort_histograms:
            for method in ("percentile", "entropy"):
                projected = None if ort_mb_per_sample is None else ort_mb_per_sample * n
                if projected is not None and projected > 0.6 * _free_mb():
                    print(f"N={n}: ort-{method} skipped: projected peak RSS "
                          f"{projected / 1024:.1f} GB (linear in N) > 60% of the "
                          f"{_free_mb() / 1024:.1f} GB available")
                    continue
                jobs.append(f"ort-{method}")
        results[n] = {}
        for job in jobs:
            results[n][job] = run_job(job, model, data, args)
            r = results[n][job]
            print(f"N={n} {job:15s} {r['seconds']:8.2f} s  peak RSS {r['peak_rss_mb']:7.0f} MB "
                  f"(data {r['data_mb']:.0f} MB)", flush=True)
        hist_rss = [results[n][j]["peak_rss_mb"] for j in ("ort-percentile", "ort-entropy")
                    if j in results[n]]
        if hist_rss and ort_mb_per_sample is None:
            ort_mb_per_sample = max(hist_rss) / n
    print()
    print(table(results))
    if args.write:
        publish("bench_calibration", "\n".join([
            "# Calibration", "", f"Model: {described}; data: {data_described}; batch "
            f"{args.batch_size} (the `mpsearch calibrate` row: its automatic batch); "
            f"{args.threads} threads. Peak RSS: each job's own process (VmHWM).", "",
            table(results)]), write=True, echo=False)
    if args.jobs:
        return
    smallest = min(args.samples)
    ort = {j.split("-", 1)[1]: r for j, r in results[smallest].items() if j.startswith("ort-")}
    print(f"\nRanges at N={smallest} (ORT defaults; ours: percentile symmetric 99.999 % like "
          "ORT's, entropy TensorRT-style KL on 2048 bins):")
    for label, job in (("optimize=False", "mpsearch-noopt"), ("default", "mpsearch")):
        print(f"mpsearch {label}:")
        for line in compare_ranges(model, x_all, results[smallest][job], ort,
                                   args.compare_samples):
            print("- " + line)
    exposed = results[smallest]["exposed"]
    print(f"\nactivation floats per sample: {exposed['floats_per_sample'] / 1e6:.1f} M "
          f"({exposed['exposed']} tensors)")
    print(f"\nKernels (2 threads, best of {args.repeat}):")
    for line in bench_kernels(args.kernel_size, args.repeat):
        print(line)


def command_table(model: str = "resnet18", samples: int = 256, method: str = "entropy"
                  ) -> tuple[str, str]:
    """The ``mpsearch calibrate`` row and its FP32 pass for one N, each in its own process
    (as ``--jobs cli --samples N``): a description of the model and data, and the table."""
    args = argparse.Namespace(batch_size=8, threads=2, method=method)
    with tempfile.TemporaryDirectory(prefix="bench_calibration_") as tmp:
        path = Path(tmp) / "model.onnx"
        described = build_model(model, path)
        x, data_described = build_data(samples)
        data = Path(tmp) / "data.npy"
        np.save(data, x)
        results = {samples: {job: run_job(job, path, data, args) for job in ("fp32", "cli")}}
    return f"model: {described}; data: {data_described}; {method}", table(results)


def table(results: dict[int, dict[str, dict[str, Any]]]) -> str:
    rows = ["| N | calibrator | method | wall s | x FP32 pass | peak RSS MB | RSS - data MB |",
            "|---|---|---|---|---|---|---|"]
    for n, jobs in results.items():
        fp32 = jobs["fp32"]["seconds"]
        rows.append(f"| {n} | FP32 inference pass | - | {fp32:.2f} | 1.00 | "
                    f"{jobs['fp32']['peak_rss_mb']:.0f} | "
                    f"{jobs['fp32']['peak_rss_mb'] - jobs['fp32']['data_mb']:.0f} |")
        if "cli" in jobs:
            r = jobs["cli"]
            rows.append(f"| {n} | `mpsearch calibrate`, default flags (process) | "
                        f"{r.get('method', 'minmax')} | "
                        f"{r['seconds']:.2f} | {r['seconds'] / fp32:.2f} | "
                        f"{r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] - r['data_mb']:.0f} |")
        if "exposed" in jobs:
            r = jobs["exposed"]
            rows.append(f"| {n} | ORT pass, {r['exposed']} tensors exposed, no statistics "
                        f"| - | {r['seconds']:.2f} | {r['seconds'] / fp32:.2f} | "
                        f"{r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] - r['data_mb']:.0f} |")
        for job in ("mpsearch", "mpsearch-noopt"):
            if job not in jobs:
                continue
            r = jobs[job]
            label = "mpsearch" + (" (optimize=False)" if job.endswith("noopt") else "")
            for method in METHODS:
                total = r["seconds"] + r["derive"][method]
                rows.append(f"| {n} | {label} | {method} | {total:.2f} | {total / fp32:.2f} | "
                            f"{r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] - r['data_mb']:.0f} |")
        for method in ORT_METHODS:
            r = jobs.get(f"ort-{method}")
            if r is None and not any(j.startswith("ort-") for j in jobs):
                continue
            if r is None:
                rows.append(f"| {n} | onnxruntime | {method} | skipped | | | |")
                continue
            rows.append(f"| {n} | onnxruntime | {method} | {r['seconds']:.2f} | "
                        f"{r['seconds'] / fp32:.2f} | {r['peak_rss_mb']:.0f} | "
                        f"{r['peak_rss_mb'] - r['data_mb']:.0f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
