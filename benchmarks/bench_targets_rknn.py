"""Our QDQ exports through RKNN-Toolkit2 (rk3588): placement, cycles, simulator vs ONNX Runtime.

For each model and configuration it builds our QDQ model with the ``rk3588`` profile, compiles
it with :class:`mpsearch.targets.RknnToolchain` (the toolkit's own pinned environment,
``python -m mpsearch.targets.rknn_env``), runs the x86 simulator on held-out samples and ONNX
Runtime on the same QDQ file, and reports: layers on the NPU / CPU as the toolkit placed them,
the toolkit's estimated cycles, top-1 agreement simulator vs ORT, accuracy of both (when the
data has labels), top-1 agreement with the FP32 model, and the largest absolute and the relative
(L2) difference of the outputs. A configuration the toolkit refuses or crashes on is a row too,
with the toolkit's own words.

Models: ``demo`` (the bundled demo), ``transformer`` (tests/fixtures), ``magika`` (the corpus:
``pip install --no-deps magika==1.0.3``), ``mobilenetv2`` (``benchmarks/models.py``: the exact
torchvision architecture with seeded random weights, on seeded smooth random 224x224 images).

Run: ``python benchmarks/bench_targets_rknn.py`` (writes benchmarks/results/bench_targets_rknn.md;
``--models demo magika`` for a subset, ``--samples N`` held-out samples a model).
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import load_sibling  # noqa: E402

from mpsearch import make_assignment, uniform_assignment  # noqa: E402
from mpsearch._io import atomic_write  # noqa: E402
from mpsearch.data import Dataset, load_data  # noqa: E402
from mpsearch.demo import DEMO_DATA, DEMO_MODEL  # noqa: E402
from mpsearch.pipeline import Prepared, prepare_inputs  # noqa: E402
from mpsearch.targets import RknnToolchain, TargetError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "bench_targets_rknn.md"
FIXTURES = ROOT / "tests" / "fixtures"
Load = Callable[[int], tuple[onnx.ModelProto | Path, Dataset, str]]


def _demo(n: int) -> tuple[onnx.ModelProto | Path, Dataset, str]:
    return DEMO_MODEL, load_data(DEMO_DATA), "demo_data.npz (labelled digits)"


def _transformer(n: int) -> tuple[onnx.ModelProto | Path, Dataset, str]:
    return (FIXTURES / "transformer.onnx", load_data(FIXTURES / "digits_eval.npz"),
            "digits_eval.npz (labelled digits)")


def _magika(n: int) -> tuple[onnx.ModelProto | Path, Dataset, str]:
    corpus = load_sibling("corpus")
    assert corpus is not None
    entry = corpus.by_key("magika")
    path = entry.path()
    if path is None:
        raise SystemExit("magika is not installed: pip install --no-deps magika==1.0.3")
    inputs, _ = entry.build(2 * n, 0)
    return path, Dataset(inputs=inputs, source="magika features"), \
        "first/last 1 KiB of installed files (corpus.build_magika), no labels"


def _mobilenetv2(n: int) -> tuple[onnx.ModelProto | Path, Dataset, str]:
    models = load_sibling("models")
    assert models is not None
    rng = np.random.default_rng(0)
    coarse = rng.standard_normal((2 * n, 3, 28, 28)).astype(np.float32)
    x = np.repeat(np.repeat(coarse, 8, axis=2), 8, axis=3)
    x += 0.1 * rng.standard_normal(x.shape).astype(np.float32)
    return models.mobilenetv2(), Dataset(inputs={"input": x}, source="random images"), \
        "seeded smooth random 224x224 images, no labels"


MODELS: dict[str, Load] = {"demo": _demo, "transformer": _transformer, "magika": _magika,
                           "mobilenetv2": _mobilenetv2}


def _configs(prepared: Prepared) -> dict[str, dict[str, str]]:
    """Uniform INT8, FP16 (where the profile allows it, FP32 elsewhere) and INT8 on
    Conv/MatMul/Gemm with FP16 elsewhere."""
    graph, profile = prepared.graph, prepared.profile
    int8 = dict(uniform_assignment(graph, profile, "int8"))
    allowed = {n: profile.formats_for_node(node) for n, node in graph.nodes.items()}
    fp16 = {n: "fp16" for n in int8 if "fp16" in allowed[n]}
    mixed = {n: (f if graph.nodes[n].op_type in ("Conv", "MatMul", "Gemm") else fp16.get(n))
             for n, f in int8.items()}
    return {"int8": int8, "fp16": fp16,
            "int8 Conv/MatMul/Gemm, fp16 rest": {n: f for n, f in mixed.items() if f}}


def top1(a: np.ndarray) -> np.ndarray:
    return np.asarray(a.reshape(len(a), -1).argmax(1))


def _measure(tc: RknnToolchain, prepared: Prepared, formats: dict[str, str], n: int,
             workdir: Path) -> dict[str, Any]:
    model = prepared.quantizer().build(make_assignment(prepared.graph, prepared.profile,
                                                       formats))
    inputs = {k: np.asarray(v[:n]) for k, v in prepared.validation.inputs.items()}
    first = {k: v[:1] for k, v in inputs.items()}
    start = time.perf_counter()
    try:
        compiled = tc.compile(model, workdir, calibration=[first], settings={})
    except TargetError as e:
        return {"error": str(e).split("; full log")[0].split("; its log")[0]}
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    try:
        sim = tc.run(compiled, inputs)[0]
    except TargetError as e:
        return {"error": str(e).split("; full log")[0]}
    run_s = time.perf_counter() - start
    ref = ort.InferenceSession(model.SerializeToString()).run(None, inputs)[0]
    fp32 = ort.InferenceSession(prepared.graph.model.SerializeToString()).run(None, inputs)[0]
    labels = prepared.validation.labels
    row: dict[str, Any] = {
        "placed": Counter((p.unit, p.precision) for p in compiled.placements),
        "cpu_nodes": sorted({p.node.rsplit("/", 1)[-1] for p in compiled.fallback}),
        "cycles": compiled.cost["cycles"], "compile_s": compile_s, "run_s": run_s,
        "top1_ort": float((top1(sim) == top1(ref)).mean()),
        "top1_fp32_sim": float((top1(sim) == top1(fp32)).mean()),
        "top1_fp32_ort": float((top1(ref) == top1(fp32)).mean()),
        "max_abs": float(np.abs(sim - ref).max()),
        "rel_l2": float(np.linalg.norm(sim - ref) / max(np.linalg.norm(ref), 1e-12)),
        "version": compiled.version}
    if labels is not None:
        row["acc_sim"] = float((top1(sim) == labels[:n]).mean())
        row["acc_ort"] = float((top1(ref) == labels[:n]).mean())
    return row


def _line(model: str, config: str, row: dict[str, Any]) -> str:
    if "error" in row:
        return f"| {model} | {config} | refused: {row['error']} |" + " |" * 8
    placed = ", ".join(f"{c} {u[:3]} {p}" for (u, p), c in sorted(row["placed"].items()))
    acc = (f"{row['acc_sim']:.4f} / {row['acc_ort']:.4f}" if "acc_sim" in row else "-")
    cpu = ", ".join(row["cpu_nodes"][:4]) or "-"
    return (f"| {model} | {config} | {placed} | {cpu} | {row['cycles']:.0f} | "
            f"{row['top1_ort']:.4f} | {acc} | {row['top1_fp32_sim']:.4f} / "
            f"{row['top1_fp32_ort']:.4f} | {row['max_abs']:.4g} | {row['rel_l2']:.4f} | "
            f"{row['compile_s']:.1f} / {row['run_s']:.1f} |")


def _header(argv: list[str], samples: int, version: str) -> list[str]:
    flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        line = next((ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")), "")
        want = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")
        flags = " ".join(f for f in line.split() if f in want)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    return ["# RKNN-Toolkit2 (rk3588): placement, cycles, simulator vs ONNX Runtime", "",
            "Generated by `python benchmarks/bench_targets_rknn.py"
            + "".join(f" {a}" for a in argv) + "`; do not edit.", "",
            f"- git commit: {commit}; CPU int8 flags: {flags or 'none'}; "
            f"{platform.processor() or platform.machine()}",
            f"- onnxruntime {ort.__version__} (our QDQ reference); RKNN-Toolkit2 {version} "
            "x86 simulator, target_platform rk3588", f"- held-out samples a model: {samples}",
            ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    tc = RknnToolchain()
    if tc.missing():
        raise SystemExit(tc.missing())
    lines, data_notes, version = [], [], ""
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model, data, note = MODELS[name](args.samples)
            data_notes.append(f"- {name}: {note}")
            prepared = prepare_inputs(model, "rk3588", data, calibration_samples=args.samples)
            for config, formats in _configs(prepared).items():
                row = _measure(tc, prepared, formats, args.samples,
                               Path(tmp) / f"{name}_{len(lines)}")
                version = row.get("version", version)
                lines.append(_line(name, config, row))
                print(lines[-1], flush=True)
    text = _header(sys.argv[1:] if argv is None else argv, args.samples, version) + [
        "Data:", *data_notes, "",
        "Columns: nodes as the toolkit placed them (acc = NPU, cpu = CPU, with the dtype of "
        "its layer table); CPU nodes (first four); the toolkit's estimated cycles (sum of its "
        "Total column); top-1 agreement simulator vs ORT on the same QDQ file; accuracy "
        "simulator / ORT (labelled data); top-1 agreement with the FP32 model, simulator / "
        "ORT; max |sim - ORT| and ||sim - ORT|| / ||ORT|| of the first output; compile / "
        "simulate seconds.", "",
        "| model | config | placement | CPU nodes | cycles | top-1 sim=ORT | acc sim / ORT "
        "| top-1 vs FP32 sim / ORT | max abs | rel L2 | compile / sim s |",
        "|---|---|---|---|---|---|---|---|---|---|---|", *lines, ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, "\n".join(text).encode())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
