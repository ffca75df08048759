"""Schema checks of a profile's declarations of what its target really does: a format's
``runs_as`` (another format the target computes it as) and an op rule's ``withheld`` formats
(taken by the toolchain alone, not offered, with a reason). Used by :mod:`._schema`."""

from __future__ import annotations

from mpsearch._yaml import Section
from mpsearch.profiles._types import Format

__all__ = ["check_runs_as", "parse_withheld"]


def check_runs_as(sec: Section, formats: dict[str, Format]) -> None:
    """Each ``runs_as`` names another format of the profile, one that does not run as a third,
    float when the format is float and integer when it is integer."""
    for name, fmt in formats.items():
        if fmt.runs_as is None:
            continue
        target = formats.get(fmt.runs_as)
        where = sec.section(name)
        if target is None or fmt.runs_as == name:
            where.fail("runs_as", f"{where.path('runs_as')} names '{fmt.runs_as}'; name another "
                       f"format of this profile ({', '.join(sorted(set(formats) - {name}))})")
        elif target.runs_as is not None:
            where.fail("runs_as", f"{where.path('runs_as')} names '{fmt.runs_as}', which runs as "
                       f"'{target.runs_as}' itself; name the format the target computes")
        elif target.is_float != fmt.is_float:
            where.fail("runs_as", f"{where.path('runs_as')}: '{name}' and '{fmt.runs_as}' must "
                       "both be float or both integer formats")


def parse_withheld(sec: Section, allowed: tuple[str, ...], names: tuple[str, ...]
                    ) -> dict[str, str]:
    """``withheld: {int8: why}``: formats defined, not offered for the op, each with a reason."""
    if "withheld" not in sec:
        return {}
    sub = sec.section("withheld")
    out: dict[str, str] = {}
    for key in sub.keys():
        if key not in names or key in allowed:
            sub.fail(key, f"{sub.path(key)}: withheld names a format that is not defined or is "
                     f"offered for the op; withhold one of "
                     f"{', '.join(n for n in names if n not in allowed) or 'none'}")
        out[str(key)] = sub.get_str(key)
    return out
