"""Prepare once: load and check a spec's model, profile and data, split the data, calibrate
(cached in the run directory) and decide the recovery; every later stage shares the result."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from mpsearch import __version__
from mpsearch._io import write_json
from mpsearch.assignment import model_size
from mpsearch.calibration import CalibrationTable, calibrate, calibrate_cached
from mpsearch.data import Dataset, check_finite, check_signature, load_data
from mpsearch.errors import DataError, ModelError
from mpsearch.graph import ModelGraph, load_model
from mpsearch.profiles import HardwareProfile, check_profile_for_cpu, load_profile
from mpsearch.progress import Reporter
from mpsearch.quantize import Quantizer
from mpsearch.recovery import (
    DECISION_SAMPLES,
    CorrectedQuantizer,
    InputHessians,
    InputMeans,
    RecoveryDecision,
    RecoverySettings,
    recover,
)
from mpsearch.rundir import RunDir, read_json
from mpsearch.runtime import ort_version
from mpsearch.spec import SearchSpec
from mpsearch.summary import ModelSummary, summarize

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """Everything the stages share, computed once: the composer's own record."""

    graph: ModelGraph
    summary: ModelSummary
    profile: HardwareProfile
    calibration: Dataset
    validation: Dataset
    table: CalibrationTable
    method: str
    means: InputMeans | None = None  # set when builds are bias-corrected
    hessians: InputHessians | None = None  # set when builds round weights by GPTQ
    recovery: RecoveryDecision | None = None  # what `recovery: auto` decided, and why
    #: The one builder of this prepared model: every measurer, verifier and export shares it,
    #: and with it the quantized weights it caches.
    quantizer: Quantizer = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.means is not None or self.hessians is not None:
            quantizer: Quantizer = CorrectedQuantizer(
                self.graph, self.table, self.profile, means=self.means, hessians=self.hessians,
                method=self.method)
        else:
            quantizer = Quantizer(self.graph, self.table, self.profile, method=self.method)
        object.__setattr__(self, "quantizer", quantizer)

    def without_samples(self) -> Prepared:
        """This preparation, the same quantizer and its caches, holding one sample of its
        calibration and validation data each: for a caller that took the splits it needs
        (they are copies; keeping these too would double the data's memory)."""
        lean = replace(self, calibration=_first_sample(self.calibration),
                       validation=_first_sample(self.validation))
        object.__setattr__(lean, "quantizer", self.quantizer)
        return lean


def _first_sample(data: Dataset) -> Dataset:
    """A copy of ``data``'s first sample (not a view: a view keeps the whole array)."""
    labels = None if data.labels is None else np.array(data.labels[:1])
    return Dataset(inputs={name: np.array(a[:1]) for name, a in data.inputs.items()},
                   labels=labels, source=data.source)


def split_data(data: Dataset, calibration_samples: int, seed: int) -> tuple[Dataset, Dataset]:
    """Seeded split into (calibration, validation); calibration gets at most half the data."""
    if len(data) < 2:
        raise DataError(f"{data.source}: {len(data)} sample(s); need at least 2 to calibrate "
                        "and validate")
    count = max(1, min(calibration_samples, len(data) // 2))
    return data.split(count / len(data), seed)


def prepare_inputs(
    model: str | os.PathLike[str] | onnx.ModelProto | ModelGraph,
    profile: str | os.PathLike[str] | HardwareProfile,
    data: str | os.PathLike[str] | Dataset,
    *,
    calibration_samples: int = 256,
    method: str = "minmax",
    seed: int = 0,
    batch_size: int | None = None,
    threads: int = 2,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Reporter | None = None,
    cle: bool | None = False,
    bias_correction: bool | None = False,
    gptq: bool | None = False,
    smoothquant: bool | None = False,
    smoothquant_alpha: float = 0.5,
    held_out: float = 0.5,
    metric: str | None = None,
    recovery_cache: str | os.PathLike[str] | None = None,
) -> Prepared:
    """Load and check the inputs (objects or paths), split the data and calibrate once (or
    load the table cached in ``cache_dir``); ``batch_size`` None sizes the calibration
    batches from a memory budget (:func:`mpsearch.calibrate`). ``cle`` equalizes the graph
    after loading; ``smoothquant`` then migrates LayerNorm outputs' per-channel ranges into
    the MatMul/Gemm weights reading them, from the calibration split's channel maxima
    (``smoothquant_alpha``: migration strength), so calibration sees the smoothed graph;
    ``gptq`` rounds every build's 8-bit weights by GPTQ and ``bias_correction`` corrects its
    biases, both from the calibration split (:mod:`mpsearch.recovery`). A recovery setting
    None is decided by :func:`mpsearch.recovery.recover` on the search split (the validation
    split less its ``held_out`` fraction; ``metric`` is recorded beside the SQNRs); the
    decision is kept in ``recovery_cache`` (a JSON file) and read back when its inputs match."""
    graph = model if isinstance(model, ModelGraph) else load_model(model)
    hw = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
    dataset = data if isinstance(data, Dataset) else load_data(data)
    dataset = dataset.for_inputs([i.name for i in graph.inputs])
    check_signature(dataset, graph)
    _check_inputs(graph, hw, dataset)
    mismatch = check_profile_for_cpu(hw.name)
    if mismatch:
        logger.warning(mismatch)
    for node in graph.nodes.values():  # fail early when the target cannot run an op at all
        hw.formats_for_node(node)
    calib, valid = split_data(dataset, calibration_samples, seed)
    del dataset  # the splits are copies: the whole set would double the data's memory
    options: dict[str, Any] = dict(batch_size=batch_size, threads=threads, progress=progress)

    settings = RecoverySettings(cle=cle, bias_correction=bias_correction, gptq=gptq,
                                smoothquant=smoothquant, smoothquant_alpha=smoothquant_alpha)
    search = search_split(valid, held_out, seed)[0]
    key = _recovery_key(graph, hw, calib, search, settings, metric) if settings.auto else {}
    decided = _cached_decision(recovery_cache, key) if settings.auto else None
    if decided is not None:  # the decision this run made before: its methods, fixed
        settings = RecoverySettings(**decided.chosen, smoothquant_alpha=smoothquant_alpha)
    # Deciding, recovery calibrates the plain graph and each candidate transform in turn: the
    # one-table cache would take each for "another model" and rewrite itself every time, so
    # only the chosen graph's table is saved (below). Fixed settings calibrate one graph.
    cached = cache_dir if not settings.auto else None

    def calibrate_graph(g: ModelGraph) -> CalibrationTable:
        if cached is not None:
            return calibrate_cached(g, calib, cached, **options)
        return calibrate(g, calib, **options)

    done = recover(graph, hw, calib, search, calibrate_graph, settings, metric=metric,
                   threads=threads, progress=progress)
    if cache_dir is not None and done.decision is not None:
        done.table.save(cache_dir)  # the chosen graph's table, for the next prepare
    if recovery_cache is not None and done.decision is not None:
        write_json(Path(recovery_cache), {"key": key, "decision": done.decision.to_dict()})
    graph, table = done.graph, done.table
    logger.info("calibrated %d tensors on %d samples", len(table.tensors), len(calib))
    return Prepared(graph=graph, summary=summarize(graph), profile=hw, calibration=calib,
                    validation=valid, table=table, method=method, means=done.means,
                    hessians=done.hessians, recovery=decided or done.decision)


def _recovery_key(graph: ModelGraph, profile: HardwareProfile, calib: Dataset, search: Dataset,
                  settings: RecoverySettings, metric: str | None) -> dict[str, Any]:
    """What a recovery decision depends on (its cache key)."""
    return {"mpsearch": __version__, "model": graph.fingerprint,
            "profile": _digest(profile.to_dict()), "calibration": calib.fingerprint,
            "search": search.fingerprint, "settings": _digest(asdict(settings)), "metric": metric,
            "samples": DECISION_SAMPLES, "onnxruntime": ort_version()}


def _cached_decision(path: str | os.PathLike[str] | None, key: dict[str, Any]
                     ) -> RecoveryDecision | None:
    """The decision saved in ``path`` for ``key`` (None: none, or for other inputs)."""
    saved = None if path is None else read_json(Path(path))
    if not isinstance(saved, dict) or saved.get("key") != key:
        return None
    try:
        return RecoveryDecision.from_dict(saved["decision"])
    except (KeyError, TypeError, ValueError):
        return None


def _check_inputs(graph: ModelGraph, profile: HardwareProfile, data: Dataset) -> None:
    """Before any work: the model has weights to quantize, and no sample of the data (named
    by its place in the file, before any split) holds NaN or Inf."""
    if model_size(graph, profile, {}) == 0:
        raise ModelError(f"{graph.path or graph.name}: the model has no weights; mixed "
                         "precision has nothing to make smaller")
    batch = 256
    for index, feeds in enumerate(data.batches(batch)):
        check_finite(feeds, source=data.source, batch=index, batch_size=batch)


def prepare(spec: SearchSpec, run_dir: RunDir | str | Path | None = None, *,
            progress: Reporter | None = None) -> Prepared:
    """:func:`prepare_inputs` of a spec; the calibration table is cached in ``run_dir``."""
    run = None if run_dir is None else _rundir(run_dir)
    return prepare_inputs(spec.model, spec.profile, spec.data.source,
                          cache_dir=None if run is None else run.calibration, progress=progress,
                          recovery_cache=None if run is None else run.recovery_json,
                          **_prepare_options(spec))


def _prepare_options(spec: SearchSpec) -> dict[str, Any]:
    """The spec's calibration, split and ``recovery`` settings as :func:`prepare_inputs`
    takes them."""
    return dict(**asdict(spec.recovery), calibration_samples=spec.data.calibration,
                method=spec.calibration.method, seed=spec.data.seed,
                threads=spec.evaluation.threads, held_out=spec.data.held_out,
                metric=spec.metric)


def _rundir(run_dir: RunDir | str | Path) -> RunDir:
    return run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)


def search_split(validation: Dataset, held_out: float, seed: int) -> tuple[Dataset, Dataset]:
    """(search, held-out) from the validation data; held-out is never searched on (nor is
    recovery decided on it)."""
    if held_out <= 0 or len(validation) < 2:
        return validation, validation
    return validation.split(1.0 - held_out, seed)


def _splits(prepared: Prepared, spec: SearchSpec) -> tuple[Dataset, Dataset]:
    """(search, held-out) of ``prepared`` under ``spec``: :func:`search_split`."""
    return search_split(prepared.validation, spec.data.held_out, spec.data.seed)


def _digest(value: Any) -> str:
    """Short sha256 of ``value`` as canonical JSON (what a cache or a study is keyed by)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
