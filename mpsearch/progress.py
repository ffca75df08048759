"""Progress as data: long stages report :class:`Progress` to a callback and never print.

The CLI renders the reports as progress bars, a ``mpsearch serve`` job appends them to the run
directory's ``progress.jsonl`` (:class:`JsonlProgress`), tests collect them in a list. A stage
that receives ``None`` reports nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["JsonlProgress", "Progress", "Reporter", "read_last", "steps"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """``done`` of ``total`` units of ``stage`` (total None when unknown); ``info`` carries
    stage-specific figures (the search: best metric, front size, evaluations)."""

    stage: str
    done: int
    total: int | None
    unit: str = "step"
    info: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["info"] = dict(self.info)
        return data


Reporter = Callable[[Progress], None]
"""Receives each :class:`Progress` report of a run."""


def steps(items: Iterable[T], stage: str, report: Reporter | None, *, total: int | None = None,
          unit: str = "step") -> Iterator[T]:
    """Yield ``items``, reporting the stage's progress before the first and after each one."""
    if report is None:
        yield from items
        return
    count = total if total is not None else (len(items) if isinstance(items, Sized) else None)
    report(Progress(stage=stage, done=0, total=count, unit=unit))
    for done, item in enumerate(items, start=1):
        yield item
        report(Progress(stage=stage, done=done, total=count, unit=unit))


class JsonlProgress:
    """A :data:`Reporter` that appends reports to a JSON-lines file, at most one per
    ``interval`` seconds per stage (the first and the last report of a stage always)."""

    def __init__(self, path: Path, interval: float = 0.5) -> None:
        self.path = path
        self.interval = interval
        self._last: dict[str, float] = {}
        self._start: dict[str, float] = {}

    def __call__(self, progress: Progress) -> None:
        now = time.monotonic()
        final = progress.total is not None and progress.done >= progress.total
        first = progress.stage not in self._last
        if not (first or final or now - self._last[progress.stage] >= self.interval):
            return
        self._last[progress.stage] = now
        elapsed = now - self._start.setdefault(progress.stage, now)
        line = json.dumps({**progress.to_dict(), "elapsed": elapsed, "time": time.time()},
                          default=str)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def read_last(path: Path, tail_bytes: int = 16_384) -> dict[str, Any] | None:
    """The last complete record of a :class:`JsonlProgress` file: a :class:`Progress` as a
    dict with ``elapsed`` seconds in its stage (None when there is none)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line while the worker writes
        if isinstance(record, dict) and {"stage", "done", "total"} <= record.keys():
            return record
    return None
