"""Ethos-U through Vela: placement, cycles, SRAM and TFLite-vs-ORT numerics of our QDQ exports.

For each model and assignment (uniform int8; uniform int16 activations = 16x8 where the
profile allows it) the script builds our QDQ model, lowers it to TFLite, compiles it with
ethos-u-vela on each accelerator, and runs the TFLite file with TFLite's builtin kernels
against ONNX Runtime's QDQ outputs on held-out samples. Cycles, SRAM and placement are Vela's
figures (its performance model: there is no Ethos-U simulator on the package index); the
metric columns are the TFLite interpreter's and ONNX Runtime's.

Models: the test fixtures (ResNet, MobileNetV2, transformer; digits data), Magika (the corpus,
real files) and torchvision's MobileNetV2 at 224 x 224 (benchmarks/models.py, seeded weights,
seeded smooth noise images, scored against FP32's top class).

    python benchmarks/bench_targets_vela.py   # writes benchmarks/results/bench_targets_vela.md
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from mpsearch._io import atomic_write  # noqa: E402
from mpsearch.assignment import uniform_assignment  # noqa: E402
from mpsearch.data import Dataset, load_data  # noqa: E402
from mpsearch.pipeline import prepare_inputs  # noqa: E402
from mpsearch.targets import Compiled, TargetError, VelaToolchain  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "bench_targets_vela.md"
ACCELERATORS = ("ethos-u55-128", "ethos-u85-256")


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    model: Path
    data: Dataset
    labels: np.ndarray | None
    calibration: int
    evaluation: int


def _digits(name: str) -> Case:
    data = load_data(ROOT / "tests" / "fixtures" / "digits_eval.npz")
    return Case(f"{name} (fixture)", ROOT / "tests" / "fixtures" / f"{name}.onnx", data,
                data.labels, 64, 200)


def _magika() -> Case | None:
    from corpus import CORPUS

    entry = next(c for c in CORPUS if c.key == "magika")
    path = entry.path()
    if path is None:
        return None
    inputs, _ = entry.build(160, 0)
    return Case("magika (corpus)", path, Dataset(inputs=inputs), None, 64, 96)


def _mobilenet224(folder: Path) -> Case:
    import models

    path = models.save(models.mobilenetv2(batch="N", seed=0), folder / "mobilenetv2.onnx")
    rng = np.random.default_rng(0)
    coarse = rng.normal(size=(48, 3, 28, 28)).astype(np.float32)
    images = np.repeat(np.repeat(coarse, 8, axis=2), 8, axis=3)  # smooth, image-like blocks
    images += 0.3 * rng.normal(size=images.shape).astype(np.float32)
    return Case("mobilenetv2 224 (models.py)", path, Dataset(inputs={"input": images}),
                None, 16, 24)


def _agreement(ours: np.ndarray, theirs: np.ndarray, model: onnx.ModelProto
               ) -> tuple[str, float]:
    """(worst difference, in output steps when the output is quantized), top-1 agreement."""
    out = next((n for n in model.graph.node if n.output[0] == model.graph.output[0].name), None)
    scale = None
    if out is not None and out.op_type == "DequantizeLinear":
        init = {i.name: i for i in model.graph.initializer}
        scale = float(onnx.numpy_helper.to_array(init[out.input[1]]).reshape(-1)[0])
    diff = float(np.abs(ours - theirs).max())
    span = float(theirs.max() - theirs.min()) or 1.0
    worst = (f"{diff / scale:.0f} steps" if scale else f"{diff:.3g} abs") + (
        f" ({100 * diff / span:.2g} % of range)")
    return worst, float((ours.argmax(-1) == theirs.argmax(-1)).mean())


def _score(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> float:
    target = labels if labels is not None else reference.argmax(-1)
    return float((outputs.argmax(-1) == target).mean())


def _fallback(compiled: Compiled) -> str:
    if not compiled.fallback:
        return "none"
    kinds = Counter(p.reason.split(";")[0][:60] for p in compiled.fallback)
    return "; ".join(f"{n} x {k}" for k, n in kinds.most_common(3))


def _run_case(case: Case, fmt: str, vela: VelaToolchain, work: Path) -> list[str]:
    prep = prepare_inputs(case.model, "ethos_u55", case.data,
                          calibration_samples=case.calibration)
    model = prep.quantizer().build(uniform_assignment(prep.graph, prep.profile, fmt))
    held = {k: v[:case.evaluation] for k, v in prep.validation.inputs.items()}
    labels = None
    if case.labels is not None and prep.validation.labels is not None:
        labels = prep.validation.labels[:case.evaluation]
    fp32 = ort.InferenceSession(str(case.model), providers=["CPUExecutionProvider"])
    reference = fp32.run(None, held)[0]
    qdq = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = qdq.run(None, held)[0]
    rows = []
    sample = [{k: v[:1] for k, v in held.items()}]
    for accelerator in ACCELERATORS:
        start = time.perf_counter()
        try:
            compiled = vela.compile(model, work / f"{case.name[:8]}_{fmt}_{accelerator}",
                                    calibration=sample,
                                    settings={"accelerator_config": accelerator})
        except TargetError as e:
            rows.append(f"| {case.name} | {fmt} | {accelerator} | refused: {e} |"
                        + " |" * 9)
            continue
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        ours = vela.run(compiled, held)[0]
        run_s = time.perf_counter() - start
        worst, agree = _agreement(ours, theirs, model)
        c = compiled.cost
        placed = len(compiled.placements)
        rows.append(
            f"| {case.name} | {fmt} | {accelerator} | {c['cycles']:,.0f} | "
            f"{c['sram_bytes'] / 1024:.1f} | "
            f"{(c['flash_bytes'] + c['dram_bytes']) / 1024:.1f} | "
            f"{c.get('npu_ops', 0):.0f} / {c.get('cpu_ops', 0):.0f} | "
            f"{placed - len(compiled.fallback)} / {len(compiled.fallback)} | {_fallback(compiled)}"
            f" | {worst} | {agree:.3f} | {_score(theirs, reference, labels):.3f} / "
            f"{_score(ours, reference, labels):.3f} | {seconds:.1f} / {run_s:.1f} |")
    return rows


def _header(argv: list[str]) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    flags = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    int8 = [f for f in ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")
            if f in flags]
    return "\n".join([
        "# Ethos-U through Vela (generated by benchmarks/bench_targets_vela.py)", "",
        f"- command: `python {' '.join(['benchmarks/bench_targets_vela.py', *argv])}`",
        f"- git commit: {commit}",
        f"- CPU int8 flags: {', '.join(int8) or 'none'}",
        f"- onnxruntime {ort.__version__}, ethos-u-vela {metadata.version('ethos-u-vela')}, "
        f"ai-edge-litert {metadata.version('ai-edge-litert')}", "",
        "Cycles, SRAM, flash/DRAM and the NPU/CPU operator counts are Vela's own figures (its "
        "performance model; CPU operators are not costed by Vela). `nodes acc / cpu` counts our "
        "QDQ model's nodes by Vela's placement. `TFLite vs ORT` compares the TFLite file "
        "(TFLite's builtin kernels, no XNNPACK delegate) with ONNX Runtime's QDQ outputs on "
        "the held-out samples; "
        "`metric` is the fraction of held-out samples right (digits: the label; others: FP32's "
        "top class) under ORT QDQ / the TFLite file. `s` = compile / TFLite run seconds.", "",
        "| model | format | accelerator | cycles | SRAM KiB | flash+DRAM KiB | ops NPU / CPU "
        "| nodes acc / cpu | fallback (count x Vela's reason) | TFLite vs ORT worst | top-1 "
        "agree | metric ORT / TFLite | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="case name prefixes")
    args = parser.parse_args(argv)
    vela = VelaToolchain()
    problem = vela.missing()
    if problem:
        raise SystemExit(problem)
    lines = [_header(argv)]
    with TemporaryDirectory() as tmp:
        work = Path(tmp)
        cases = [_digits("resnet"), _digits("mobilenetv2"), _digits("transformer"),
                 _magika(), _mobilenet224(work)]
        for case in cases:
            if case is None or (args.only and not any(case.name.startswith(o)
                                                      for o in args.only)):
                continue
            for fmt in ("int8", "int16"):
                lines += _run_case(case, fmt, vela, work)
                print(lines[-1], flush=True)
    from vela_probes import probe_rows

    lines += ["", "## Profile claims checked: one operator per probe", "",
              "Each probe is one TFLite operator on a [1, 8, 8, 16] feature map "
              "(benchmarks/vela_probes.py). `Vela` is its placement and reason; `TFLite` "
              "says whether TFLite's kernels (the CPU fallback's) accept the file.", "",
              "| claim probed | operator | accelerator | Vela | Vela's reason | TFLite |",
              "|---|---|---|---|---|---|"]
    lines += probe_rows(ACCELERATORS)
    atomic_write(OUT, ("\n".join(lines) + "\n").encode())
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
