"""The one place where the stages are composed: model + profile + data -> prepared inputs.

Consumes an ONNX model, a hardware profile and a data source; produces a frozen
:class:`Prepared` holding the normalized graph, its summary, the profile, the seeded
calibration / validation split and the calibration table (loaded from ``cache_dir`` when its
fingerprints match, else computed once and saved there). Every later stage (quantize, analyze,
search, export) starts from it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import onnx

from mpsearch._io import write_json, write_model
from mpsearch.calibration import CalibrationTable, calibrate, calibrate_cached
from mpsearch.data import Dataset, check_signature, load_data
from mpsearch.errors import DataError
from mpsearch.graph import ModelGraph, load_model
from mpsearch.profiles import HardwareProfile, check_profile_for_cpu, load_profile
from mpsearch.summary import ModelSummary, summarize

__all__ = ["Prepared", "prepare", "split_data", "write_json", "write_model"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """Everything the quantization stages share, computed once."""

    graph: ModelGraph
    summary: ModelSummary
    profile: HardwareProfile
    calibration: Dataset
    validation: Dataset
    table: CalibrationTable
    method: str


def split_data(data: Dataset, calibration_samples: int, seed: int) -> tuple[Dataset, Dataset]:
    """Seeded split into (calibration, validation); calibration gets at most half the data."""
    if len(data) < 2:
        raise DataError(f"{data.source}: {len(data)} sample(s); need at least 2 to calibrate "
                        "and validate")
    count = max(1, min(calibration_samples, len(data) // 2))
    return data.split(count / len(data), seed)


def prepare(
    model: str | os.PathLike[str] | onnx.ModelProto | ModelGraph,
    profile: str | os.PathLike[str] | HardwareProfile,
    data: str | os.PathLike[str] | Dataset,
    *,
    calibration_samples: int = 256,
    method: str = "minmax",
    seed: int = 0,
    batch_size: int = 32,
    threads: int = 2,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
) -> Prepared:
    """Load and check the inputs, split the data and calibrate once (or load the cache)."""
    graph = model if isinstance(model, ModelGraph) else load_model(model)
    hw = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
    dataset = data if isinstance(data, Dataset) else load_data(data)
    check_signature(dataset, graph)
    mismatch = check_profile_for_cpu(hw.name)
    if mismatch:
        logger.warning(mismatch)
    for node in graph.nodes.values():  # fail early when the target cannot run an op at all
        hw.formats_for_node(node)
    calib, valid = split_data(dataset, calibration_samples, seed)
    options: dict[str, Any] = dict(batch_size=batch_size, threads=threads, progress=progress)
    if cache_dir is not None:
        table = calibrate_cached(graph, calib, cache_dir, **options)
    else:
        table = calibrate(graph, calib, **options)
    logger.info("calibrated %d tensors on %d samples", len(table.tensors), len(calib))
    return Prepared(graph=graph, summary=summarize(graph), profile=hw, calibration=calib,
                    validation=valid, table=table, method=method)
