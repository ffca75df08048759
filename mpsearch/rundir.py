"""Every file of a run directory, in one place: its paths and typed, atomic reads and writes.

A run directory is what ``mpsearch search``, ``mpsearch analyze`` and a ``mpsearch serve`` job
write; the report, ``mpsearch export`` and the web server read it back. Consumes a folder;
produces :class:`RunDir`, whose attributes name each file, and the frozen results of a search
(:class:`FrontPoint`, :class:`Baseline`, :class:`Front`). Nothing else in mpsearch spells a file
name of a run directory.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mpsearch._io import atomic_write, write_json
from mpsearch.errors import SearchError
from mpsearch.spec import SearchSpec

__all__ = ["Baseline", "Front", "FrontPoint", "MeasurementCache", "RunDir", "atomic_write",
           "read_json", "write_json"]

logger = logging.getLogger(__name__)

_FLUSH_SECONDS = 5.0


def read_json(path: Path) -> Any:
    """The JSON value of ``path``, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows([[_cell(v) for v in row] for row in rows])
    atomic_write(path, buffer.getvalue().encode())


def _cell(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, (list, tuple)):
        return "; ".join(str(v) for v in value)
    return value


_LATENCY_FIELDS = ("latency", "latency_estimate", "latency_ms", "batch_latency_ms")


@dataclass(frozen=True, slots=True, kw_only=True)
class Baseline:
    """A reference model of a search (FP32, or a uniform format) on the held-out data.

    ``size`` is the weight bytes; ``latency`` is relative to FP32 (None when unknown): timed
    where :attr:`Front.latency_source` is ``measured``, else the profile's estimate.
    ``latency_abs`` is FP32's own latency in the same unit (seconds when measured).
    ``latency_estimate`` is the profile's estimate relative to FP32 (kept beside a measurement);
    ``latency_ms`` and ``batch_latency_ms`` are the measured medians at batch 1 and at the
    spec's batch size (:attr:`Front.latency_batch`).
    """

    metric: float
    size: int
    latency: float | None = None
    latency_abs: float | None = None
    latency_estimate: float | None = None
    latency_ms: float | None = None
    batch_latency_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Baseline:
        return cls(metric=float(data["metric"]), size=int(data["size"]),
                   **{k: data.get(k) for k in _LATENCY_FIELDS + ("latency_abs",)})


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontPoint:
    """One point of the Pareto front: its assignment and its held-out measurement.

    ``metric`` is measured on the held-out split, ``search_metric`` on the search split;
    ``counts`` tallies the searched nodes per format; ``differs_from_int8`` lists the nodes
    whose format differs from uniform INT8. ``interval`` is the 95 % interval of ``metric``
    (Wilson for accuracy-like metrics, bootstrap over samples otherwise; None when unknown);
    ``dominated`` is True when another front point beats this one on the held-out re-measure.
    The latency fields are :class:`Baseline`'s.
    """

    index: int
    trial: int
    metric: float
    search_metric: float | None
    size: int
    latency: float | None
    metrics: Mapping[str, float]
    assignment: Mapping[str, str]
    counts: Mapping[str, int]
    differs_from_int8: tuple[str, ...]
    source: str
    interval: tuple[float, float] | None = None
    dominated: bool = False
    latency_estimate: float | None = None
    latency_ms: float | None = None
    batch_latency_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["metrics"], data["assignment"] = dict(self.metrics), dict(self.assignment)
        data["counts"], data["differs_from_int8"] = dict(self.counts), list(self.differs_from_int8)
        data["interval"] = None if self.interval is None else list(self.interval)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FrontPoint:
        return cls(index=int(data["index"]), trial=int(data["trial"]),
                   metric=float(data["metric"]), search_metric=data.get("search_metric"),
                   size=int(data["size"]),
                   **{k: data.get(k) for k in _LATENCY_FIELDS},
                   metrics=_metrics(data.get("metrics", {})), assignment=dict(data["assignment"]),
                   counts=dict(data.get("counts", {})),
                   differs_from_int8=tuple(data.get("differs_from_int8", ())),
                   source=str(data.get("source", "")), interval=_interval(data.get("interval")),
                   dominated=bool(data.get("dominated", False)))


def _metrics(data: Mapping[str, Any]) -> dict[str, float]:
    """Metrics read back from JSON, where non-finite values were written as null: the SQNR of
    an output identical to FP32's (no noise) is infinite, anything else not a number."""
    return {name: (math.inf if name == "sqnr" else math.nan) if value is None else float(value)
            for name, value in data.items()}


def _interval(value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    low, high = value
    return (math.nan if low is None else float(low), math.nan if high is None else float(high))


@dataclass(frozen=True, slots=True, kw_only=True)
class Front:
    """``front.json``: the searched front re-measured on held-out data, with its baselines.

    ``latency_source``: ``measured`` (timed in ONNX Runtime on this host, batch 1 and
    ``latency_batch``), ``estimated`` (the profile's cost model) or None (unknown).
    ``stopped``: why the search ended before its trial budget (spec ``budget.patience``).
    """

    metric: str
    higher_is_better: bool
    objectives: tuple[str, ...]
    fp32: Baseline
    uniform: Mapping[str, Baseline]
    points: tuple[FrontPoint, ...]
    evaluations: int
    seconds: float
    timing: Mapping[str, float] = field(default_factory=dict)
    latency_source: str | None = None
    latency_batch: int | None = None
    stopped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "higher_is_better": self.higher_is_better,
                "objectives": list(self.objectives), "fp32": self.fp32.to_dict(),
                "uniform": {k: v.to_dict() for k, v in self.uniform.items()},
                "points": [p.to_dict() for p in self.points], "evaluations": self.evaluations,
                "seconds": self.seconds, "timing": dict(self.timing),
                "latency_source": self.latency_source, "latency_batch": self.latency_batch,
                "stopped": self.stopped}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Front:
        return cls(metric=str(data["metric"]), higher_is_better=bool(data["higher_is_better"]),
                   objectives=tuple(data.get("objectives", ("metric", "size"))),
                   fp32=Baseline.from_dict(data["fp32"]),
                   uniform={k: Baseline.from_dict(v) for k, v in data["uniform"].items()},
                   points=tuple(FrontPoint.from_dict(p) for p in data["points"]),
                   evaluations=int(data.get("evaluations", 0)),
                   seconds=float(data.get("seconds", 0.0)), timing=dict(data.get("timing", {})),
                   latency_source=data.get("latency_source"),
                   latency_batch=data.get("latency_batch"), stopped=data.get("stopped"))


class MeasurementCache(dict[str, Any]):
    """One data split's section of ``cache/measurements.json``: every measurement of that
    split's measurer, valid while the inputs' fingerprints (``key``) match; a section made for
    other inputs is dropped on load. Flushed at most every few seconds while measuring, and by
    :meth:`flush` (which keeps the other splits' sections)."""

    def __init__(self, path: Path | None, split: str, key: Mapping[str, Any]) -> None:
        super().__init__()
        self.path = path
        self.split = split
        self.key = dict(key)
        self._last = time.monotonic()
        section = self._sections().get(split)
        if isinstance(section, dict) and section.get("key") == self.key:
            self.update(section.get("entries", {}))
            logger.info("%s: %d cached %s measurements", path, len(self), split)
        elif section is not None:
            logger.info("%s: the %s cache is for other inputs; measuring again", path, split)

    def _sections(self) -> dict[str, Any]:
        stored = read_json(self.path) if self.path is not None else None
        sections = stored.get("splits") if isinstance(stored, dict) else None
        return sections if isinstance(sections, dict) else {}

    def changed(self) -> None:
        if time.monotonic() - self._last > _FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        self._last = time.monotonic()
        if self.path is not None:
            sections = self._sections()
            sections[self.split] = {"key": self.key, "entries": dict(self)}
            write_json(self.path, {"splits": sections})


def _leading_comments(lines: Sequence[str]) -> list[str]:
    out = []
    for line in lines:
        if not line.startswith("#"):
            break
        out.append(line)
    return out


class RunDir:
    """The files of one run directory (see the README's "Run directory")."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        p = self.path
        self.spec_yaml = p / "spec.yaml"
        self.spec_json = p / "spec.json"
        self.run_json = p / "run.json"
        self.summary_json = p / "summary.json"
        self.profile_json = p / "profile.json"
        self.calibration = p / "calibration"
        self.recovery_json = p / "recovery.json"  # what `recovery: auto` decided, and why
        self.measurements = p / "cache" / "measurements.json"
        self.sensitivity_json = p / "sensitivity.json"
        self.sensitivity_csv = p / "sensitivity.csv"
        self.reverse_csv = p / "reverse.csv"
        self.curve_json = p / "curve.json"
        self.curve_csv = p / "curve.csv"
        self.distributions_json = p / "distributions.json"
        self.distributions_csv = p / "distributions.csv"
        self.journal = p / "study.journal"
        self.trials_csv = p / "trials.csv"
        self.front_json = p / "front.json"
        self.front_csv = p / "front.csv"
        self.report_html = p / "report.html"
        self.progress_jsonl = p / "progress.jsonl"
        self.job_json = p / "job.json"
        self.job_log = p / "job.log"
        self.error_txt = p / "error.txt"
        self.hw_profile_yaml = p / "hw_profile.yaml"  # a profile a serve job derived

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def create(self) -> RunDir:
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    # -- inputs ----------------------------------------------------------------------------
    def write_spec(self, spec: SearchSpec, header: str = "") -> None:
        """``spec.yaml``: ``spec`` as YAML that ``load_spec`` reads back, under ``header``
        (comment lines; by default the comment lines the file already starts with)."""
        if not header and self.spec_yaml.is_file():
            lines = self.spec_yaml.read_text(encoding="utf-8").splitlines(keepends=True)
            header = "".join(line for line in _leading_comments(lines))
        atomic_write(self.spec_yaml, (header + spec.to_yaml()).encode())

    def write_run(self, *, spec: Mapping[str, Any], run: Mapping[str, Any]) -> None:
        """``spec.json`` and ``run.json`` (with the time)."""
        write_json(self.spec_json, dict(spec))
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        write_json(self.run_json, {**run, "created": created})

    def write_model_info(self, *, summary: Mapping[str, Any], profile: Mapping[str, Any]
                         ) -> None:
        """``summary.json`` and ``profile.json``: the model and the profile it is run under."""
        write_json(self.summary_json, dict(summary))
        write_json(self.profile_json, dict(profile))

    # -- analysis --------------------------------------------------------------------------
    def write_analysis(self, analysis: Mapping[str, Any], *, curve: Mapping[str, Any],
                       distributions: Mapping[str, Any],
                       tables: Mapping[str, tuple[Sequence[str], Sequence[Mapping[str, Any]]]],
                       ) -> None:
        """``sensitivity.json``, ``curve.json``, ``distributions.json`` and their CSV tables
        (``tables``: CSV name -> (header, rows))."""
        write_json(self.sensitivity_json, dict(analysis))
        write_json(self.curve_json, dict(curve))
        write_json(self.distributions_json, dict(distributions))
        for name, (header, rows) in tables.items():
            _csv(getattr(self, f"{name}_csv"), header,
                 [[row.get(column) for column in header] for row in rows])

    # -- search ----------------------------------------------------------------------------
    def write_front(self, front: Front) -> None:
        write_json(self.front_json, front.to_dict())
        _csv(self.front_csv,
             ["index", "trial", "metric", "metric_low", "metric_high", "dominated",
              "search_metric", "size", "latency", "latency_estimate", "latency_ms",
              "batch_latency_ms", "counts", "differs_from_int8", "assignment"],
             [[p.index, p.trial, p.metric, *(p.interval or (None, None)), p.dominated,
               p.search_metric, p.size, p.latency, p.latency_estimate, p.latency_ms,
               p.batch_latency_ms, json.dumps(dict(p.counts)),
               " ".join(p.differs_from_int8), json.dumps(dict(p.assignment))]
              for p in front.points])

    def write_trials(self, rows: Sequence[Sequence[Any]]) -> None:
        _csv(self.trials_csv, ["trial", "state", "metric", "size", "latency", "source"], rows)

    def read_front(self) -> Front:
        """The finished search's front (SearchError when this is not a finished run)."""
        data = read_json(self.front_json)
        if not isinstance(data, dict):
            raise SearchError(f"{self.path}: not a finished search run (no readable "
                              f"{self.front_json.name}); run `mpsearch search` first")
        try:
            return Front.from_dict(data)
        except (KeyError, TypeError, ValueError) as e:
            raise SearchError(f"{self.front_json}: unreadable front ({e}); run the search "
                              "again") from e
