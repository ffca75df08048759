"""Schema 1 of hardware profile YAML: resolve ``extends``, check keys and types, build values.

Consumes a profile file (and the files it extends); produces a validated
:class:`~mpsearch.profiles.HardwareProfile`. Every error is one line naming the file, the line,
the problem and the fix.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path
from typing import Any

from mpsearch._yaml import LineDict, Section, load_yaml, merge_maps, suggest
from mpsearch.errors import ProfileError
from mpsearch.profiles._cpu import AUTO_X86_PROFILE, host_int8_isa, x86_profile_for
from mpsearch.profiles._declared import check_runs_as, parse_withheld
from mpsearch.profiles._types import (
    ACTIVATION_DTYPES,
    BIAS_DTYPES,
    EXECUTES,
    FALLBACKS,
    GRANULARITIES,
    RUNTIMES,
    SCALES,
    SCHEMA_VERSION,
    TOOLCHAIN_SETTINGS,
    WEIGHT_DTYPES,
    Format,
    HardwareProfile,
    OpRule,
    TensorFormat,
    ToolchainRef,
    toolchain_setting_problem,
)
from mpsearch.profiles._weight_only import parse_weight_only

__all__ = ["list_shipped", "read_profile", "resolve_profile", "shipped_profile_path"]

logger = logging.getLogger(__name__)

UNKNOWN = ("unknown",)
TOP_KEYS = ("schema", "name", "extends", "description", "versions", "sources", "formats",
            "default_format", "cost_reference", "fallback", "unlisted_ops", "op_rules",
            "transition_cost", "memory_budget_bytes", "runtime", "toolchain", "unknowns",
            "weight_only")
REQUIRED_TOP = ("description", "versions", "sources", "formats", "default_format", "fallback",
                "op_rules", "transition_cost", "memory_budget_bytes")
FORMAT_KEYS = ("activation", "weight", "bias", "executes", "relative_cost", "runs_as")
REQUIRED_FORMAT = ("activation", "weight", "bias", "executes", "relative_cost")
TENSOR_KEYS = ("dtype", "symmetric", "granularity", "axis", "scale", "narrow_range",
               "reduce_range")
RULE_KEYS = ("formats", "exclude", "weight_granularity", "weight_axis", "fixed_qparams",
             "same_input_precision", "same_input_scale", "cost", "on_cpu", "withheld")
INT_DTYPES = tuple(d for d in ACTIVATION_DTYPES if not d.startswith("float"))
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.]*$")


# -- files and extends ---------------------------------------------------------------------
def profile_dirs() -> tuple[Path, ...]:
    """Where shipped profiles live: top-level ``hw_profiles/``, then package data."""
    package = Path(__file__).resolve().parent.parent  # mpsearch/
    return (package.parent / "hw_profiles", package / "hw_profiles")


def shipped_profile_path(name: str) -> Path | None:
    """The file of the shipped profile ``name``, or None."""
    for folder in profile_dirs():
        for suffix in (".yaml", ".yml"):
            candidate = folder / f"{name}{suffix}"
            if candidate.is_file():
                return candidate
    return None


def list_shipped() -> tuple[str, ...]:
    """Names of the shipped profiles, sorted."""
    names: set[str] = set()
    for folder in profile_dirs():
        if folder.is_dir():
            names.update(p.stem for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    return tuple(sorted(names))


def resolve_profile(name_or_path: str | os.PathLike[str]) -> Path:
    """The file for a path (anything with a separator or a .yaml suffix) or a shipped name.

    ``x86_ort_auto`` names ``x86_ort`` on CPUs with VNNI or AMX and ``x86_ort_avx2`` on the others.
    """
    text = os.fspath(name_or_path)
    if not isinstance(name_or_path, str) or text.endswith((".yaml", ".yml")) or "/" in text \
            or os.sep in text:
        path = Path(name_or_path)
        if not path.is_file():
            raise ProfileError(f"{path}: no such profile file; check the path, or name a "
                               f"shipped profile ({', '.join(list_shipped())})")
        return path
    if text == AUTO_X86_PROFILE:
        isa = host_int8_isa()
        text = x86_profile_for(isa)
        logger.info("%s on this CPU (%s) is %s", AUTO_X86_PROFILE, isa.describe(), text)
    found = shipped_profile_path(text)
    if found is None:
        known = (*list_shipped(), AUTO_X86_PROFILE)
        raise ProfileError(f"unknown hardware profile '{text}'{suggest(text, known)}")
    return found


def read_profile(path: Path) -> HardwareProfile:
    """Read ``path`` (following ``extends``) and build the validated profile."""
    data = _read_merged(path, ())
    return build_profile(Section.root(data, str(path), ProfileError), path)


def _read_merged(path: Path, chain: tuple[Path, ...]) -> LineDict:
    data = load_yaml(path, ProfileError)
    root = Section.root(data, str(path), ProfileError)
    root.check_keys(TOP_KEYS, required=("schema",))
    schema = root.get_int("schema")
    if schema != SCHEMA_VERSION:
        root.fail("schema", f"schema {schema} is not supported; this mpsearch reads schema "
                  f"{SCHEMA_VERSION}")
    if "extends" not in root:
        return root.data
    parent_name = root.get_str("extends")
    parent_path = _find_parent(root, parent_name, path)
    seen = (*chain, path.resolve())
    if parent_path in seen:
        names = " -> ".join(p.name for p in (*seen, parent_path))
        root.fail("extends", f"extends cycle: {names}; remove one of the extends keys")
    parent = _read_merged(parent_path, seen)
    inherited = LineDict({k: v for k, v in parent.items() if k not in ("name", "extends")},
                         mark=parent.mark)
    inherited.marks.update(parent.marks)
    child = LineDict({k: v for k, v in root.data.items() if k != "extends"}, mark=root.data.mark)
    child.marks.update(root.data.marks)
    return merge_maps(inherited, child)


def _find_parent(root: Section, name: str, path: Path) -> Path:
    """``extends`` target: a path relative to ``path``, a sibling name or a shipped name.

    Only files inside ``path``'s own folder (after resolving links) or shipped profiles: an
    uploaded profile must not read arbitrary YAML on the machine through ``extends``.
    """
    folder = path.parent.resolve()
    if Path(name).is_absolute() or ".." in Path(name).parts or "\\" in name:
        root.fail("extends", f"extends '{name}' leaves the profile's folder; name a shipped "
                  "profile or a file next to this one")
    if name.endswith((".yaml", ".yml")):
        candidates = [path.parent / name]
    else:
        candidates = [path.parent / f"{name}.yaml", path.parent / f"{name}.yml"]
        shipped = shipped_profile_path(name)
        candidates += [shipped] if shipped is not None else []
    for candidate in candidates:
        if candidate.is_file():
            resolved = candidate.resolve()
            shipped = shipped_profile_path(name)
            if resolved.is_relative_to(folder) or (shipped is not None
                                                   and resolved == shipped.resolve()):
                return resolved
            root.fail("extends", f"extends '{name}' resolves outside the profile's folder "
                      f"({resolved}); name a shipped profile or a file next to this one")
    root.fail("extends", f"extends names '{name}', which is neither a file next to this one nor "
              f"a shipped profile ({', '.join(list_shipped()) or 'none'})")


# -- the profile -----------------------------------------------------------------------------
def build_profile(root: Section, path: Path) -> HardwareProfile:
    """Check the merged top-level mapping and build the profile."""
    root.check_keys(TOP_KEYS, required=REQUIRED_TOP)
    formats = _parse_formats(root.section("formats"))
    names = tuple(formats)
    default = _format_ref(root, "default_format", names)
    if not formats[default].is_float:
        root.fail("default_format", f"default_format '{default}' is not a float format; name "
                  "the float format kept for ops that are not quantized (e.g. fp32)")
    reference = _format_ref(root, "cost_reference", names, default=default)
    if formats[reference].relative_cost != 1.0:
        root.fail("cost_reference" if "cost_reference" in root else "default_format",
                  f"cost_reference format '{reference}' has relative_cost "
                  f"{formats[reference].relative_cost}; the reference format must cost 1.0")
    unlisted = root.get_str_list("unlisted_ops", (default,))
    _check_refs(root, "unlisted_ops", unlisted, names)
    rules = _parse_rules(root.section("op_rules"), formats)
    fields: dict[str, Any] = {
        "name": root.get_str("name", path.stem),
        "description": root.get_str("description"),
        "versions": root.get_str("versions"),
        "sources": root.get_str_list("sources", non_empty=True),
        "fallback": root.get_str("fallback", choices=FALLBACKS),
        "transition_cost": root.get_float("transition_cost", minimum=0.0, unknown=UNKNOWN),
        "memory_budget_bytes": root.get_int("memory_budget_bytes", minimum=0, unknown=UNKNOWN),
        "runtime": root.get_str("runtime", None, choices=RUNTIMES),
        "toolchain": _parse_toolchain(root),
        "weight_only": (parse_weight_only(root.section("weight_only"))
                        if "weight_only" in root else None),
    }
    unknowns = _unknowns(root.get_str_list("unknowns", ()), formats, rules, fields)
    return HardwareProfile(formats=formats, default_format=default, cost_reference=reference,
                           unlisted_ops=unlisted, op_rules=rules, unknowns=unknowns,
                           path=str(path), **fields)


def _parse_toolchain(root: Section) -> ToolchainRef | None:
    """``toolchain:``, its settings and its ``tolerance``."""
    return _with_tolerance(root, _toolchain_ref(root))


def _toolchain_ref(root: Section) -> ToolchainRef | None:
    """``toolchain: {name: qnn, htp_arch: 73}``: a known name and only its settings."""
    if "toolchain" not in root:
        return None
    sec = root.section("toolchain")
    name = sec.get_str("name", choices=tuple(TOOLCHAIN_SETTINGS))
    known = TOOLCHAIN_SETTINGS[name]
    sec.check_keys(("name", "tolerance", *known), required=("name",))
    settings: dict[str, Any] = {}
    for key in known:
        if key in sec:
            value = sec.data[key]
            if not isinstance(value, (str, int, float, bool)):
                sec.fail(key, f"{sec.path(key)} must be a string or a number, got {value!r}")
            settings[key] = value
            problem = toolchain_setting_problem(name, settings)
            if problem is not None:
                sec.fail(key, problem)
    return ToolchainRef(name=name, settings=settings)


def _with_tolerance(root: Section, ref: ToolchainRef | None) -> ToolchainRef | None:
    """``ref`` with ``toolchain.tolerance``: how far a verified point's target metric may lie
    from its ONNX Runtime metric (a number >= 0, in the metric's units)."""
    if ref is None:
        return None
    sec = root.section("toolchain")
    tolerance = sec.data.get("tolerance")
    if tolerance is None:
        return ref
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not (
            0 <= tolerance < float("inf")):
        sec.fail("tolerance", f"{sec.path('tolerance')} must be a number >= 0 (the largest "
                 f"|target - ONNX Runtime| metric difference a verified point may show), got "
                 f"{tolerance!r}")
    return dataclasses.replace(ref, tolerance=float(tolerance))


def _unknowns(notes: tuple[str, ...], formats: dict[str, Format], rules: dict[str, OpRule],
              fields: dict[str, Any]) -> tuple[str, ...]:
    found = list(notes)
    found += [f"formats.{n}.relative_cost" for n, f in formats.items() if f.relative_cost is None]
    found += [f"op_rules.{op}.cost.{n}" for op, r in rules.items()
              for n, c in r.cost.items() if c is None]
    found += [k for k in ("transition_cost", "memory_budget_bytes") if fields[k] is None]
    return tuple(dict.fromkeys(found))


def _format_ref(sec: Section, key: str, names: tuple[str, ...], default: Any = None) -> str:
    name: str = sec.get_str(key) if default is None else sec.get_str(key, default)
    if name not in names:
        sec.fail(key, f"{sec.path(key)} names format '{name}', which formats does not define; "
                 f"defined: {', '.join(sorted(names))}")
    return name


def _check_refs(sec: Section, key: str, refs: tuple[str, ...], names: tuple[str, ...]) -> None:
    marks = sec.data[key].marks if key in sec and hasattr(sec.data[key], "marks") else []
    for i, ref in enumerate(refs):
        if ref not in names:
            mark = marks[i] if i < len(marks) else sec.mark_of(key)
            sec.fail_at(mark, f"{sec.path(key)}[{i}] names format '{ref}', which formats does "
                        f"not define; defined: {', '.join(sorted(names))}")


# -- formats -----------------------------------------------------------------------------------
def _parse_formats(sec: Section) -> dict[str, Format]:
    if not sec.data:
        sec.fail_at(sec.data.mark, "formats is empty; define at least the float format (fp32)")
    formats: dict[str, Format] = {}
    for name in sec.keys():
        if not isinstance(name, str) or not _NAME.match(name):
            sec.fail(name, f"format name {name!r} must be a word such as int8 or fp32")
        formats[name] = _parse_format(sec.section(name), name)
    check_runs_as(sec, formats)
    return formats


def _parse_format(sec: Section, name: str) -> Format:
    sec.check_keys(FORMAT_KEYS, required=REQUIRED_FORMAT)
    activation = _parse_tensor(sec.section("activation"), ACTIVATION_DTYPES)
    weight = _parse_tensor(sec.section("weight"), WEIGHT_DTYPES)
    bias = sec.get_str("bias", choices=BIAS_DTYPES)
    if weight.is_float and bias not in (weight.dtype, "float32"):
        allowed = " or ".join(sorted({weight.dtype, "float32"}))
        sec.fail("bias", f"{sec.path('bias')} must be {allowed} with {weight.dtype} weights, "
                 f"got '{bias}'")
    if not weight.is_float and bias == "float16":
        sec.fail("bias", f"{sec.path('bias')} must be int32 or float32 with {weight.dtype} "
                 f"weights, got 'float16'")
    return Format(name=name, activation=activation, weight=weight, bias=bias,
                  executes=sec.get_str("executes", choices=EXECUTES),
                  relative_cost=sec.get_float("relative_cost", positive=True, unknown=UNKNOWN),
                  runs_as=sec.get_str("runs_as", None))


def _parse_tensor(sec: Section, dtypes: tuple[str, ...]) -> TensorFormat:
    sec.check_keys(TENSOR_KEYS, required=("dtype",))
    dtype: str = sec.get_str("dtype", choices=dtypes)
    if dtype.startswith("float"):
        for key in TENSOR_KEYS[1:]:
            if key in sec:
                sec.fail(key, f"{sec.path(key)} has no meaning for dtype {dtype}; remove it")
        return TensorFormat(dtype=dtype)
    sec.check_keys(TENSOR_KEYS, required=("dtype", "symmetric", "granularity"))
    granularity = sec.get_str("granularity", choices=GRANULARITIES)
    axis = sec.get_int("axis", None)
    if axis is not None and granularity != "per_channel":
        sec.fail("axis", f"{sec.path('axis')} only applies with granularity per_channel")
    narrow = sec.get_bool("narrow_range", False)
    if narrow and dtype.startswith("uint"):
        sec.fail("narrow_range", f"{sec.path('narrow_range')} applies to signed dtypes only, "
                 f"got dtype {dtype}")
    return TensorFormat(dtype=dtype, symmetric=sec.get_bool("symmetric"), granularity=granularity,
                        axis=axis, scale=sec.get_str("scale", "float", choices=SCALES),
                        narrow_range=narrow, reduce_range=sec.get_bool("reduce_range", False))


# -- op rules ----------------------------------------------------------------------------------
def _parse_rules(sec: Section, formats: dict[str, Format]) -> dict[str, OpRule]:
    rules: dict[str, OpRule] = {}
    for op_type in sec.keys():
        if not isinstance(op_type, str) or not _NAME.match(op_type):
            sec.fail(op_type, f"op type {op_type!r} must be an ONNX op type such as Conv")
        rules[op_type] = _parse_rule(sec.section(op_type), op_type, formats)
    return rules


def _parse_rule(sec: Section, op_type: str, formats: dict[str, Format]) -> OpRule:
    sec.check_keys(RULE_KEYS)
    names = tuple(formats)
    if ("formats" in sec) == ("exclude" in sec):
        sec.fail_at(sec.data.mark, f"{sec.where} needs exactly one of formats or exclude")
    if "formats" in sec:
        allowed = sec.get_str_list("formats", non_empty=True)
        _check_refs(sec, "formats", allowed, names)
    else:
        excluded = sec.get_str_list("exclude", non_empty=True)
        _check_refs(sec, "exclude", excluded, names)
        allowed = tuple(n for n in names if n not in excluded)
        if not allowed:
            sec.fail("exclude", f"{sec.path('exclude')} forbids every format "
                     f"({', '.join(sorted(names))}); keep at least one")
    return OpRule(
        op_type=op_type, formats=tuple(dict.fromkeys(allowed)),
        weight_granularity=sec.get_str("weight_granularity", None, choices=GRANULARITIES),
        weight_axis=sec.get_int("weight_axis", None),
        fixed_qparams=_parse_qparams(sec, allowed, formats),
        same_input_precision=sec.get_bool("same_input_precision", False),
        same_input_scale=sec.get_bool("same_input_scale", False),
        cost=_parse_cost(sec, allowed), on_cpu=sec.get_str("on_cpu", None),
        withheld=parse_withheld(sec, allowed, names))



def _parse_qparams(sec: Section, allowed: tuple[str, ...], formats: dict[str, Format],
                   ) -> dict[str, tuple[float, int]]:
    qp = sec.section("fixed_qparams", {})
    result: dict[str, tuple[float, int]] = {}
    for key in qp.keys():
        if key in INT_DTYPES:  # a dtype name wins over a format of the same name
            dtype = key
        elif key in allowed and not formats[key].activation.is_float:
            dtype = formats[key].activation.dtype
        else:
            choices = [n for n in allowed if not formats[n].activation.is_float]
            qp.fail(key, f"{qp.path(str(key))} must name a quantized format of this op "
                    f"({', '.join(choices) or 'none'}) or an integer dtype "
                    f"({', '.join(INT_DTYPES)})")
        result[key] = _parse_pair(qp, key, dtype)
    return result


def _parse_pair(qp: Section, key: str, dtype: str) -> tuple[float, int]:
    value = qp.data[key]
    ok = isinstance(value, list) and len(value) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if not ok or not value[0] > 0 or not isinstance(value[1], int):
        qp.fail(key, f"{qp.path(key)} must be [scale, zero_point] with scale > 0 and an integer "
                f"zero_point, got {value!r}")
    tensor = TensorFormat(dtype=dtype)
    if not tensor.qmin <= value[1] <= tensor.qmax:
        qp.fail(key, f"{qp.path(key)} zero_point {value[1]} is outside the {dtype} range "
                f"[{tensor.qmin}, {tensor.qmax}]")
    return float(value[0]), int(value[1])


def _parse_cost(sec: Section, allowed: tuple[str, ...]) -> dict[str, float | None]:
    cost = sec.section("cost", {})
    result: dict[str, float | None] = {}
    for key in cost.keys():
        if key not in allowed:
            cost.fail(key, f"{cost.path(str(key))} names format '{key}', which this op does "
                      f"not allow; allowed: {', '.join(allowed)}")
        result[key] = cost.get_float(key, positive=True, unknown=UNKNOWN)
    return result
