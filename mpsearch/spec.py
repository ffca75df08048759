"""Search specs: a YAML file -> a frozen, validated :class:`SearchSpec`.

Parsed once, strictly, at the edge: an unknown key is an error with the file, the line and
"did you mean"; paths are resolved relative to the spec file. Example (``searches/demo.yaml``)::

    model: ../mpsearch/demo/demo.onnx
    profile: x86_ort
    data: {source: ../mpsearch/demo/demo_data.npz, calibration: 128, held_out: 0.5, seed: 0}
    metric: accuracy
    objectives: [metric, size]   # default: metric, size and latency where this host
                                 # times the profile's target, else metric, size
    constraints: {max_metric_drop: 0.05}
    budget: {trials: 60, patience: 20}   # patience: stop when 20 trials in a row do not
                                         # move the front (0: run every trial)
    sampler: auto
    seed: 0
    # storage: postgresql://user:pw@host/db   # several workers share one study
    # heartbeat: 60    # seconds; a worker silent for 2x this has its trial failed and retried
    recovery: auto    # accuracy recovery (mpsearch.recovery): auto (default), off, or
                      # {cle, bias_correction, gptq, smoothquant: true | false | auto,
                      #  smoothquant_alpha: 0.5}; auto decides on the search split
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from mpsearch._yaml import Section, load_yaml
from mpsearch.errors import SpecError

__all__ = ["MAX_SEED", "MAX_THREADS", "METHODS", "OBJECTIVES", "RECOVERY_METHODS",
           "SAMPLER_NAMES", "SEARCH_SCORES", "SearchSpec", "Thresholds", "load_spec",
           "machine_threads"]

logger = logging.getLogger(__name__)

SAMPLER_NAMES = ("auto", "tpe", "nsga2", "random")
OBJECTIVES = ("metric", "size", "latency")
#: What the search optimizes against size: ``metric`` (the task metric; an accuracy-like one
#: with an SQNR tie-break below one sample), ``sqnr`` (the model output's SQNR against FP32,
#: dB: continuous, and on MobileNetV2 within 0.3 dB between the search and held-out splits
#: where agreement differed by up to 0.09), ``auto``: ``sqnr`` when the metric is ``agreement``
#: (itself fidelity to FP32), else ``metric``. The task metric is measured either way: it
#: decides the constraints, and the front is re-measured in it on held-out data.
SEARCH_SCORES = ("auto", "metric", "sqnr")
#: Activation range methods of a calibration table (see :meth:`CalibrationTable.range`).
METHODS = ("minmax", "percentile", "entropy", "mse")
#: Seeds are NumPy's and Optuna's: 0 to 2**32 - 1.
MAX_SEED = 2**32 - 1
#: More threads than this is a typo, refused; up to it, :func:`machine_threads` caps a count
#: at the CPUs this machine has (400 ONNX Runtime threads on 2 cores run 20x slower).
MAX_THREADS = 1024
#: Integer settings: field -> (spec key, CLI flag or "", minimum, maximum or None).
_INT_BOUNDS: dict[str, tuple[str, str, int, int | None]] = {
    "calibration_samples": ("data.calibration", "--calibration-samples", 1, None),
    "data_seed": ("data.seed", "--seed", 0, MAX_SEED),
    "seed": ("seed", "--seed", 0, MAX_SEED),
    "trials": ("budget.trials", "--trials", 1, None),
    "patience": ("budget.patience", "", 1, None),
    "max_size_bytes": ("constraints.max_size_bytes", "", 1, None),
    "batch_size": ("evaluation.batch_size", "", 1, 1 << 16),
    "threads": ("evaluation.threads", "--threads", 1, MAX_THREADS),
    "chunks": ("evaluation.chunks", "", 1, 1 << 16),
    "sensitivity_limit": ("evaluation.sensitivity_samples", "", 1, None),
}


def machine_threads(threads: int) -> int:
    """``threads`` capped at this machine's CPU count (logged when capped)."""
    cpus = os.cpu_count() or 1
    if threads > cpus:
        logger.info("using %d threads, the CPUs of this machine, instead of %d", cpus, threads)
        return cpus
    return threads


def _bound_error(name: str, value: Any) -> str | None:
    """What is wrong with integer setting ``name`` = ``value``, or None."""
    key, flag, low, high = _INT_BOUNDS[name]
    where = f"{key} ({flag})" if flag else key
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{where} must be an integer, got {value!r}"
    if value < low:
        return f"{where} must be at least {low}, got {value}"
    if high is not None and value > high:
        return f"{where} must be at most {high}, got {value}"
    return None


#: ``verify``: ``toolchain`` runs the profile's toolchain on every configuration (one the
#: target would not run wholly on its accelerator, or cannot compile, is infeasible) and on
#: the front points (their held-out metric as the target computes it, placement, cost);
#: ``front`` only on the front points (fallback allowed, and shown); ``none`` not at all.
VERIFY = ("none", "front", "toolchain")


@dataclass(frozen=True, slots=True, kw_only=True)
class Thresholds:
    """When a (node, format) is classed ``high``, ``medium`` or ``low`` sensitivity.

    ``high`` when its metric drop is at least ``high_drop`` or the model-output SQNR is below
    ``high_sqnr`` dB; else ``medium`` when the drop is at least ``medium_drop`` or the SQNR is
    below ``medium_sqnr``; else ``low``. Drops are in units of the primary metric (0.01 = one
    accuracy point). In proxy mode the SQNR is the node's own output SQNR (there is no drop).
    """

    high_drop: float = 0.01
    medium_drop: float = 0.002
    high_sqnr: float = 20.0
    medium_sqnr: float = 30.0

    def __post_init__(self) -> None:
        if not 0 <= self.medium_drop <= self.high_drop:
            raise SpecError(f"thresholds: need 0 <= medium_drop <= high_drop, got medium_drop="
                            f"{self.medium_drop}, high_drop={self.high_drop}; swap or fix them")
        if self.high_sqnr > self.medium_sqnr:
            raise SpecError(f"thresholds: need high_sqnr <= medium_sqnr (dB), got high_sqnr="
                            f"{self.high_sqnr}, medium_sqnr={self.medium_sqnr}; swap them")

    def classify(self, drop: float | None, sqnr: float | None) -> str:
        """``low``, ``medium`` or ``high`` for a metric drop and an output SQNR (either None)."""
        d = -math.inf if drop is None or math.isnan(drop) else drop
        s = math.inf if sqnr is None or math.isnan(sqnr) else sqnr
        if d >= self.high_drop or s < self.high_sqnr:
            return "high"
        if d >= self.medium_drop or s < self.medium_sqnr:
            return "medium"
        return "low"

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpec:
    """Everything one search needs; ``to_dict()`` is written to the run directory."""

    model: str
    profile: str
    data: str
    calibration_samples: int = 256
    held_out: float = 0.5
    data_seed: int = 0
    metric: str | None = None
    #: Empty: ``metric, size`` and, where this host times the profile's target
    #: (:func:`mpsearch.profiles.measures_latency`), ``latency`` (:func:`default_objectives`).
    objectives: tuple[str, ...] = ()
    min_metric: float | None = None
    max_metric_drop: float | None = None
    max_size_bytes: int | None = None
    use_memory_budget: bool = True
    trials: int = 100
    timeout_s: float | None = None
    patience: int | None = 20
    sampler: str = "auto"
    seed: int = 0
    storage: str | None = None
    study: str | None = None
    heartbeat_s: float = 60.0  # database storages: a worker silent 2x this has its trial retried
    method: str = "minmax"
    batch_size: int = 64
    threads: int = 2
    formats: tuple[str, ...] | None = None
    sensitivity_limit: int | None = 32
    chunks: int = 4
    search_score: str = "auto"
    analysis: bool = True
    seeding: bool = True
    explore: float = 0.5
    cle: bool | None = None  # recovery: True on, False off, None auto (decided per model)
    bias_correction: bool | None = None
    gptq: bool | None = None
    smoothquant: bool | None = None
    smoothquant_alpha: float = 0.5
    path: str | None = None
    name: str | None = None  # what reports call the model (an upload's own file name)
    verify: str = "none"

    def __post_init__(self) -> None:
        """Every bound :func:`load_spec` checks, again for specs built in Python or changed by
        CLI flags (``--trials 0`` is refused like ``budget.trials: 0``); threads are capped
        at this machine's CPUs."""
        where = self.path or "search spec"
        for name in _INT_BOUNDS:
            value = getattr(self, name)
            if value is None and name in ("patience", "max_size_bytes", "sensitivity_limit"):
                continue
            problem = _bound_error(name, value)
            if problem:
                raise SpecError(f"{where}: {problem}; fix the value")
        for name, low, high in (("held_out", 0.0, 1.0), ("explore", 0.0, 1.0),
                                ("smoothquant_alpha", 0.0, 1.0)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not low <= value <= high:
                raise SpecError(f"{where}: {name} must be between {low:g} and {high:g}, got "
                                f"{value!r}; fix the value")
        if not (isinstance(self.heartbeat_s, (int, float)) and 0 < self.heartbeat_s <= 3600):
            raise SpecError(f"{where}: heartbeat must be from 1 to 3600 seconds, got "
                            f"{self.heartbeat_s!r}; fix the value")
        if self.timeout_s is not None and not (isinstance(self.timeout_s, (int, float))
                                               and 0 < self.timeout_s < math.inf):
            raise SpecError(f"{where}: budget.timeout_s must be a positive number of seconds, "
                            f"got {self.timeout_s!r}; fix the value")
        object.__setattr__(self, "threads", machine_threads(self.threads))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_yaml(self) -> str:
        """This spec as search-spec YAML that :func:`load_spec` reads back to an equal spec
        (``path`` aside): paths are absolute, every setting is spelled out."""
        tree: dict[str, Any] = {
            "model": self.model, "profile": self.profile,
            "data": {"source": self.data, "calibration": self.calibration_samples,
                     "held_out": self.held_out, "seed": self.data_seed},
            "metric": self.metric, "objectives": list(self.objectives),
            "constraints": {"min_metric": self.min_metric,
                            "max_metric_drop": self.max_metric_drop,
                            "max_size_bytes": self.max_size_bytes,
                            "memory_budget": self.use_memory_budget},
            "budget": {"trials": self.trials, "timeout_s": self.timeout_s,
                       "patience": self.patience or 0},
            "sampler": self.sampler, "seed": self.seed, "storage": self.storage,
            "study": self.study, "heartbeat": self.heartbeat_s,
            "calibration": {"method": self.method},
            "evaluation": {"batch_size": self.batch_size, "threads": self.threads,
                           "chunks": self.chunks, "sensitivity_samples": self.sensitivity_limit,
                           "search_score": self.search_score},
            "formats": None if self.formats is None else list(self.formats),
            "analysis": self.analysis, "seeding": self.seeding, "explore": self.explore,
            "name": self.name, "verify": self.verify,
            "recovery": {**{m: _auto_or(getattr(self, m)) for m in RECOVERY_METHODS},
                         "smoothquant_alpha": self.smoothquant_alpha},
        }
        if not self.objectives:  # the default, decided by the profile when the search starts
            del tree["objectives"]
        return yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)

    def with_overrides(self, **changes: Any) -> SearchSpec:
        """A copy with the non-None ``changes`` applied (CLI flags), checked as the spec's own
        values are (:class:`SpecError` naming the flag)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise SpecError(f"unknown spec setting(s) {', '.join(unknown)}")
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


#: The ``recovery`` methods; each is true, false or ``auto`` (None in :class:`SearchSpec`).
RECOVERY_METHODS = ("cle", "bias_correction", "gptq", "smoothquant")


def _auto_or(value: bool | None) -> bool | str:
    return "auto" if value is None else value


def _recovery(root: Section) -> tuple[dict[str, bool | None], float]:
    """``recovery``: ``auto`` (the default: every method decided per model), ``off`` (none),
    or a mapping of methods to true / false / auto (a method not named is auto)."""
    value = root.data.get("recovery")
    if value is None or value == "auto":
        return dict.fromkeys(RECOVERY_METHODS), 0.5
    if value is False or value in ("off", "none"):  # YAML reads a bare `off` as false
        return dict.fromkeys(RECOVERY_METHODS, False), 0.5
    if not isinstance(value, dict):
        names = ", ".join(RECOVERY_METHODS)
        root.fail("recovery", f"recovery must be auto, off or a mapping of {names} to "
                  f"true / false / auto, got {value!r}")
    section = root.section("recovery")
    section.check_keys((*RECOVERY_METHODS, "smoothquant_alpha"))
    methods: dict[str, bool | None] = {}
    for method in RECOVERY_METHODS:
        given = section.data.get(method)
        if given is not None and given != "auto" and not isinstance(given, bool):
            section.fail(method, f"{section.path(method)} must be true, false or auto, got "
                         f"{given!r}")
        methods[method] = None if given in (None, "auto") else bool(given)
    return methods, _alpha(section)


def _path(section: Section, key: str, base: Path) -> str:
    value: str = section.get_str(key)
    if ":" in value and not os.path.exists(value) and not value.endswith((".onnx", ".npz")):
        return value  # a `module:function` data reader
    path = Path(value)
    return str(path if path.is_absolute() else (base / path).resolve())


def _bounded(section: Section, key: str, default: int, name: str) -> int:
    """An integer setting within its :data:`_INT_BOUNDS`, refused at its line otherwise."""
    value: int = section.get_int(key, default)
    problem = _bound_error(name, value)
    if problem:
        section.fail(key, f"{problem}; fix the value")
    return value


def _fraction(section: Section, key: str, default: float) -> float:
    value: float = section.get_float(key, default, minimum=0.0)
    if value > 1.0:
        section.fail(key, f"{section.path(key)} must be between 0 and 1, got {value}")
    return value


def _alpha(section: Section) -> float:
    """SmoothQuant's migration strength: a number in (0, 1]."""
    value: float = section.get_float("smoothquant_alpha", 0.5, positive=True)
    if value > 1.0:
        section.fail("smoothquant_alpha", f"{section.path('smoothquant_alpha')} must be in "
                     f"(0, 1], got {value}")
    return value


def load_spec(path: str | os.PathLike[str]) -> SearchSpec:
    """Read and validate a search spec (:class:`SpecError` with file:line on any problem)."""
    file = os.fspath(path)
    if not os.path.isfile(file):
        raise SpecError(f"{file}: no such search spec; check the path")
    root = Section.root(load_yaml(file, SpecError), file, SpecError)
    root.check_keys(
        ("model", "profile", "data", "metric", "objectives", "constraints", "budget",
         "sampler", "seed", "storage", "study", "heartbeat", "calibration", "formats",
         "evaluation", "analysis", "seeding", "explore", "name", "recovery", "verify"),
        required=("model", "profile", "data"),
    )
    base = Path(file).resolve().parent
    data = root.section("data")
    data.check_keys(("source", "calibration", "held_out", "seed"), required=("source",))
    constraints = root.section("constraints", default=None)
    constraints.check_keys(("min_metric", "max_metric_drop", "max_size_bytes",
                            "memory_budget"))
    budget = root.section("budget", default=None)
    budget.check_keys(("trials", "timeout_s", "patience"))
    calibration = root.section("calibration", default=None)
    calibration.check_keys(("method",))
    evaluation = root.section("evaluation", default=None)
    evaluation.check_keys(("batch_size", "threads", "chunks", "sensitivity_samples",
                           "search_score"))
    recovery, alpha = _recovery(root)
    profile = root.get_str("profile")
    if profile.endswith((".yaml", ".yml")):
        profile = str((base / profile).resolve())
    objectives = root.get_str_list("objectives", (), choices=OBJECTIVES, non_empty=True)
    if objectives and ("metric" not in objectives or len(objectives) < 2):
        root.fail("objectives", "objectives must include 'metric' and at least one of "
                  "'size', 'latency'")
    held_out = data.get_float("held_out", 0.5, minimum=0.0)
    if held_out >= 1.0:
        data.fail("held_out", f"data.held_out must be below 1, got {held_out}")
    return SearchSpec(
        model=_path(root, "model", base),
        profile=profile,
        data=_path(data, "source", base),
        calibration_samples=data.get_int("calibration", 256, minimum=1),
        held_out=held_out,
        data_seed=_bounded(data, "seed", 0, "data_seed"),
        metric=root.get_str("metric", None),
        objectives=objectives,
        min_metric=constraints.get_float("min_metric", None),
        max_metric_drop=constraints.get_float("max_metric_drop", None, minimum=0.0),
        max_size_bytes=constraints.get_int("max_size_bytes", None, minimum=1),
        use_memory_budget=constraints.get_bool("memory_budget", True),
        trials=budget.get_int("trials", 100, minimum=1),
        timeout_s=budget.get_float("timeout_s", None, positive=True),
        patience=budget.get_int("patience", 20, minimum=0) or None,  # 0: every trial
        sampler=root.get_str("sampler", "auto", choices=SAMPLER_NAMES),
        seed=_bounded(root, "seed", 0, "seed"),
        storage=root.get_str("storage", None),
        study=root.get_str("study", None),
        heartbeat_s=root.get_float("heartbeat", 60.0, positive=True),
        method=calibration.get_str("method", "minmax", choices=METHODS),
        batch_size=_bounded(evaluation, "batch_size", 64, "batch_size"),
        threads=_bounded(evaluation, "threads", 2, "threads"),
        chunks=_bounded(evaluation, "chunks", 4, "chunks"),
        sensitivity_limit=evaluation.get_int("sensitivity_samples", 32, minimum=1),
        search_score=evaluation.get_str("search_score", "auto", choices=SEARCH_SCORES),
        formats=root.get_str_list("formats", None, non_empty=True),
        analysis=root.get_bool("analysis", True),
        seeding=root.get_bool("seeding", True),
        explore=_fraction(root, "explore", 0.5),
        **recovery,
        smoothquant_alpha=alpha,
        path=file,
        name=root.get_str("name", None),
        verify=root.get_str("verify", "none", choices=VERIFY),
    )
