"""Layer-wise sensitivity on the fixture zoo and the real ImageNet models.

For each model (the seven fixtures on their held-out digits; the real ImageNet MobileNetV2 and
EfficientNet-Lite0 of ``benchmarks/real_models.py`` on its photos, scored by top-1 agreement
with FP32) under the ``x86_ort`` profile with MinMax ranges:

1. ``prepare`` (calibration cached in the run directory), then ``analyze`` end to end: every
   (node, format) of INT8 and INT16 quantized alone, the reverse view and both node-by-node
   curves (INT8); the wall time, the number of evaluation passes and the mean cost of one
   configuration: ``Quantizer.build``, session creation and the evaluation pass itself;
2. the fast proxy (each node's own output SQNR from 32 samples) and its Kendall tau-b against
   the end-to-end ranking, per format (tau of the rank orders, and of proxy SQNR against the
   end-to-end output SQNR);
3. ``analyze`` again on the same run directory: the rerun reads the cache.

Run directories go to ``runs/bench_sensitivity/<model>`` (gitignored); each model starts cold
(its run directories are deleted first) unless ``--resume`` is given. Run from the repository
root::

    .venv/bin/python -m benchmarks.bench_sensitivity

``--models sensitive,mobilenetv2_imagenet`` runs a subset; ``--limit-real N`` sets the
validation samples per evaluation of the real models (default 64; the fixtures use all 225);
``--no-write`` only prints (no ``benchmarks/results/bench_sensitivity.md``).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks._results import publish
from mpsearch.analysis import Analysis, kendall_tau
from mpsearch.data import load_data
from mpsearch.pipeline import analyze_prepared, prepare_inputs

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

SECTION = "## Sensitivity"
PROFILE = "x86_ort"
FIXTURES = ("resnet", "mobilenetv2", "efficientnet", "squeezenet", "shufflenet", "transformer",
            "sensitive")
REAL = ("mobilenetv2_imagenet", "efficientnet_lite0")
PROXY_SAMPLES = 32
LOG = logging.getLogger("bench_sensitivity")


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    name: str
    nodes: int
    pairs: int
    samples: int
    evaluations: int
    seconds: float
    build_ms: float
    session_ms: float
    eval_ms: float
    proxy_ms: float
    proxy_seconds: float
    tau_rank: dict[str, float]
    tau_sqnr: dict[str, float]
    rerun_seconds: float
    top: tuple[str, ...]
    fp32: float
    metric: str


def _taus(e2e: Analysis, proxy: Analysis) -> tuple[dict[str, float], dict[str, float]]:
    ranks, sqnrs = {}, {}
    for fmt in e2e.formats:
        ours = {r.node: r for r in e2e.sensitivity if r.format == fmt}
        fast = {r.node: r for r in proxy.sensitivity if r.format == fmt}
        nodes = [n for n in ours if n in fast]
        ranks[fmt] = kendall_tau([ours[n].rank for n in nodes], [fast[n].rank for n in nodes])
        cap = 200.0  # identical outputs (inf dB) tie at the cap
        sqnrs[fmt] = kendall_tau([min(ours[n].sqnr or cap, cap) for n in nodes],
                                 [min(fast[n].proxy_sqnr or cap, cap) for n in nodes])
    return ranks, sqnrs


def run_model(name: str, model: Path, data: Path, out: Path, limit: int | None,
              resume: bool = False) -> Row:
    if not resume:  # a cold run: no cached calibration or measurements
        for folder in (out / name, out / f"{name}-proxy"):
            shutil.rmtree(folder, ignore_errors=True)
    LOG.info("%s: preparing", name)
    prepared = prepare_inputs(model, PROFILE, load_data(data),
                              cache_dir=out / name / "calibration")
    start = time.perf_counter()
    e2e = analyze_prepared(prepared, out / name, samples=limit)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    proxy = analyze_prepared(prepared, out / f"{name}-proxy", proxy=True,
                             proxy_samples=PROXY_SAMPLES, samples=limit, distributions=False)
    proxy_seconds = time.perf_counter() - start
    start = time.perf_counter()
    again = analyze_prepared(prepared, out / name, samples=limit)
    rerun = time.perf_counter() - start
    assert again.evaluations == 0, "the rerun should read every measurement from the cache"
    tau_rank, tau_sqnr = _taus(e2e, proxy)
    timing = e2e.timing
    return Row(
        name=name, nodes=len({r.node for r in e2e.sensitivity}), pairs=len(e2e.sensitivity),
        samples=e2e.samples, evaluations=e2e.evaluations, seconds=seconds,
        build_ms=1e3 * timing.get("build_s", float("nan")),
        session_ms=1e3 * timing.get("session_s", float("nan")),
        eval_ms=1e3 * timing.get("eval_s", float("nan")),
        proxy_ms=1e3 * proxy.timing.get("proxy_s", float("nan")),
        proxy_seconds=proxy_seconds, tau_rank=tau_rank, tau_sqnr=tau_sqnr, rerun_seconds=rerun,
        top=tuple(f"{r.node} ({r.cls})" for r in e2e.most_sensitive(3)),
        fp32=e2e.fp32[e2e.metric], metric=e2e.metric)


def table(rows: list[Row]) -> str:
    head = ("| model | nodes | (node, format) | samples | passes | analyze s | build ms | "
            "session ms | pass ms | overhead / pass | s per node | proxy ms / cfg | "
            "proxy s | tau rank int8 / int16 | tau SQNR int8 / int16 | rerun s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        overhead = (r.build_ms + r.session_ms) / r.eval_ms if r.eval_ms else float("nan")
        lines.append(
            f"| {r.name} | {r.nodes} | {r.pairs} | {r.samples} | {r.evaluations} | "
            f"{r.seconds:.1f} | {r.build_ms:.1f} | {r.session_ms:.1f} | {r.eval_ms:.0f} | "
            f"{100 * overhead:.0f} % | {r.seconds / max(r.nodes, 1):.2f} | {r.proxy_ms:.1f} | "
            f"{r.proxy_seconds:.1f} | {_pair(r.tau_rank)} | {_pair(r.tau_sqnr)} | "
            f"{r.rerun_seconds:.2f} |")
    return "\n".join(lines)


def _pair(values: dict[str, float]) -> str:
    return " / ".join(f"{values.get(f, float('nan')):.2f}" for f in ("int8", "int16"))


def tops(rows: list[Row]) -> str:
    return "\n".join(f"- {r.name} ({r.metric} FP32 {r.fp32:.4f}): " + ", ".join(r.top)
                     for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join((*FIXTURES, *REAL)),
                        help="comma-separated subset of the fixtures and real models")
    parser.add_argument("--limit-real", type=int, default=64,
                        help="validation samples per evaluation of the real models")
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench_sensitivity"))
    parser.add_argument("--no-write", action="store_true",
                        help="print only; do not write benchmarks/results/bench_sensitivity.md")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the run directories' caches (default: a cold run)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    out = Path(args.out)
    rows = []
    real = {}
    if set(wanted) & set(REAL):
        from benchmarks import real_models

        real = real_models.ensure_real_models()
    for name in wanted:
        if name in FIXTURES:
            rows.append(run_model(name, ROOT / "tests" / "fixtures" / f"{name}.onnx",
                                  ROOT / "tests" / "fixtures" / "digits_eval.npz", out, None,
                                  args.resume))
        elif name in REAL:
            rows.append(run_model(name, real[name], real["photos"], out, args.limit_real,
                                  args.resume))
        else:
            raise SystemExit(f"unknown model '{name}'; use {', '.join((*FIXTURES, *REAL))}")
        print(table(rows[-1:]), flush=True)
    command = "python -m benchmarks.bench_sensitivity " + " ".join(
        shlex.quote(a) for a in sys.argv[1:])
    text = "\n".join([
        SECTION, "",
        f"Command: `{command.strip()}` ({platform.machine()}, {os.cpu_count()} cores, "
        f"profile {PROFILE}, MinMax; passes = evaluation passes of the end-to-end analysis: "
        "every (node, format) alone, the reverse view and both curves, INT8).", "",
        table(rows), "", "Most sensitive nodes (INT8, end to end):", "", tops(rows), ""])
    publish("bench_sensitivity", text, write=not args.no_write)


if __name__ == "__main__":
    main()
