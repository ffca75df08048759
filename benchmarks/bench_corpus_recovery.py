"""Bias correction and cross-layer equalization across the real-model corpus.

For every installed corpus model (:mod:`mpsearch.testing.corpus`), uniform INT8 under
``x86_ort_auto`` built four ways from the same calibration samples: plain, bias-corrected (the
calibration split's input means, what ``recovery: {bias_correction: true}`` does), equalized
(CLE, the pipeline's ``clip='skip'``) and both; and ORT's ``quantize_static`` on the same
normalized float model (:mod:`mpsearch.testing.ort_baseline`). Each is scored on the held-out
samples by the corpus metric (what ``tests/integration/test_corpus.py`` compares) and by
the output's median SQNR against FP32. The question it answers: should bias correction be on
by default?

Run from the repository root::

    python -m benchmarks.bench_corpus_recovery [KEY ...]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

import mpsearch
from mpsearch.data import Dataset
from mpsearch.recovery import correct_biases, equalize, input_means
from mpsearch.testing import corpus
from mpsearch.testing.corpus_check import run_outputs, split_samples
from mpsearch.testing.ort_baseline import ort_int8

VARIANTS = ("plain", "bc", "cle", "cle+bc")


def median_sqnr(output: np.ndarray, reference: np.ndarray) -> float:
    """Median over samples of 10 log10(|reference|^2 / |output - reference|^2), in dB."""
    ref = reference.reshape(len(reference), -1).astype(np.float64)
    err = output.reshape(len(output), -1).astype(np.float64) - ref
    ratio = (ref ** 2).sum(1) / np.maximum((err ** 2).sum(1), 1e-30)
    return float(np.median(10 * np.log10(ratio)))


def run(model: corpus.CorpusModel, work: Path) -> dict[str, tuple[int, float]]:
    """{variant: (metric, median SQNR dB)} of one corpus model, ORT's under ``ort``."""
    graph = mpsearch.load_model(model.path(work))
    calibration_inputs, held, held_labels = split_samples(model)
    calibration = Dataset(inputs=calibration_inputs)
    profile = mpsearch.load_profile("x86_ort_auto")
    float_path = work / f"{model.key}.fp32.onnx"
    onnx.save(graph.model, float_path)
    output = graph.outputs[0].name
    reference = run_outputs(float_path, held, output)
    paths: dict[str, Path] = {}
    for cle in (False, True):
        g = equalize(graph) if cle else graph
        table = mpsearch.calibrate(g, calibration)
        built = mpsearch.build_qdq(g, table, profile,
                                   mpsearch.uniform_assignment(g, profile, "int8"))
        corrected = correct_biases(built, g, input_means(g, calibration))
        for bc, proto in ((False, built), (True, corrected)):
            name = VARIANTS[2 * cle + bc]
            paths[name] = work / f"{model.key}.{name}.onnx"
            onnx.save(proto, paths[name])
    paths["ort"] = ort_int8(float_path, work / f"{model.key}.ort.onnx",
                            calibration.inputs)
    scores = {}
    for name, path in paths.items():
        out = run_outputs(path, held, output)
        scores[name] = (int(model.metric(out, reference, held_labels)),
                        median_sqnr(out, reference))
    return scores


def main() -> None:  # pragma: no cover - prints the table
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("keys", nargs="*", help="corpus model keys (default: all installed)")
    args = parser.parse_args()
    models = [corpus.by_key(k) for k in args.keys] if args.keys else list(corpus.CORPUS)
    print("| model | n | " + " | ".join(VARIANTS) + " | ORT INT8 |")
    print("|---|---|" + "---|" * (len(VARIANTS) + 1))
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            work = Path(tmp) / model.key
            work.mkdir()
            if model.path(work) is None:
                print(f"| {model.key} | not installed |")
                continue
            start = time.perf_counter()
            scores = run(model, work)
            cells = " | ".join(f"{m} ({s:.1f} dB)" for m, s in
                               (scores[v] for v in (*VARIANTS, "ort")))
            print(f"| {model.key} | {model.evaluation} | {cells} |  <!-- "
                  f"{time.perf_counter() - start:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
