"""Live progress of a running ``mpsearch serve`` job, read from its run directory.

Consumes the worker's progress reports (``progress.jsonl``, written as data by
:class:`mpsearch.progress.JsonlProgress`) and, for a search, the study journal (read through
:func:`mpsearch.study_progress`); produces a plain dict: the current stage and its bar (done /
total / elapsed / time left), the search's finished trials, front size and best metric, and the
(metric, size) of every finished trial with the current Pareto front, for the live mini-chart.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mpsearch.pareto import nondominated
from mpsearch.progress import read_last
from mpsearch.rundir import RunDir

__all__ = ["job_progress", "pareto", "read_journal", "stage_message"]

_MAX_POINTS = 2_000
_STAGES = {
    "calibrate": "calibrating activation ranges on the calibration samples",
    "sensitivity": "per-node analysis: measuring each node alone in each format",
    "reverse": "per-node analysis: measuring each node kept in float, the rest quantized",
    "proxy": "estimating each node's sensitivity",
    "group costs": "measuring the cost of each group of nodes, to seed the search",
    "search": "searching: each trial builds one configuration and measures it on the search "
              "split",
    "held-out": "re-measuring the front on the held-out split (and timing it where this "
                "machine runs the target)",
}


def stage_message(stage: str | None) -> str:
    """What a stage of a job is doing, in a sentence."""
    if stage is None:
        return "loading the model and data"
    if stage.startswith("curve"):
        return "per-node analysis: measuring the accuracy-size curve"
    return _STAGES.get(stage, stage)


def read_journal(path: Path) -> tuple[list[tuple[float, float]], int]:
    """(metric, size) of every complete trial and the count of finished trials of a run's
    Optuna journal (the latest ``_MAX_POINTS`` points); ([], 0) when it is missing."""
    from mpsearch import study_progress

    points, finished = study_progress(path)
    return points[-_MAX_POINTS:], finished


def pareto(points: Sequence[tuple[float, float]], higher: bool) -> list[tuple[float, float]]:
    """Non-dominated (metric, size) points by :mod:`mpsearch.pareto`'s rule (sizes within
    0.1 % tie), one per distinct point, sorted by size."""
    sign = 1.0 if higher else -1.0
    unique = sorted(set(points), key=lambda p: (p[1], -sign * p[0]))
    kept = nondominated([(m, s, None) for m, s in unique], higher_is_better=higher)
    return [unique[i] for i in kept]


def _bar(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    done, total = int(record["done"]), record.get("total")
    elapsed = float(record.get("elapsed", 0.0))
    left = (elapsed / done * (total - done)) if done and total else None
    return {"stage": str(record["stage"]), "done": done, "total": total, "elapsed": elapsed,
            "left": left, "unit": record.get("unit", "step"),
            "postfix": dict(record.get("info") or {})}


def job_progress(run_dir: Path, *, kind: str, trials: int | None,
                 higher_is_better: bool = True) -> dict[str, Any]:
    """Everything the job page shows while ``run_dir``'s job runs (see module doc)."""
    run = RunDir(run_dir)
    bar = _bar(read_last(run.progress_jsonl))
    stage = bar["stage"] if bar else "starting"
    out: dict[str, Any] = {"stage": stage, "bar": bar,
                           "message": stage_message(bar["stage"] if bar else None)}
    if kind != "search":
        return out
    points, finished = read_journal(run.journal)
    front = pareto(points, higher_is_better)
    out.update({"trials_done": finished, "trials_total": trials, "front_size": len(front),
                "points": [list(p) for p in points], "front": [list(p) for p in front]})
    if front:
        out["best"] = max(p[0] for p in front) if higher_is_better else min(p[0]
                                                                            for p in front)
    left = bar["left"] if bar and bar["stage"] == "search" else None
    out["left"] = left
    return out
