"""The job form of ``mpsearch serve`` -> a search spec YAML in the job's run directory.

Consumes the submitted form fields (kind, profile, data, range method, weight granularity,
metric, budget, target verification) and the uploads they name; produces a frozen
:class:`JobConfig` and, in the run directory, ``spec.yaml`` (the file the user downloads to
rerun the job with ``mpsearch search spec.yaml``) and, when a weight granularity other than the
profile's is chosen, ``hw_profile.yaml`` extending the chosen profile. Both are re-read with
:func:`~mpsearch.spec.load_spec` and :func:`~mpsearch.profiles.load_profile`, so the job runs
exactly what the CLI would. Only built-in metrics are accepted: ``module:function`` metrics
import Python code and stay CLI-only.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from mpsearch.errors import MpsearchError
from mpsearch.rundir import RunDir, atomic_write
from mpsearch.serve._store import UploadError
from mpsearch.serve._targetview import check_verify
from mpsearch.spec import METHODS, VERIFY

__all__ = ["GRANULARITY_CHOICES", "KINDS", "JobConfig", "cli_commands", "image_options",
           "metric_names", "parse_form", "write_spec"]

KINDS = ("analysis", "search")
GRANULARITY_CHOICES = ("profile", "per_tensor", "per_channel")
_MAX_TRIALS = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class JobConfig:
    """One job as the form chose it; paths are the stored uploads (absolute)."""

    kind: str
    model: Path
    data: Path
    profile: str
    method: str = "minmax"
    granularity: str = "profile"
    metric: str | None = None
    calibration: int = 128
    held_out: float = 0.5
    trials: int = 20
    latency: bool = False
    max_metric_drop: float | None = None
    seed: int = 0
    sensitivity_samples: int | None = None
    formats: tuple[str, ...] | None = None
    node_analysis: bool = True
    verify: str = "none"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(model=str(self.model), data=str(self.data))
        return out


def metric_names() -> tuple[str, ...]:
    """Built-in metric names (the only ones a served job may use)."""
    from mpsearch import METRICS  # onnxruntime comes with it: import on first use

    return tuple(METRICS)


def _field(form: Mapping[str, str], key: str, default: str = "") -> str:
    return str(form.get(key, default)).strip()


def _int(form: Mapping[str, str], key: str, low: int, high: int, label: str) -> int | None:
    """The whole number in ``key``, or None when the field is empty."""
    text = _field(form, key)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise UploadError(f"{label} must be a whole number, got '{text[:40]}'") from None
    if not low <= value <= high:
        raise UploadError(f"{label} must be between {low} and {high}, got {value}")
    return value


def _float(form: Mapping[str, str], key: str, low: float, high: float,
           label: str) -> float | None:
    """The number in ``key``, or None when the field is empty."""
    text = _field(form, key)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UploadError(f"{label} must be a number, got '{text[:40]}'") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise UploadError(f"{label} must be between {low:g} and {high:g}, got {value:g}")
    return value


def _choice(form: Mapping[str, str], key: str, choices: tuple[str, ...], default: str,
            label: str) -> str:
    value = _field(form, key, default) or default
    if value not in choices:
        raise UploadError(f"{label} '{value[:40]}' is not one of {', '.join(choices)}")
    return value


def _formats(form: Mapping[str, str], profile: str) -> tuple[str, ...] | None:
    """The data types to search (None: all of the profile's); float formats always stay."""
    if not _field(form, "formats_shown") and not _field(form, "formats"):
        return None
    from mpsearch import load_profile

    hw = load_profile(profile)
    lower = [n for n, f in hw.formats.items()
             if not (f.activation.dtype == "float32" and f.weight.dtype == "float32")]
    chosen = [f.strip() for f in _field(form, "formats").split(",") if f.strip()]
    unknown = [f for f in chosen if f not in lower]
    if unknown:
        raise UploadError(f"data type(s) {', '.join(unknown)[:80]} not in profile "
                          f"'{hw.name}'; choose from {', '.join(lower)}")
    if not chosen:
        raise UploadError(f"choose at least one data type to quantize to ({', '.join(lower)})")
    return None if set(chosen) == set(lower) else tuple(f for f in lower if f in chosen)


def parse_form(form: Mapping[str, str], *, model: Path, data: Path, profile: str,
               labels: bool) -> JobConfig:
    """Check the form fields (:class:`UploadError` naming the field and the value);
    ``formats`` is a comma-separated list of the profile's data types."""
    metric = _field(form, "metric") or None
    if metric is not None:
        if ":" in metric:
            raise UploadError(f"metric '{metric[:60]}': module:function metrics import Python "
                              "code and are CLI-only; pick a built-in metric")
        names = metric_names()
        if metric not in names:
            raise UploadError(f"metric '{metric[:40]}' is not one of {', '.join(names)}")
        if metric in ("accuracy", "top5") and not labels:
            raise UploadError(f"metric '{metric}' needs labels, and the data has none; pick "
                              "agreement, sqnr, cosine or mse, or upload data with 'labels'")
    trials = _int(form, "trials", 1, _MAX_TRIALS, "trials")
    calibration = _int(form, "calibration", 1, 1_000_000, "calibration samples")
    seed = _int(form, "seed", 0, 2**31 - 1, "seed")
    held_out = _float(form, "held_out", 0.0, 0.9, "held-out fraction")
    verify = _choice(form, "verify", VERIFY, "none", "verify")
    if verify != "none":
        from mpsearch import load_profile

        check_verify(verify, load_profile(profile).to_dict())
    return JobConfig(
        kind=_choice(form, "kind", KINDS, "search", "job kind"),
        model=model, data=data, profile=profile,
        method=_choice(form, "method", METHODS, "minmax", "range method"),
        granularity=_choice(form, "granularity", GRANULARITY_CHOICES, "profile",
                            "weight granularity"),
        metric=metric, calibration=128 if calibration is None else calibration,
        held_out=0.5 if held_out is None else held_out, trials=20 if trials is None else trials,
        latency=_field(form, "latency") in ("1", "on", "true"),
        max_metric_drop=_float(form, "max_metric_drop", 0.0, 1e9, "max metric drop"),
        seed=0 if seed is None else seed,
        sensitivity_samples=_int(form, "sensitivity_samples", 1, 1_000_000,
                                 "sensitivity samples"),
        formats=_formats(form, profile),
        node_analysis=_choice(form, "analysis", ("on", "off"), "on", "per-node analysis")
        == "on", verify=verify,
    )


def _derived_profile(base: str, granularity: str) -> dict[str, Any]:
    """A profile extending ``base`` with every integer weight format at ``granularity``."""
    from mpsearch import load_profile

    profile = load_profile(base)
    per_tensor = granularity != "per_channel"  # then a format's own axis means nothing
    formats = {name: {"weight": {"granularity": granularity,
                                 **({"axis": None} if per_tensor and fmt.weight.axis is not None
                                    else {})}}
               for name, fmt in profile.formats.items() if not fmt.weight.is_float}
    if not formats:
        raise UploadError(f"profile '{profile.name}' has no integer weight format; keep the "
                          "profile's granularity")
    return {"schema": 1, "name": f"{profile.name}-{granularity.replace('_', '-')}",
            "extends": base, "description": f"{profile.name} with {granularity} weights "
            "(written by mpsearch serve)", "formats": formats}


def write_spec(run_dir: Path, config: JobConfig, *, title: str, name: str | None = None
               ) -> tuple[str, ...]:
    """Write ``spec.yaml`` (and ``hw_profile.yaml`` when needed) and check them as the CLI
    would; returns the command lines that redo the job."""
    from mpsearch import load_profile
    from mpsearch.spec import (
        Budget,
        CalibrationSpec,
        Constraints,
        DataSpec,
        SearchSpec,
        load_spec,
    )

    profile = config.profile
    if config.granularity != "profile":
        derived = RunDir(run_dir).hw_profile_yaml
        atomic_write(derived, yaml.safe_dump(_derived_profile(profile, config.granularity),
                                             sort_keys=False).encode())
        profile = str(derived)
    spec = SearchSpec(
        model=str(config.model), profile=profile,
        data=DataSpec(source=str(config.data), calibration=config.calibration,
                      held_out=config.held_out),
        metric=config.metric,
        objectives=("metric", "size", "latency") if config.latency else ("metric", "size"),
        constraints=Constraints(max_metric_drop=config.max_metric_drop),
        budget=Budget(trials=config.trials), seed=config.seed,
        calibration=CalibrationSpec(method=config.method), formats=config.formats,
        analysis=config.node_analysis, name=name, verify=config.verify,
    ).with_overrides(sensitivity_samples=config.sensitivity_samples)  # empty: the default
    run = RunDir(run_dir)
    header = (f"# {title}\n# Written by `mpsearch serve`; rerun it from the command line with\n"
              f"#   mpsearch search spec.yaml --out {run_dir}-cli\n")
    run.write_spec(spec, header)
    path = run.spec_yaml
    try:
        load_profile(profile)
        load_spec(path)
    except MpsearchError as e:
        message = str(e).replace(str(run_dir) + "/", "")
        raise UploadError(message) from e
    return cli_commands(config, run_dir, profile)


def image_options(fields: Mapping[str, str]) -> dict[str, Any]:
    """The preprocessing fields of the form -> :class:`~mpsearch.data.ImageOptions` keys."""
    options: dict[str, Any] = {}
    try:
        for key, value in fields.items():
            if key in ("size", "crop"):
                parts = [int(v) for v in value.replace("x", ",").split(",") if v.strip()]
                options[key] = parts[0] if len(parts) == 1 else tuple(parts)
            elif key in ("mean", "std"):
                options[key] = tuple(float(v) for v in value.split(",") if v.strip())
            elif key == "scale":
                num, _, den = value.partition("/")
                options[key] = float(num) / float(den or 1)
            elif key in ("layout", "mode", "input_name", "dtype"):
                options[key] = value
    except (ValueError, ZeroDivisionError) as e:
        raise UploadError(f"image preprocessing: cannot read '{key}' = '{value[:40]}' ({e}); "
                          "use numbers separated by commas") from None
    return options


def cli_commands(config: JobConfig, run_dir: Path, profile: str) -> tuple[str, ...]:
    """The command lines that redo the job (``profile`` as written in the spec); the export
    line names point ``K``, which the job page replaces with the selected point."""
    q = shlex.quote
    out = q(f"{run_dir}-cli")
    if config.kind == "analysis":
        words = ["mpsearch analyze", q(str(config.model)), "--profile", q(profile), "--data",
                 q(str(config.data)), "--method", config.method, "--calibration-samples",
                 str(config.calibration)]
        if config.metric:
            words += ["--metric", config.metric]
        if config.formats:
            words += ["--formats", ",".join(config.formats)]
        if config.sensitivity_samples:
            words += ["--limit", str(config.sensitivity_samples)]
        return (" ".join([*words, "--out", out]), f"mpsearch report {q(str(run_dir))}")
    spec = q(str(run_dir / "spec.yaml"))
    return (f"mpsearch search {spec} --out {out}",
            f"mpsearch search {spec} --out {q(str(run_dir))} --resume",
            f"mpsearch export {q(str(run_dir))} --point K --out model.onnx",
            f"mpsearch report {q(str(run_dir))}")
