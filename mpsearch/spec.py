"""Search specs: a YAML file -> a frozen, validated :class:`SearchSpec`.

Parsed once, strictly, at the edge: an unknown key is an error with the file, the line and
"did you mean"; paths are resolved relative to the spec file. The dataclasses mirror the file:
each YAML section is one small frozen dataclass (:class:`DataSpec`, :class:`Constraints`,
:class:`Budget`, :class:`CalibrationSpec`, :class:`EvaluationSpec`, :class:`Recovery`) whose
fields are the section's keys, and which checks its own values however it was built (a file,
Python code, a CLI flag). Example (``searches/demo.yaml``)::

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
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from mpsearch._yaml import Section, load_yaml
from mpsearch.errors import SpecError

__all__ = ["AUTO_SENSITIVITY", "MAX_SEED", "MAX_THREADS", "METHODS", "OBJECTIVES",
           "RECOVERY_METHODS", "SAMPLER_NAMES", "SEARCH_SCORES", "Budget", "CalibrationSpec",
           "Constraints", "DataSpec", "EvaluationSpec", "Recovery", "SearchSpec", "Thresholds",
           "load_spec", "machine_threads"]

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
#: at the CPUs this machine has (more threads than cores only wait on each other).
MAX_THREADS = 1024
#: Integer settings: spec key -> (CLI flag or "", minimum, maximum or None).
_INT_BOUNDS: dict[str, tuple[str, int, int | None]] = {
    "data.calibration": ("--calibration-samples", 1, None),
    "data.seed": ("--seed", 0, MAX_SEED),
    "seed": ("--seed", 0, MAX_SEED),
    "budget.trials": ("--trials", 1, None),
    "budget.patience": ("", 1, None),
    "constraints.max_size_bytes": ("", 1, None),
    "evaluation.batch_size": ("", 1, 1 << 16),
    "evaluation.threads": ("--threads", 1, MAX_THREADS),
    "evaluation.chunks": ("", 1, 1 << 16),
    "evaluation.sensitivity_samples": ("", 1, None),
    "evaluation.target_samples": ("", 1, None),
}


def machine_threads(threads: int) -> int:
    """``threads`` capped at this machine's CPU count (logged when capped)."""
    cpus = os.cpu_count() or 1
    if threads > cpus:
        logger.info("using %d threads, the CPUs of this machine, instead of %d", cpus, threads)
        return cpus
    return threads


def _bound_error(key: str, value: Any) -> str | None:
    """What is wrong with integer setting ``key`` (its spec key) = ``value``, or None."""
    flag, low, high = _INT_BOUNDS[key]
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


#: The ``recovery`` methods; each is true, false or ``auto`` (None in :class:`Recovery`).
RECOVERY_METHODS = ("cle", "bias_correction", "gptq", "smoothquant")


def _target_samples(evaluation: Section) -> int | Literal["auto"] | None:
    """``evaluation.target_samples``: ``auto`` (absent or null), ``all`` (None) or a count."""
    value = evaluation.data.get("target_samples")
    if value is None or value == "auto":
        return "auto"
    if value == "all":
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        evaluation.fail("target_samples", "evaluation.target_samples must be auto, all or a "
                        f"number of samples, got {value!r}; fix the value")
    return int(evaluation.get_int("target_samples", minimum=1))


def _sensitivity_samples(evaluation: Section) -> int | Literal["auto"] | None:
    """``evaluation.sensitivity_samples``: ``auto`` (absent), all (null) or a count."""
    value = evaluation.data.get("sensitivity_samples", "auto")
    if value is None:
        return None
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int):
        evaluation.fail("sensitivity_samples", "evaluation.sensitivity_samples must be auto, "
                        f"null (all) or a number of samples, got {value!r}; fix the value")
    return int(evaluation.get_int("sensitivity_samples", minimum=1))


#: ``sensitivity_samples: auto``: half the split the analysis measures, at least the first and
#: at most the second of these. At 32 of a 43-sample split the one-node costs read nearly the
#: whole split once per node, the largest fixed cost of a search on a small data set; a split
#: of 64 or more gets the 32 of before (``benchmarks/bench_pipeline.py`` checks the ranking).
AUTO_SENSITIVITY = (16, 32)


def _check_ints(section: str, values: dict[str, Any], optional: tuple[str, ...] = ()) -> None:
    """:class:`SpecError` for the first of ``values`` (keys of ``section``) outside its
    :data:`_INT_BOUNDS`; a name in ``optional`` may be None."""
    for name, value in values.items():
        if value is None and name in optional:
            continue
        problem = _bound_error(f"{section}.{name}", value)
        if problem:
            raise SpecError(f"{problem}; fix the value")


def _check_fraction(name: str, value: Any, low: float = 0.0, high: float = 1.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise SpecError(f"{name} must be between {low:g} and {high:g}, got {value!r}; fix the "
                        "value")


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(f"{key} must be one of {', '.join(choices)}, got {value!r}; fix the "
                        "value")


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSpec:
    """``data``: where the samples come from and how they are split. ``calibration`` samples
    calibrate; of the rest, the ``held_out`` share (drawn with ``seed``) is kept aside to
    re-measure the front, and the search measures on the remainder."""

    source: str  # a .npz/.npy file, an image folder or a `module:function` reader
    calibration: int = 256
    held_out: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        _check_ints("data", {"calibration": self.calibration, "seed": self.seed})
        _check_fraction("held_out", self.held_out)


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraints:
    """``constraints``: what a configuration must meet to count. A metric floor (``min_metric``,
    or FP32's metric less ``max_metric_drop``), a weight size limit, and whether the profile's
    memory budget limits the size too (``memory_budget``)."""

    min_metric: float | None = None
    max_metric_drop: float | None = None
    max_size_bytes: int | None = None
    memory_budget: bool = True

    def __post_init__(self) -> None:
        _check_ints("constraints", {"max_size_bytes": self.max_size_bytes},
                    optional=("max_size_bytes",))
        for name, value in (("min_metric", self.min_metric),
                            ("max_metric_drop", self.max_metric_drop)):
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, (int, float)) or not math.isfinite(value)):
                raise SpecError(f"constraints.{name} must be a finite number, got {value!r}; "
                                "fix the value")
        if self.max_metric_drop is not None and self.max_metric_drop < 0:
            raise SpecError(f"constraints.max_metric_drop must be >= 0, got "
                            f"{self.max_metric_drop!r}; fix the value")


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """``budget``: when the study stops: after ``trials`` trials, ``timeout_s`` seconds, or
    ``patience`` trials in a row that leave the front where it was (None: never early)."""

    trials: int = 100
    timeout_s: float | None = None
    patience: int | None = 20

    def __post_init__(self) -> None:
        _check_ints("budget", {"trials": self.trials, "patience": self.patience},
                    optional=("patience",))
        if self.timeout_s is not None and not (
                isinstance(self.timeout_s, (int, float)) and not isinstance(self.timeout_s, bool)
                and 0 < self.timeout_s < math.inf):
            raise SpecError(f"budget.timeout_s must be a positive number of seconds, got "
                            f"{self.timeout_s!r}; fix the value")


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationSpec:
    """``calibration``: the activation range method of the calibration table (:data:`METHODS`)."""

    method: str = "minmax"

    def __post_init__(self) -> None:
        _check_choice("calibration.method", self.method, METHODS)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluationSpec:
    """``evaluation``: how configurations are measured. ``batch_size`` and ``threads`` of ONNX
    Runtime (threads capped at this machine's CPUs), ``chunks`` a trial is raced in, the
    ``sensitivity_samples`` one-node costs are measured on (None: all; ``"auto"``:
    :data:`AUTO_SENSITIVITY`), ``search_score``
    (:data:`SEARCH_SCORES`) and the first ``target_samples`` held-out samples a ``verify``
    toolchain runs (None: all; ``"auto"``: all those a point's verification runs in about a
    minute, at least 32, since an emulator can take seconds a sample)."""

    batch_size: int = 64
    threads: int = 2
    chunks: int = 4
    sensitivity_samples: int | Literal["auto"] | None = "auto"
    search_score: str = "auto"
    target_samples: int | Literal["auto"] | None = "auto"

    def __post_init__(self) -> None:
        counts = {"batch_size": self.batch_size, "threads": self.threads, "chunks": self.chunks}
        for name in ("sensitivity_samples", "target_samples"):
            if getattr(self, name) != "auto":
                counts[name] = getattr(self, name)
        _check_ints("evaluation", counts, optional=("sensitivity_samples", "target_samples"))
        _check_choice("evaluation.search_score", self.search_score, SEARCH_SCORES)
        object.__setattr__(self, "threads", machine_threads(self.threads))

    def sensitivity_count(self, available: int) -> int | None:
        """How many of a split's ``available`` samples the one-node costs are measured on
        (None: all of them)."""
        if self.sensitivity_samples != "auto":
            return self.sensitivity_samples
        least, most = AUTO_SENSITIVITY
        return min(available, max(least, min(most, math.ceil(available / 2))))


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """``recovery``: each method of :mod:`mpsearch.recovery` True (on), False (off) or None
    (auto: decided per model on the search split), and SmoothQuant's migration strength."""

    cle: bool | None = None
    bias_correction: bool | None = None
    gptq: bool | None = None
    smoothquant: bool | None = None
    smoothquant_alpha: float = 0.5

    def __post_init__(self) -> None:
        for method in RECOVERY_METHODS:
            value = getattr(self, method)
            if value is not None and not isinstance(value, bool):
                raise SpecError(f"recovery.{method} must be true, false or auto, got "
                                f"{value!r}; fix the value")
        _check_fraction("smoothquant_alpha", self.smoothquant_alpha)


#: The sections of :class:`SearchSpec`: field (and YAML key) -> dataclass.
_SECTIONS: dict[str, type] = {"data": DataSpec, "constraints": Constraints, "budget": Budget,
                              "calibration": CalibrationSpec, "evaluation": EvaluationSpec,
                              "recovery": Recovery}


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpec:
    """Everything one search needs: the YAML file's top-level keys, each section a nested
    dataclass; ``to_dict()`` (the same shape) is written to the run directory."""

    model: str
    profile: str
    data: DataSpec
    metric: str | None = None
    #: Empty: ``metric, size`` and, where this host times the profile's target
    #: (:func:`mpsearch.profiles.measures_latency`), ``latency`` (:func:`default_objectives`).
    objectives: tuple[str, ...] = ()
    constraints: Constraints = field(default_factory=Constraints)
    budget: Budget = field(default_factory=Budget)
    sampler: str = "auto"
    seed: int = 0
    storage: str | None = None
    study: str | None = None
    heartbeat_s: float = 60.0  # database storages: a worker silent 2x this has its trial retried
    calibration: CalibrationSpec = field(default_factory=CalibrationSpec)
    evaluation: EvaluationSpec = field(default_factory=EvaluationSpec)
    formats: tuple[str, ...] | None = None
    analysis: bool = True
    seeding: bool = True
    explore: float = 0.5
    recovery: Recovery = field(default_factory=Recovery)
    path: str | None = None
    name: str | None = None  # what reports call the model (an upload's own file name)
    verify: str = "none"

    def __post_init__(self) -> None:
        """The top-level bounds :func:`load_spec` checks, again for specs built in Python or
        changed by CLI flags (each section checks its own values)."""
        for name, kind in _SECTIONS.items():
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise TypeError(f"SearchSpec.{name} must be a {kind.__name__}, got {value!r}")
        where = self.path or "search spec"
        problem = _bound_error("seed", self.seed)
        if problem:
            raise SpecError(f"{where}: {problem}; fix the value")
        try:
            _check_fraction("explore", self.explore)
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None
        if not (isinstance(self.heartbeat_s, (int, float)) and 0 < self.heartbeat_s <= 3600):
            raise SpecError(f"{where}: heartbeat must be from 1 to 3600 seconds, got "
                            f"{self.heartbeat_s!r}; fix the value")

    def to_dict(self) -> dict[str, Any]:
        """Every setting, sections as nested mappings keyed as in the YAML file."""
        return asdict(self)

    def to_yaml(self) -> str:
        """This spec as search-spec YAML that :func:`load_spec` reads back to an equal spec
        (``path`` aside): paths are absolute, every setting is spelled out."""
        tree: dict[str, Any] = {
            "model": self.model, "profile": self.profile, "data": asdict(self.data),
            "metric": self.metric, "objectives": list(self.objectives),
            "constraints": asdict(self.constraints),
            "budget": {**asdict(self.budget), "patience": self.budget.patience or 0},
            "sampler": self.sampler, "seed": self.seed, "storage": self.storage,
            "study": self.study, "heartbeat": self.heartbeat_s,
            "calibration": asdict(self.calibration),
            "evaluation": {**asdict(self.evaluation),
                           "target_samples": self.evaluation.target_samples or "all"},
            "formats": None if self.formats is None else list(self.formats),
            "analysis": self.analysis, "seeding": self.seeding, "explore": self.explore,
            "name": self.name, "verify": self.verify,
            "recovery": {k: _auto_or(v) if k in RECOVERY_METHODS else v
                         for k, v in asdict(self.recovery).items()},
        }
        if not self.objectives:  # the default, decided by the profile when the search starts
            del tree["objectives"]
        return yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)

    def with_overrides(self, **changes: Any) -> SearchSpec:
        """A copy with the non-None ``changes`` applied (CLI flags), checked as the spec's own
        values are (:class:`SpecError` naming the flag). A key is a top-level setting
        (``seed``, ``storage``), a section with a mapping of its settings
        (``data={"seed": 1}``), or one section's setting named alone (``trials``, ``threads``,
        ``cle``)."""
        top: dict[str, Any] = {}
        sections: dict[str, dict[str, Any]] = {}
        unknown = []
        for key, value in changes.items():
            if value is None:
                continue
            if key in _SECTIONS:
                if not isinstance(value, dict):
                    raise SpecError(f"{key}: a section takes a mapping of its settings "
                                    f"({', '.join(sorted(_FIELDS[key]))}), got {value!r}")
                sections.setdefault(key, {}).update(
                    {k: v for k, v in value.items() if v is not None})
            elif key in _SETTINGS:
                top[key] = value
            elif key in _SECTION_OF:
                sections.setdefault(_SECTION_OF[key], {})[key] = value
            else:
                unknown.append(key)
        for name, values in sections.items():
            unknown += [f"{name}.{k}" for k in values if k not in _FIELDS[name]]
        if unknown:
            raise SpecError(f"unknown spec setting(s) {', '.join(sorted(unknown))}")
        try:
            for name, values in sections.items():
                top[name] = replace(getattr(self, name), **values)
        except SpecError as e:
            raise SpecError(f"{self.path or 'search spec'}: {e}") from None
        return replace(self, **top)


#: The setting names :meth:`SearchSpec.with_overrides` takes: top-level ones, and each
#: section's own (a name the top level also has, as data's ``seed``, is the top level's).
_SETTINGS = frozenset(f.name for f in fields(SearchSpec))
_FIELDS = {name: frozenset(f.name for f in fields(kind)) for name, kind in _SECTIONS.items()}
_SECTION_OF = {key: name for name, keys in _FIELDS.items() for key in keys
               if key not in _SETTINGS}


def _auto_or(value: bool | None) -> bool | str:
    return "auto" if value is None else value


def _recovery(root: Section) -> Recovery:
    """``recovery``: ``auto`` (the default: every method decided per model), ``off`` (none),
    or a mapping of methods to true / false / auto (a method not named is auto)."""
    value = root.data.get("recovery")
    if value is None or value == "auto":
        return Recovery()
    if value is False or value in ("off", "none"):  # YAML reads a bare `off` as false
        return Recovery(**dict.fromkeys(RECOVERY_METHODS, False))
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
    return Recovery(**methods, smoothquant_alpha=_alpha(section))


def _path(section: Section, key: str, base: Path) -> str:
    value: str = section.get_str(key)
    if ":" in value and not os.path.exists(value) and not value.endswith((".onnx", ".npz")):
        return value  # a `module:function` data reader
    path = Path(value)
    return str(path if path.is_absolute() else (base / path).resolve())


def _storage(value: str | None, base: Path) -> str | None:
    """A ``storage:`` journal path or ``sqlite:///`` file, relative to the spec's folder as
    every path of a spec is; other URLs as given."""
    if value is None or value.startswith(("sqlite:////", "sqlite:///:memory:")):
        return value
    if value.startswith("sqlite:///"):
        return "sqlite:///" + str((base / value[len("sqlite:///"):]).resolve())
    if "://" in value:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def _bounded(section: Section, key: str, default: int) -> int:
    """An integer setting within its :data:`_INT_BOUNDS`, refused at its line otherwise."""
    value: int = section.get_int(key, default)
    problem = _bound_error(section.path(key), value)
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
    if "task" in root and root.data.get("task") == "language-model":
        root.fail("task", "a language-model spec; run it with `mpsearch llm search "
                  f"{file} --out RUN_DIR` (docs/llm.md)")
    root.check_keys(
        ("model", "profile", "data", "metric", "objectives", "constraints", "budget",
         "sampler", "seed", "storage", "study", "heartbeat", "calibration", "formats",
         "evaluation", "analysis", "seeding", "explore", "name", "recovery", "verify"),
        required=("model", "profile", "data"),
    )
    base = Path(file).resolve().parent
    data = root.section("data")
    data.check_keys(_keys(DataSpec), required=("source",))
    constraints, budget, calibration, evaluation = (
        root.section(name, default=None) for name in ("constraints", "budget", "calibration",
                                                      "evaluation"))
    constraints.check_keys(_keys(Constraints))
    budget.check_keys(_keys(Budget))
    calibration.check_keys(_keys(CalibrationSpec))
    evaluation.check_keys(_keys(EvaluationSpec))
    recovery = _recovery(root)
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
    values = {  # every value read (and refused at its line) before any section is built
        "data": dict(source=_path(data, "source", base),
                     calibration=data.get_int("calibration", 256, minimum=1),
                     held_out=held_out, seed=_bounded(data, "seed", 0)),
        "constraints": dict(
            min_metric=constraints.get_float("min_metric", None),
            max_metric_drop=constraints.get_float("max_metric_drop", None, minimum=0.0),
            max_size_bytes=constraints.get_int("max_size_bytes", None, minimum=1),
            memory_budget=constraints.get_bool("memory_budget", True)),
        "budget": dict(trials=budget.get_int("trials", 100, minimum=1),
                       timeout_s=budget.get_float("timeout_s", None, positive=True),
                       patience=budget.get_int("patience", 20, minimum=0) or None),  # 0: all
        "calibration": dict(method=calibration.get_str("method", "minmax", choices=METHODS)),
        "evaluation": dict(
            batch_size=_bounded(evaluation, "batch_size", 64),
            threads=_bounded(evaluation, "threads", 2),
            chunks=_bounded(evaluation, "chunks", 4),
            sensitivity_samples=_sensitivity_samples(evaluation),
            search_score=evaluation.get_str("search_score", "auto", choices=SEARCH_SCORES),
            target_samples=_target_samples(evaluation)),
    }
    try:  # what only a section's own check refuses (budget.timeout_s: .inf) names the file
        sections = {name: _SECTIONS[name](**kwargs) for name, kwargs in values.items()}
    except SpecError as e:
        raise SpecError(f"{file}: {e}") from None
    return SearchSpec(
        model=_path(root, "model", base),
        profile=profile,
        metric=root.get_str("metric", None),
        objectives=objectives,
        sampler=root.get_str("sampler", "auto", choices=SAMPLER_NAMES),
        seed=_bounded(root, "seed", 0),
        storage=_storage(root.get_str("storage", None), base),
        study=root.get_str("study", None),
        heartbeat_s=root.get_float("heartbeat", 60.0, positive=True),
        formats=root.get_str_list("formats", None, non_empty=True),
        analysis=root.get_bool("analysis", True),
        seeding=root.get_bool("seeding", True),
        explore=_fraction(root, "explore", 0.5),
        recovery=recovery,
        path=file,
        name=root.get_str("name", None),
        verify=root.get_str("verify", "none", choices=VERIFY),
        **sections,
    )


def _keys(section: type) -> tuple[str, ...]:
    """The keys of a YAML section: its dataclass's fields."""
    return tuple(f.name for f in fields(section))
