"""Issue 35: models through the target toolchains (QNN HTP here; RKNN and Vela add rows).

For each model, each uniform format of the profile (int8, int16) is built by our QDQ builder,
compiled by the toolchain (placement, cost, artifact) and run on the held-out samples twice:
in ONNX Runtime's CPU EP and as the target computes it (the HTP emulator of onnxruntime-qnn,
running the exported context binary). The metric is accuracy where the data has labels
(the transformer fixture on its digits), else top-1 agreement with the FP32 model.

Models: the corpus's magika (a real file-type classifier; ``pip install --no-deps
magika==1.0.3``), the random-weight torchvision MobileNetV2 of ``benchmarks/models.py`` on
seeded random images (its agreement measures the format's noise, not a task), and the tests'
transformer fixture (which holds Erf and a LayerNorm).

Run from the repository root::

    python benchmarks/bench_targets.py            # writes benchmarks/results/bench_targets.md
    python benchmarks/bench_targets.py --models transformer --no-write
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _results import load_sibling  # noqa: E402

from mpsearch._io import atomic_write  # noqa: E402
from mpsearch.assignment import uniform_assignment  # noqa: E402
from mpsearch.data import Dataset, load_data  # noqa: E402
from mpsearch.errors import TargetError  # noqa: E402
from mpsearch.evaluate import Evaluator  # noqa: E402
from mpsearch.pipeline import prepare_inputs  # noqa: E402
from mpsearch.runtime import ort_version  # noqa: E402
from mpsearch.targets._verify import TargetVerifier, toolchain_version  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "bench_targets.md"
Loader = Callable[[], tuple[onnx.ModelProto | Path, Dataset]] | None


def _magika() -> tuple[onnx.ModelProto | Path, Dataset] | None:
    corpus = load_sibling("corpus")
    model = None if corpus is None else corpus.by_key("magika")
    path = None if model is None else model.path()
    if path is None:
        return None
    inputs, _ = model.build(96, 0)
    return path, Dataset(inputs=inputs, source="magika files (benchmarks/corpus.py)")


def _mobilenetv2() -> tuple[onnx.ModelProto | Path, Dataset] | None:
    models = load_sibling("models")
    if models is None:
        return None
    x = np.random.default_rng(0).standard_normal((48, 3, 224, 224)).astype(np.float32)
    return models.mobilenetv2(), Dataset(inputs={"input": x}, source="seeded N(0, 1) images")


def _transformer() -> tuple[onnx.ModelProto | Path, Dataset] | None:
    fixtures = ROOT / "tests" / "fixtures"
    return fixtures / "transformer.onnx", load_data(fixtures / "digits_eval.npz")


MODELS = {"magika": (_magika, 32), "mobilenetv2": (_mobilenetv2, 16),
          "transformer": (_transformer, 128)}


def _row(name: str, fmt: str, prepared: object, verifier: TargetVerifier,
         evaluator: Evaluator) -> list[str]:
    graph, profile = prepared.graph, prepared.profile  # type: ignore[attr-defined]
    assignment = uniform_assignment(graph, profile, fmt)
    start = time.perf_counter()
    try:
        model, compiled = verifier.compile(assignment)
    except TargetError as e:  # a result too: the toolchain refuses the model as a whole
        why = str(e).split("(", 1)[-1].rstrip(")")
        return [name, fmt, f"{evaluator.evaluate(verifier.quantizer.build(assignment)).value:.4f}",
                "does not compile", "-", "-", "-", "-", f"{time.perf_counter() - start:.1f}",
                "-", why[:160]]
    compile_s = time.perf_counter() - start
    ort = evaluator.evaluate(model).value
    start = time.perf_counter()
    target = evaluator.metrics(verifier.outputs(compiled, model, evaluator))
    run_s = time.perf_counter() - start
    on_htp = len(compiled.placements) - len(compiled.fallback)
    reasons = sorted({f"{p.node}: {p.reason}" for p in compiled.fallback})
    shown = "; ".join(reasons[:3]) + (f"; +{len(reasons) - 3} more" if len(reasons) > 3 else "")
    cycles = compiled.cost.get("cycles")
    return [name, fmt, f"{ort:.4f}", f"{target[evaluator.primary.name]:.4f}",
            f"{target[evaluator.primary.name] - ort:+.4f}",
            f"{on_htp} / {len(compiled.placements)}", "-" if cycles is None else f"{cycles:,.0f}",
            f"{compiled.cost.get('context_bytes', 0) / 1e3:,.0f} kB", f"{compile_s:.1f}",
            f"{run_s:.1f}", shown or "-"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    rows, skipped = [], []
    version = ""
    for name in args.models.split(","):
        load, samples = MODELS[name]
        loaded = load()
        if loaded is None:
            skipped.append(name)
            continue
        model, data = loaded
        prepared = prepare_inputs(model, "qnn_htp", data, calibration_samples=16)
        held = prepared.validation.take(samples)
        evaluator = Evaluator(prepared.graph, held, batch_size=16)
        with tempfile.TemporaryDirectory() as tmp:
            verifier = TargetVerifier(prepared.quantizer(), Path(tmp), next(held.batches(1)))
            version = toolchain_version(verifier.tool)
            for fmt in ("int8", "int16"):
                rows.append(_row(name, fmt, prepared, verifier, evaluator))
                print(" | ".join(rows[-1]), flush=True)
    head = ["model", "format", "ORT CPU", "HTP emulator", "diff", "nodes on HTP", "cycles",
            "context", "compile s", "emulate s", "on the CPU (the QNN EP's reason)"]
    table = "| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n" + "".join(
        "| " + " | ".join(r) + " |\n" for r in rows)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    flags = load_sibling("bench_quantize")
    cpu = flags.cpu_description() if flags is not None else platform.processor()
    text = (f"# Target toolchains (bench_targets.py)\n\n"
            f"Command: `python benchmarks/bench_targets.py --models {args.models}`; commit "
            f"{commit}; CPU {cpu}; onnxruntime {ort_version()}; {version}, htp_arch 73 "
            "(profile qnn_htp).\n\n"
            "Uniform formats of each model, our QDQ builder, compiled and run by the toolchain "
            "(the exported context binary on the x86 HTP emulator) beside ONNX Runtime's CPU "
            "EP on the same held-out samples; metric: accuracy (transformer, labelled digits) "
            "or top-1 agreement with FP32. Cycles: the emulator's median of 5 runs of one "
            "sample (it varies run to run). Dynamic batch dimensions fixed to 1.\n\n"
            + table + (f"\nNot run (package missing): {', '.join(skipped)}\n" if skipped else ""))
    print(text)
    if not args.no_write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(OUT, text.encode())
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
