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

from mpsearch._io import atomic_write, load_json, read_text, write_json
from mpsearch._wording import (
    estimate_text,
    format_bytes,
    formats_text,
    latency_words,
    speed_at,
    versus_fp32,
)
from mpsearch.errors import SearchError
from mpsearch.spec import SearchSpec

__all__ = ["Baseline", "Front", "FrontPoint", "MeasurementCache", "RunDir", "atomic_write",
           "check_measurements", "estimate_text", "format_bytes", "formats_text",
           "latency_words", "load_json", "load_run_json", "read_json", "read_llm_front",
           "speed_at", "versus_fp32", "write_json"]

logger = logging.getLogger(__name__)

_FLUSH_SECONDS = 5.0
_WARNED: set[Path] = set()  # damaged measurement caches already reported in this process


def read_json(path: Path) -> Any:
    """The JSON value of ``path``, or None when it is missing or damaged (too large, nested
    too deep, non-finite numbers, a link or a torn write): for readers that show what is
    there. Readers that act on a file use :func:`load_run_json`."""
    try:
        return load_run_json(path)
    except (FileNotFoundError, SearchError):
        return None


def load_run_json(path: Path, fix: str = "") -> Any:
    """The JSON value of a run directory's file ``path``, read under mpsearch's input budget
    (:func:`mpsearch._io.load_json`, no link followed); SearchError naming the file and the
    damage, FileNotFoundError when it is missing."""
    return load_json(path, SearchError, links=False,
                     fix=fix or "delete the file and rerun the stage that writes it")


def read_llm_front(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``front.json`` of a language-model run (``mpsearch llm search``); SearchError when it
    is missing, damaged or another kind of run's."""
    path = Path(run_dir) / "front.json"
    if not path.is_file():
        raise SearchError(f"{path}: no such file; run `mpsearch llm search` with --out "
                          f"{run_dir} first")
    front = load_run_json(path)
    if not isinstance(front, dict) or front.get("kind") != "llm":
        raise SearchError(f"{path}: not a language-model run; `mpsearch export` and "
                          "`mpsearch report` read the other runs")
    return front


def _csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows([[_cell(v) for v in row] for row in rows])
    atomic_write(path, buffer.getvalue().encode())


#: First characters that make a spreadsheet read a cell as a formula (CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    """One CSV cell: non-finite floats empty, sequences joined, and text a spreadsheet would
    run as a formula (a node named ``=HYPERLINK(...)``) prefixed with a quote; numbers, such
    as -1.5 (or the text "-1.5"), are written as numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, (list, tuple)):
        value = "; ".join(str(v) for v in value)
    if isinstance(value, str) and value.startswith(_FORMULA_START) and not _numeric(value):
        return "'" + value
    return value


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


_LATENCY_FIELDS = ("latency", "latency_estimate", "latency_ms", "batch_latency_ms")
_INTERVAL_FIELDS = ("latency_ms_interval", "batch_latency_ms_interval")


@dataclass(frozen=True, slots=True, kw_only=True)
class Baseline:
    """A reference model of a search (FP32, or a uniform format) on the held-out data.

    ``size`` is the weight bytes; ``latency`` is relative to FP32 (None when unknown): timed
    where :attr:`Front.latency_source` is ``measured``, else the profile's estimate.
    ``latency_abs`` is FP32's own latency in the same unit (seconds when measured).
    ``latency_estimate`` is the profile's estimate relative to FP32 (kept beside a measurement);
    ``latency_ms`` and ``batch_latency_ms`` are the measured medians at batch 1 and at the
    timing batch (:attr:`Front.latency_batch`, the spec's batch size up to 8), by
    :mod:`mpsearch.clock`; their ``_interval`` fields are the spread of those runs,
    ``[fastest, slowest]`` ms.
    """

    metric: float
    size: int
    latency: float | None = None
    latency_abs: float | None = None
    latency_estimate: float | None = None
    latency_ms: float | None = None
    batch_latency_ms: float | None = None
    latency_ms_interval: tuple[float, float] | None = None
    batch_latency_ms_interval: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in _INTERVAL_FIELDS:
            data[name] = None if data[name] is None else list(data[name])
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Baseline:
        return cls(metric=float(data["metric"]), size=int(data["size"]),
                   **{k: data.get(k) for k in _LATENCY_FIELDS + ("latency_abs",)},
                   latency_ms_interval=_interval(data.get("latency_ms_interval")),
                   batch_latency_ms_interval=_interval(data.get("batch_latency_ms_interval")))


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontPoint:
    """One point of the Pareto front: its assignment and its held-out measurement.

    ``metric`` is measured on the held-out split, ``search_metric`` on the search split;
    ``counts`` tallies the searched nodes per format; ``differs_from_int8`` lists the nodes
    whose format differs from uniform INT8. ``interval`` is the 95 % interval of ``metric``
    (Wilson for accuracy-like metrics, bootstrap over samples otherwise; None when unknown);
    ``dominated`` is True when a uniform baseline or another front point beats this one on the
    held-out re-measure (:mod:`mpsearch.pareto`'s rule); such a point is not ``shown`` as part
    of the front (kept for the record) and ``beaten_by`` names what beats it: a baseline's
    name (``fp32``, ``int8``, ...) or ``point K``. The latency fields are :class:`Baseline`'s.
    With a spec's ``verify: toolchain``,
    ``target_metric`` is the held-out metric as the profile's toolchain computes it (its
    emulator or simulator), ``target_placement`` where each node runs there (counts, the
    nodes on the CPU with the toolchain's reason, every placement) and ``target_cost`` the
    toolchain's own cost figures; None otherwise. ``target_failure`` says why the target's
    verification rejects the point (the toolchain crashed or failed to compile it, or its target
    metric lies outside the profile's tolerance of the ORT one); such a point is never
    recommended. None when it passed or was not verified.
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
    latency_ms_interval: tuple[float, float] | None = None
    batch_latency_ms_interval: tuple[float, float] | None = None
    shown: bool = True
    beaten_by: str | None = None
    target_metric: float | None = None
    target_placement: Mapping[str, Any] | None = None
    target_cost: Mapping[str, float] | None = None
    target_failure: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in _INTERVAL_FIELDS:
            data[name] = None if data[name] is None else list(data[name])
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
                   dominated=bool(data.get("dominated", False)),
                   latency_ms_interval=_interval(data.get("latency_ms_interval")),
                   batch_latency_ms_interval=_interval(data.get("batch_latency_ms_interval")),
                   shown=bool(data.get("shown", True)), beaten_by=data.get("beaten_by"),
                   target_metric=data.get("target_metric"),
                   target_placement=data.get("target_placement"),
                   target_cost=data.get("target_cost"),
                   target_failure=data.get("target_failure"))


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
    ``recommended``: the index of the shown point to deploy (None when no point meets the
    constraints) and ``recommendation`` its line for people (see docs/results.md).
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
    recommended: int | None = None
    recommendation: str | None = None

    @property
    def shown(self) -> tuple[FrontPoint, ...]:
        """The points shown as the front (no baseline or other point beats them)."""
        return tuple(p for p in self.points if p.shown)

    def latency_words(self, entry: FrontPoint | Baseline) -> str:
        """``entry``'s latency against FP32's in the one wording
        (:func:`mpsearch._wording.latency_words`)."""
        return latency_words(entry, self.fp32, batch=self.latency_batch,
                             source=self.latency_source)

    def hidden_note(self) -> str | None:
        """Why points are not shown, in a sentence (None when every point is): beaten (a
        baseline or point dominates it) or tied (one shown point stands for it)."""
        hidden = [p for p in self.points if not p.shown]
        if not hidden:
            return None
        parts = []
        beaten = ", ".join(f"point {p.index} by {p.beaten_by}" for p in hidden if p.dominated)
        if beaten:
            on = "size and latency" if "latency" in self.objectives else "size"
            parts.append(f"beaten on held-out {self.metric}, {on} ({beaten})")
        tied = ", ".join(f"point {p.index} with {p.beaten_by}" for p in hidden
                         if not p.dominated)
        if tied:
            parts.append(f"tied in size and {self.metric} interval ({tied})")
        return (f"{len(hidden)} of {len(self.points)} searched points hidden: "
                f"{'; '.join(parts)}; front.json keeps them with shown: false")

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "higher_is_better": self.higher_is_better,
                "objectives": list(self.objectives), "fp32": self.fp32.to_dict(),
                "uniform": {k: v.to_dict() for k, v in self.uniform.items()},
                "points": [p.to_dict() for p in self.points], "evaluations": self.evaluations,
                "seconds": self.seconds, "timing": dict(self.timing),
                "latency_source": self.latency_source, "latency_batch": self.latency_batch,
                "stopped": self.stopped, "recommended": self.recommended,
                "recommendation": self.recommendation}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Front:
        # JSON writes a non-finite metric as null: FP32's own SQNR is infinite
        fill = math.inf if data["metric"] == "sqnr" else math.nan

        def filled(entry: Mapping[str, Any]) -> Mapping[str, Any]:
            return entry if entry.get("metric") is not None else {**entry, "metric": fill}
        return cls(metric=str(data["metric"]), higher_is_better=bool(data["higher_is_better"]),
                   objectives=tuple(data.get("objectives", ("metric", "size"))),
                   fp32=Baseline.from_dict(filled(data["fp32"])),
                   uniform={k: Baseline.from_dict(filled(v)) for k, v in data["uniform"].items()},
                   points=tuple(FrontPoint.from_dict(filled(p)) for p in data["points"]),
                   evaluations=int(data.get("evaluations", 0)),
                   seconds=float(data.get("seconds", 0.0)), timing=dict(data.get("timing", {})),
                   latency_source=data.get("latency_source"),
                   latency_batch=data.get("latency_batch"), stopped=data.get("stopped"),
                   recommended=data.get("recommended"),
                   recommendation=data.get("recommendation"))


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
            _check_entries(path, split, section.get("entries", {}))
            self.update(section.get("entries", {}))
            logger.info("%s: %d cached %s measurements", path, len(self), split)
        elif section is not None:
            logger.info("%s: the %s cache is for other inputs; measuring again", path, split)

    def _sections(self) -> dict[str, Any]:
        """The file's sections; a damaged file is a cache to rebuild, with a warning."""
        stored = None
        if self.path is not None:
            try:
                stored = load_run_json(self.path, "it is a cache: measuring again")
            except FileNotFoundError:
                pass
            except SearchError as e:
                if self.path not in _WARNED:  # once, not for each split's section
                    _WARNED.add(self.path)
                    logger.warning("%s", e)
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


def check_measurements(path: Path) -> None:
    """SearchError naming the first cached measurement of ``path`` (``measurements.json``)
    whose fields have the wrong types; a missing or unreadable file is an empty cache."""
    stored = read_json(path)
    sections = stored.get("splits") if isinstance(stored, dict) else None
    for split, section in (sections.items() if isinstance(sections, dict) else ()):
        if isinstance(section, dict):
            _check_entries(path, str(split), section.get("entries", {}))


def _check_entries(path: Path | None, split: str, entries: Any) -> None:
    for name, entry in (entries.items() if isinstance(entries, dict) else [("*", None)]):
        problem = _entry_problem(entry)
        if problem:
            raise SearchError(f"{path}: {split} entry {str(name)[:60]!r} {problem}; delete the "
                              "file to measure again")


def _number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _entry_problem(entry: Any) -> str | None:
    """What makes a cached measurement unusable (wrong-typed fields), or None."""
    if not isinstance(entry, dict):
        return "is not a mapping"
    if "seconds" in entry:  # a latency
        ok = _number(entry["seconds"]) and entry["seconds"] is not None
        return None if ok else "has a 'seconds' that is not a number"
    metrics = entry.get("metrics")
    if not isinstance(metrics, dict) or not all(_number(v) for v in metrics.values()):
        return "has 'metrics' that are not numbers"
    if not isinstance(entry.get("primary"), str):
        return "has no 'primary' metric name"
    for key in ("samples", "build_s", "session_s", "eval_s", "kl"):
        if key in entry and not _number(entry[key]):
            return f"has a '{key}' that is not a number"
    return None


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
        self.verify_json = p / "verify.json"  # each verified configuration, as it finishes
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
            lines = read_text(self.spec_yaml, SearchError, links=False,
                              limit=1 << 20).splitlines(keepends=True)
            header = "".join(line for line in _leading_comments(lines))
        atomic_write(self.spec_yaml, (header + spec.to_yaml()).encode())

    def write_job(self, job: Mapping[str, Any]) -> None:
        """A ``mpsearch serve`` job's state (its kind, state, times, exit code)."""
        write_json(self.job_json, dict(job))

    def read_job(self) -> dict[str, Any]:
        """What :meth:`write_job` wrote; ``ValueError`` when it is missing or torn."""
        job = read_json(self.job_json)
        if not isinstance(job, dict):
            raise ValueError(f"{self.job_json}: missing, or not a JSON object")
        return job

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
             ["index", "trial", "metric", "metric_low", "metric_high", "dominated", "shown",
              "beaten_by", "search_metric", "size", "latency", "latency_estimate", "latency_ms",
              "latency_ms_low", "latency_ms_high", "batch_latency_ms", "batch_latency_ms_low",
              "batch_latency_ms_high", "counts", "differs_from_int8", "assignment"],
             [[p.index, p.trial, p.metric, *(p.interval or (None, None)), p.dominated, p.shown,
               p.beaten_by, p.search_metric, p.size, p.latency, p.latency_estimate,
               p.latency_ms, *(p.latency_ms_interval or (None, None)), p.batch_latency_ms,
               *(p.batch_latency_ms_interval or (None, None)), json.dumps(dict(p.counts)),
               " ".join(p.differs_from_int8), json.dumps(dict(p.assignment))]
              for p in front.points])

    def read_verified(self, key: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """The target verification records of ``verify.json`` (by assignment fingerprint)
        when it was written for the inputs ``key``; else none (a missing, torn or other
        inputs' file: verifying again is always safe)."""
        stored = read_json(self.verify_json)
        if not isinstance(stored, dict) or stored.get("key") != dict(key):
            return {}
        points = stored.get("points")
        return {str(k): v for k, v in points.items() if isinstance(v, dict)} \
            if isinstance(points, dict) else {}

    def write_verified(self, key: Mapping[str, Any], points: Mapping[str, Any]) -> None:
        """``verify.json``: every verification record so far, for the inputs ``key``."""
        write_json(self.verify_json, {"key": dict(key), "points": dict(points)})

    def write_trials(self, rows: Sequence[Sequence[Any]]) -> None:
        _csv(self.trials_csv, ["trial", "state", "metric", "size", "latency", "source"], rows)

    def read_front(self) -> Front:
        """The finished search's front (SearchError when this is not a finished run, or its
        front is damaged)."""
        try:
            data = load_run_json(self.front_json, "run the search again")
        except FileNotFoundError:
            data = None
        if not isinstance(data, dict):
            raise SearchError(f"{self.path}: not a finished search run (no readable "
                              f"{self.front_json.name}); run `mpsearch search` first")
        try:
            return Front.from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise SearchError(f"{self.front_json}: unreadable front ({e}); run the search "
                              "again") from e
