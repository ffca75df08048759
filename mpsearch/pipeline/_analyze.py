"""Analysis runs: sensitivity, distributions and the quantization curve of a prepared model,
measured by one shared measurer per data split and written to the run directory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from mpsearch import __version__
from mpsearch._results import write_analysis
from mpsearch.analysis import Analysis, Measurer, Thresholds, analyze
from mpsearch.assignment import model_size
from mpsearch.data import Dataset
from mpsearch.pipeline._prepare import Prepared, _digest, _rundir, prepare
from mpsearch.progress import Reporter
from mpsearch.rundir import MeasurementCache, RunDir
from mpsearch.runtime import ort_version
from mpsearch.spec import SearchSpec

#: In a search, the report's extra views (the reverse view and the curves) measure at most this
#: many configurations each; ``mpsearch analyze`` measures them whole. Each runs a near-whole
#: model, so at 16 the three views cost more than all the one-node rows of an 80-node model.
REPORT_VIEW_NODES = 8


@contextmanager
def _measuring(prepared: Prepared, data: Dataset, run: RunDir | None, name: str, *,
               metric: str | None, batch_size: int, threads: int,
               prefix_samples: int | None = None) -> Iterator[Measurer]:
    """The measurer of one data split, its cache (in ``run`` when given) keyed by every input
    it depends on and flushed when the block ends, however it ends; ``prefix_samples``: see
    :class:`~mpsearch.analysis.Measurer`."""
    key = {"mpsearch": __version__, "split": name, "model": prepared.graph.fingerprint,
           "table": prepared.table.data_fingerprint, "data": data.fingerprint,
           "samples": len(data), "profile": prepared.profile.name,
           "profile_digest": _digest(prepared.profile.to_dict()),
           "method": prepared.method, "metric": metric, "onnxruntime": ort_version(),
           "bias_correction": prepared.means is not None,
           "gptq": prepared.hessians is not None, "prefix_samples": prefix_samples}
    cache = MeasurementCache(None if run is None else run.measurements, name, key)
    try:
        yield Measurer(prepared.quantizer, data, metric=metric, batch_size=batch_size,
                       threads=threads, cache=cache, on_new=cache.changed,
                       prefix_samples=prefix_samples)
    finally:
        cache.flush()


def _spec_measuring(prepared: Prepared, spec: SearchSpec, data: Dataset, run: RunDir,
                    name: str, *, prefix_samples: int | None = None
                    ) -> AbstractContextManager[Measurer]:
    """:func:`_measuring` with the spec's settings; configurations measured on the first
    ``prefix_samples`` samples (the sensitivity samples) run only what they change."""
    evaluation = spec.evaluation
    return _measuring(prepared, data, run, name, metric=spec.metric,
                      batch_size=evaluation.batch_size, threads=evaluation.threads,
                      prefix_samples=prefix_samples)


def _write_inputs(run: RunDir, spec: SearchSpec, prepared: Prepared, kind: str) -> None:
    """The spec (YAML and JSON) and ``run.json``."""
    run.create()
    run.write_spec(spec)
    run.write_run(spec=spec.to_dict(), run={
        "kind": kind, "name": spec.name or Path(spec.model).name, "model": spec.model,
        "profile": spec.profile, "resolved_profile": prepared.profile.name,
        "data": spec.data.source,
        "spec": spec.path, "mpsearch": __version__, "onnxruntime": ort_version()})


def _write_model_info(run: RunDir, prepared: Prepared) -> None:
    run.write_model_info(summary=prepared.summary.to_dict(), profile=prepared.profile.to_dict())


# -- analyze ---------------------------------------------------------------------------------
def analyze_prepared(
    prepared: Prepared, run_dir: RunDir | str | Path | None = None, *,
    data: Dataset | None = None, metric: str | None = None, samples: int | None = None,
    batch_size: int = 64, threads: int = 2, progress: Reporter | None = None,
    **options: Any,
) -> Analysis:
    """:func:`mpsearch.analyze` of ``prepared`` on ``data`` (the validation split by default),
    its first ``samples`` samples; with ``run_dir``, measurements are cached there and the
    analysis files written. ``options`` go to :func:`mpsearch.analyze`."""
    run = None if run_dir is None else _rundir(run_dir).create()
    dataset = prepared.validation if data is None else data
    with _measuring(prepared, dataset, run, "validation", metric=metric,
                    batch_size=batch_size, threads=threads, prefix_samples=samples) as measurer:
        analysis = analyze(measurer, samples=samples, progress=progress, **options)
    if run is not None:
        _write_model_info(run, prepared)
        write_analysis(run, analysis, model_size(prepared.graph, prepared.profile, {}))
    return analysis


def analyze_run(
    spec: SearchSpec, run_dir: RunDir | str | Path, *, proxy: bool = False,
    reverse: bool | None = None, curve: bool | None = None,
    thresholds: Thresholds | None = None, progress: Reporter | None = None,
) -> Analysis:
    """``mpsearch analyze``: prepare, analyze the validation split (its first
    ``spec.evaluation.sensitivity_samples`` samples) and write the run directory."""
    run = _rundir(run_dir).create()
    prepared = prepare(spec, run, progress=progress)
    _write_inputs(run, spec, prepared, "analysis")
    evaluation = spec.evaluation
    return analyze_prepared(prepared, run, metric=spec.metric,
                            samples=evaluation.sensitivity_count(len(prepared.validation)),
                            batch_size=evaluation.batch_size, threads=evaluation.threads,
                            progress=progress, formats=spec.formats, proxy=proxy,
                            reverse=reverse, curve=curve, thresholds=thresholds)


# -- search ----------------------------------------------------------------------------------
