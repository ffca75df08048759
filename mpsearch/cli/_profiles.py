"""``mpsearch profiles list | show | validate | check``: thin CLI over :mod:`mpsearch.profiles`
and, for ``check``, the pipeline's toolchain probes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mpsearch import (
    Format,
    HardwareProfile,
    list_profiles,
    load_profile,
    validate_profile_file,
)
from mpsearch.errors import ProfileError

__all__ = ["add_profiles_parser"]


def add_profiles_parser(subparsers: Any) -> None:
    """Register ``profiles list``, ``show``, ``validate`` and ``check``."""
    profiles = subparsers.add_parser("profiles", help="list, show or validate hardware profiles")
    commands = profiles.add_subparsers(dest="profiles_command", required=True,
                                       metavar="SUBCOMMAND")
    listing = commands.add_parser("list", help="shipped hardware profiles")
    listing.set_defaults(func=_list)
    show = commands.add_parser("show", help="formats and op rules of one profile")
    show.add_argument("profile", metavar="NAME_OR_PATH", help="shipped name or YAML file")
    show.add_argument("--json", action="store_true", help="print the resolved profile as JSON")
    show.set_defaults(func=_show)
    validate = commands.add_parser("validate", help="check profile files strictly")
    validate.add_argument("files", metavar="FILE", nargs="+", help="profile YAML files")
    validate.set_defaults(func=_validate)
    check = commands.add_parser("check", help="run the profile's toolchain over op x format "
                                "probes and report where it disagrees with the profile")
    check.add_argument("profile", metavar="NAME_OR_PATH", help="shipped name or YAML file")
    check.add_argument("--ops", action="append", help="comma-separated op types, repeatable "
                       "(default: every listed op that has a probe, and Erf)")
    check.add_argument("--all", action="store_true", help="print every probe, not only "
                       "the disagreements")
    check.add_argument("--json", action="store_true", help="print the probes as JSON")
    check.set_defaults(func=_check)


def _list(args: argparse.Namespace) -> int:
    from mpsearch import AUTO_X86_PROFILE, host_int8_isa, x86_profile_for

    for name in list_profiles():
        print(f"{name:<16} {load_profile(name).description}")
    isa = host_int8_isa()
    print(f"{AUTO_X86_PROFILE:<16} x86_ort on CPUs with VNNI or AMX, x86_ort_avx2 on the others "
          f"(here: {x86_profile_for(isa)}; this CPU is {isa.describe()})")
    return 0


def _show(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    if args.json:
        print(json.dumps(profile.to_dict(), indent=2))
    else:
        print("\n".join(describe(profile)))
    return 0


def _validate(args: argparse.Namespace) -> int:
    for file in args.files:
        try:
            validate_profile_file(file)
        except ProfileError as e:
            print(f"mpsearch: error: {e}", file=sys.stderr)
            return 2
        print(f"ok {file}")
    return 0


def _check(args: argparse.Namespace) -> int:
    """Exit 0 when the toolchain agrees with every probed claim, 1 when it does not."""
    from mpsearch.pipeline import check_profile_claims

    named = (o.strip() for text in args.ops or () for o in text.split(","))
    ops = list(dict.fromkeys(o for o in named if o)) or None  # each op once, however often named

    def progress(what: str) -> None:
        if not args.json:
            print(f"  probing {what}", file=sys.stderr, end="\r", flush=True)

    profile, version, results = check_profile_claims(args.profile, ops=ops, progress=progress)
    wrong = [r for r in results if not r.agrees]
    if args.json:
        print(json.dumps({"profile": profile.name, "toolchain": version,
                          "settings": dict(profile.toolchain.settings)
                          if profile.toolchain else {},
                          "probes": [{**{k: getattr(r, k) for k in (
                              "op_type", "format", "claimed", "unit", "precision", "expected",
                              "error", "reason")}, "agrees": r.agrees} for r in results]},
                         indent=2))
        return 1 if wrong else 0
    settings = dict(profile.toolchain.settings) if profile.toolchain else {}
    print(f"{profile.name}: {len(results)} probes with {version} {settings}", " " * 20)
    print(f"{'op':<22} {'format':<7} {'profile':<12} {'toolchain':<12} {'precision':<9} "
          f"{'error':>7}  verdict")
    for r in results:
        if r.agrees and not args.all:
            continue
        error = "-" if r.error is None else f"{r.error:.4f}"
        verdict = "ok" if r.agrees else "DISAGREES"
        print(f"{r.op_type:<22} {r.format:<7} {r.claimed:<12} {r.unit:<12} {r.precision:<9} "
              f"{error:>7}  {verdict}{': ' + r.reason if r.reason and not r.agrees else ''}")
    print(f"{len(wrong)} of {len(results)} probes disagree with the profile")
    return 1 if wrong else 0


def _format_line(fmt: Format) -> str:
    def tensor(role: str, t: Any) -> str:
        if t.is_float:
            return f"{role} {t.dtype}"
        sym = "sym" if t.symmetric else "asym"
        axis = f" axis {t.axis}" if t.axis is not None else ""
        extra = (" pow2" if t.scale == "pow2" else "") + (" narrow" if t.narrow_range else "")
        return f"{role} {t.dtype} {sym} {t.granularity}{axis}{extra}"

    cost = "unknown" if fmt.relative_cost is None else f"{fmt.relative_cost:g}"
    return (f"  {fmt.name:<8} {tensor('act', fmt.activation):<32} {tensor('w', fmt.weight):<34}"
            f" bias {fmt.bias:<8} {fmt.executes:<12} cost {cost}")


def describe(profile: HardwareProfile) -> list[str]:
    """Human-readable lines for ``profiles show``."""
    lines = [f"{profile.name}: {profile.description}", f"versions: {profile.versions}",
             f"fallback: {profile.fallback}; default format: {profile.default_format}; "
             f"costs relative to: {profile.cost_reference}", "formats:"]
    lines += [_format_line(f) for f in profile.formats.values()]
    lines.append(f"op rules (unlisted ops: {', '.join(profile.formats_for('<unlisted>'))}):")
    for op, rule in profile.op_rules.items():
        notes = []
        if rule.weight_granularity:
            notes.append(f"weights {rule.weight_granularity}")
        if rule.weight_axis is not None:
            notes.append(f"axis {rule.weight_axis}")
        if rule.same_input_precision:
            notes.append("same input precision")
        if rule.same_input_scale:
            notes.append("same input scale")
        notes += [f"fixed {k}={v[0]:g}/{v[1]}" for k, v in rule.fixed_qparams.items()]
        notes += [f"cost {k}={'unknown' if v is None else f'{v:g}'}" for k, v in rule.cost.items()]
        suffix = f"  ({'; '.join(notes)})" if notes else ""
        lines.append(f"  {op:<20} {', '.join(profile.formats_for(op))}{suffix}")
    budget = profile.memory_budget_bytes
    transition = profile.transition_cost
    lines.append(f"memory budget: {'unknown' if budget is None else f'{budget} bytes'}; "
                 f"transition cost: {'unknown' if transition is None else f'{transition:g}'}")
    lines += ["unknowns:"] + [f"  - {u}" for u in profile.unknowns]
    lines += ["sources:"] + [f"  - {s}" for s in profile.sources]
    return lines
