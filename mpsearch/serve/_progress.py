"""Live progress of a running ``mpsearch serve`` job, read from its run directory.

Consumes the worker's progress reports (``progress.jsonl``, written as data by
:class:`mpsearch.progress.JsonlProgress`) and, for a search, the study journal (read through
:func:`mpsearch.study_progress`); produces a plain dict: the current stage and its bar (done /
total / elapsed / time left), the search's finished trials, front size and best metric, and the
(metric, size) of every finished trial with the current Pareto front, for the live mini-chart,
and an estimate of the whole job across its stages (:func:`overall`).

The overall estimate is honest about what it cannot know: a stage's time is extrapolated only
from its own finished units; the search's remaining trials are the budget's, or, under the
patience rule, the trials until the patience stop if the front keeps still (a change restarts
that count, so it is "about", never "at most"); stages that have not started have no time until
they do (the held-out re-measure is estimated from the search's time per trial, as it measures
the front's points the same way on the held-out split).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from mpsearch.pareto import SIZE_TIE, nondominated
from mpsearch.progress import read_last
from mpsearch.rundir import RunDir

__all__ = ["job_progress", "overall", "pareto", "read_journal", "read_records",
           "since_change", "stage_message"]

_MAX_LOG_BYTES = 8 << 20
_FRONT_POINTS = 12  # the most points the held-out stage re-measures (the search's FRONT_POINTS)
_PHASES = {"calibrate": "loading and calibration", "recovery": "loading and calibration",
           "sensitivity": "per-node analysis",
           "reverse": "per-node analysis", "proxy": "per-node analysis",
           "curve": "per-node analysis", "group costs": "seeding", "search": "search",
           "held-out": "held-out re-measure"}

_MAX_POINTS = 2_000

#: A complete trial: (metric on the search split, weight bytes, its formats in words).
TrialPoint = tuple[float, float, str]
_STAGES = {
    "calibrate": "calibrating activation ranges on the calibration samples",
    "recovery": "deciding the accuracy recovery (CLE, SmoothQuant, GPTQ, bias correction) on "
                "the search split",
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


def read_journal(path: Path) -> tuple[list[TrialPoint], int]:
    """(metric, size, formats) of every complete trial and the count of finished trials of a
    run's Optuna journal (the latest ``_MAX_POINTS`` points); ([], 0) when it is missing."""
    from mpsearch import study_progress

    points, finished = study_progress(path)
    return points[-_MAX_POINTS:], finished


def pareto(points: Sequence[TrialPoint], higher: bool) -> list[TrialPoint]:
    """Non-dominated (metric, size, formats) points by :mod:`mpsearch.pareto`'s rule, sorted
    by size, ties collapsed: of points with one metric and sizes within the 0.1 % tie, the
    smallest (the first found among equal ones) stands for the rest."""
    sign = 1.0 if higher else -1.0
    first: dict[tuple[float, float], TrialPoint] = {}
    for point in points:
        first.setdefault((point[0], point[1]), point)
    unique = sorted(first.values(), key=lambda p: (p[1], -sign * p[0]))
    kept = [unique[i] for i in nondominated([(p[0], p[1], None) for p in unique],
                                            higher_is_better=higher)]
    out: list[TrialPoint] = []
    for point in kept:
        if out and out[-1][0] == point[0] and point[1] <= out[-1][1] * (1 + SIZE_TIE):
            continue
        out.append(point)
    return out


def since_change(points: Sequence[TrialPoint], higher: bool) -> int:
    """Complete trials (in order) since the last one that changed the (metric, size) front."""
    last = -1
    front: list[TrialPoint] = []
    for i, point in enumerate(points):
        grown = pareto([*front, point], higher)
        if grown != front:
            front, last = grown, i
    return len(points) - 1 - last


def _bar(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    done, total = int(record["done"]), record.get("total")
    elapsed = float(record.get("elapsed", 0.0))
    left = (elapsed / done * (total - done)) if done and total else None
    return {"stage": str(record["stage"]), "done": done, "total": total, "elapsed": elapsed,
            "left": left, "unit": record.get("unit", "step"),
            "postfix": dict(record.get("info") or {})}


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete record of a ``progress.jsonl`` (its last 8 MB), oldest first."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - _MAX_LOG_BYTES))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn line (the worker writes) or the cut first line
        if isinstance(record, dict) and {"stage", "done", "total"} <= record.keys():
            out.append(record)
    return out


def _phase(stage: str) -> str:
    return _PHASES.get(stage.partition(" (")[0], stage)


def _phases(kind: str, spec: Mapping[str, Any]) -> list[str]:
    """The stages a job of ``kind`` goes through with ``spec.yaml``'s settings, in order."""
    if kind != "search":
        return ["loading and calibration", "per-node analysis"]
    out = ["loading and calibration"]
    if spec.get("analysis", True):
        out.append("per-node analysis")
    if spec.get("seeding", True):
        out.append("seeding")
    return [*out, "search", "held-out re-measure"]


def _rate(records: Sequence[Mapping[str, Any]], stage: str) -> float | None:
    """Seconds per unit of ``stage``, from its records since the job last (re)started."""
    mine = [r for r in records if r["stage"] == stage]
    if len(mine) < 2:
        return None
    first, last = mine[0], mine[-1]
    done = int(last["done"]) - int(first["done"])
    spent = float(last.get("elapsed", 0.0)) - float(first.get("elapsed", 0.0))
    return spent / done if done > 0 and spent >= 0 else None


def _started(started: str | None, records: Sequence[Mapping[str, Any]]) -> float | None:
    if started:
        try:
            return datetime.fromisoformat(started).timestamp()
        except ValueError:
            pass
    return float(records[0]["time"]) if records and "time" in records[0] else None


def overall(records: Sequence[Mapping[str, Any]], *, kind: str, spec: Mapping[str, Any],
            started: str | None = None, trials_done: int = 0, trials: int | None = None,
            front_size: int = 0, since_change: int = 0, now: float | None = None
            ) -> dict[str, Any]:
    """The whole job's progress as an estimate (module doc): its stages and which one runs,
    the time elapsed, the time left (None when it cannot be told yet; ``since_change`` is the
    count of trials since the front last changed), whether that is an upper bound (never: the
    key stays for the page), and the fraction done (elapsed / (elapsed + left))."""
    now = time.time() if now is None else now
    begin = _started(started, [r for r in records if r.get("time")]) or now
    records = [r for r in records if float(r.get("time", now)) >= begin - 1.0]  # this run's
    phases = _phases(kind, spec)
    current = _phase(records[-1]["stage"]) if records else phases[0]
    if current not in phases:
        phases.insert(len(phases) - 1, current)
    index = phases.index(current)
    elapsed = max(0.0, now - begin)
    last = records[-1] if records else None
    left: float | None = None
    upper = False
    notes = []
    if current == "search":
        rate = _rate(records, "search")
        if rate is not None and trials:
            held = float((spec.get("data") or {}).get("held_out", 0.5) or 0.0)
            ratio = max(1.0, held / max(1e-6, 1.0 - held))
            points = min(max(front_size, 1), _FRONT_POINTS)
            remaining = max(0, trials - trials_done)
            patience = int((spec.get("budget") or {}).get("patience", 20) or 0)
            if patience:
                remaining = min(remaining, max(0, patience - since_change))
            left = rate * (remaining + points * ratio)
            notes.append("the held-out re-measure is counted as the front's points measured "
                         "like trials")
            if patience:
                notes.append(f"about: the patience stop ends the search {patience} trials "
                             "after the front last changed (now "
                             f"{min(since_change, patience)} ago); a change starts the count "
                             "again")
        else:
            notes.append("the time left shows once a few trials have finished")
    elif current == phases[-1] and current != "per-node analysis" and last is not None:
        rate = _rate(records, str(last["stage"]))
        if rate is not None and last.get("total"):
            left = rate * max(0, int(last["total"]) - int(last["done"]))
    elif "search" in phases[index + 1:]:
        notes.append("the time left shows once the search's first trials finish")
    else:
        notes.append("the analysis measures in several passes of unknown length")
    fraction = elapsed / (elapsed + left) if left is not None and elapsed + left > 0 else None
    return {"phases": phases, "index": index, "elapsed": elapsed, "left": left,
            "upper": upper, "fraction": fraction, "estimate": True, "notes": notes}


def _spec(run: RunDir) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(run.spec_yaml.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return doc if isinstance(doc, dict) else {}


def job_progress(run_dir: Path, *, kind: str, trials: int | None,
                 higher_is_better: bool = True, started: str | None = None
                 ) -> dict[str, Any]:
    """Everything the job page shows while ``run_dir``'s job runs (see module doc)."""
    run = RunDir(run_dir)
    records = read_records(run.progress_jsonl)
    bar = _bar(records[-1] if records else read_last(run.progress_jsonl))
    stage = bar["stage"] if bar else "starting"
    out: dict[str, Any] = {"stage": stage, "bar": bar,
                           "message": stage_message(bar["stage"] if bar else None)}
    spec = _spec(run)
    if kind != "search":
        out["overall"] = overall(records, kind=kind, spec=spec, started=started)
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
    out["overall"] = overall(records, kind=kind, spec=spec, started=started,
                             trials_done=finished, trials=trials, front_size=len(front),
                             since_change=since_change(points, higher_is_better))
    return out
