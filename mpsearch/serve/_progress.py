"""Live progress of a running ``mpsearch serve`` job, read from its run directory.

Consumes the job log (the worker's stderr: tqdm bars separated by carriage returns) and, for a
search, the study journal (``study.journal``, read through :func:`mpsearch.search.study_progress`);
produces a plain dict: the current stage and its bar (done / total / time left), the search's
finished trials, front size and best metric, and the (metric, size) of every finished trial
with the current Pareto front, for the live mini-chart (progress is best effort).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["job_progress", "last_bar", "last_info", "pareto", "read_journal", "seconds"]

_TAIL_BYTES = 16_384
_MAX_POINTS = 2_000
_BAR = re.compile(
    r"(?:(?P<desc>[^\r\n|]*?):\s*)?(?P<pct>\d+)%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*"
    r"\[(?P<elapsed>[\d:]+)<(?P<left>[\d:?]+)(?P<rest>[^\]]*)\]")
_POSTFIX = re.compile(r"(\w+)=([^,\s]+)")


def seconds(text: str) -> float | None:
    """``"1:02:03"`` / ``"02:03"`` -> seconds; ``None`` for ``"?"``."""
    try:
        total = 0.0
        for part in text.split(":"):
            total = total * 60 + float(part)
        return total
    except ValueError:
        return None


def tail(path: Path, size: int = _TAIL_BYTES) -> str:
    """The last ``size`` bytes of ``path`` as text ('' when missing)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def last_bar(text: str) -> dict[str, Any] | None:
    """The last tqdm bar state in ``text``: stage, done, total, elapsed/left seconds, postfix."""
    matches = list(_BAR.finditer(text))
    if not matches:
        return None
    found = matches[-1]
    rest = found.group("rest")
    return {
        "stage": (found.group("desc") or "").strip() or "working",
        "done": int(found.group("n")), "total": int(found.group("total")),
        "elapsed": seconds(found.group("elapsed")), "left": seconds(found.group("left")),
        "postfix": dict(_POSTFIX.findall(rest)),
    }


def last_info(text: str) -> str:
    """The message of the last ``INFO logger: message`` line of ``text`` ('' if none)."""
    for part in reversed(re.split(r"[\r\n]+", text)):
        if part.startswith("INFO "):
            return part.partition(": ")[2].strip()
    return ""


def read_journal(path: Path) -> tuple[list[tuple[float, float]], int]:
    """(metric, size) of every complete trial and the count of finished trials of a run's
    Optuna journal (the latest ``_MAX_POINTS`` points); ([], 0) when it is missing."""
    from mpsearch.search import study_progress

    points, finished = study_progress(path)
    return points[-_MAX_POINTS:], finished


def pareto(points: Sequence[tuple[float, float]], higher: bool) -> list[tuple[float, float]]:
    """Non-dominated (metric, size) points (better metric, smaller size), sorted by size."""
    sign = 1.0 if higher else -1.0
    front: list[tuple[float, float]] = []
    for metric, size in sorted(set(points), key=lambda p: (p[1], -sign * p[0])):
        if not front or sign * metric > sign * front[-1][0]:
            front.append((metric, size))
    return front


def job_progress(run_dir: Path, *, kind: str, trials: int | None,
                 higher_is_better: bool = True) -> dict[str, Any]:
    """Everything the job page shows while ``run_dir``'s job runs (see module doc)."""
    text = tail(run_dir / "job.log")
    bar = last_bar(text)
    out: dict[str, Any] = {"stage": bar["stage"] if bar else "starting", "bar": bar,
                           "message": last_info(text)[:300] or "loading the libraries"}
    if kind != "search":
        return out
    points, finished = read_journal(run_dir / "study.journal")
    front = pareto(points, higher_is_better)
    out.update({"trials_done": finished, "trials_total": trials, "front_size": len(front),
                "points": [list(p) for p in points], "front": [list(p) for p in front]})
    if front:
        out["best"] = max(p[0] for p in front) if higher_is_better else min(p[0]
                                                                            for p in front)
    left = bar["left"] if bar and bar["stage"] == "search" else None
    if left is None and bar and bar["stage"] == "search" and finished and trials:
        elapsed = bar["elapsed"] or 0.0
        left = elapsed / max(bar["done"], 1) * max(trials - finished, 0)
    out["left"] = left
    return out
