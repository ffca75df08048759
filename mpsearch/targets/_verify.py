"""The target's toolchain in the search: placement as feasibility, front points re-measured
with the target's numerics and judged, and the artifact beside an export.

Consumes the run's quantizer, the profile's ``toolchain`` and held-out data; produces
:class:`Compiled` values (cached by assignment, refusals and crashes too) and shown front
points carrying ``target_metric`` (the held-out metric as the target computes it),
``target_placement`` (counts, every node with its unit, precision and the toolchain's reason),
``target_cost`` (the toolchain's own figures) and ``target_failure`` (why the target rejects
the point, :mod:`._verdict`). Each point's :class:`~._verdict.Verified` record is handed to a
``save`` callback as soon as it is known, so a stopped run keeps it and a resumed one reuses it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mpsearch.assignment import Assignment, make_assignment
from mpsearch.data import Dataset
from mpsearch.errors import TargetError
from mpsearch.evaluate import Evaluator
from mpsearch.profiles import HardwareProfile
from mpsearch.progress import Progress, Reporter
from mpsearch.quantize import Quantizer
from mpsearch.rundir import Front, FrontPoint
from mpsearch.targets import Compiled, Toolchain, toolchain
from mpsearch.targets._verdict import Verified, failure_of, target_tolerance

__all__ = ["AUTO_FLOOR", "AUTO_SECONDS", "TargetVerifier", "fingerprint", "placement_record",
           "target_for", "toolchain_version"]

logger = logging.getLogger(__name__)

#: ``evaluation.target_samples: auto``: the samples a point's verification may take, in seconds
#: of the target's time a sample, and the fewest it runs whatever that time (with fewer, one
#: sample is more than three points of the metric).
AUTO_SECONDS = 60.0
AUTO_FLOOR = 32


def target_for(profile: HardwareProfile) -> Toolchain:
    """The usable adapter of ``profile``'s toolchain (:class:`TargetError` saying what to
    install, or that the profile names none)."""
    if profile.toolchain is None:
        raise TargetError(f"profile {profile.name} names no toolchain (no 'toolchain:' key); "
                          "verification needs a profile whose target has one (docs/targets.md)")
    adapter = toolchain(profile.toolchain.name)
    why = adapter.missing()
    if why is not None:
        raise TargetError(f"profile {profile.name}: {why}")
    return adapter


def toolchain_version(tool: Toolchain) -> str:
    """The toolchain's version as its adapter reports it (a tiny compile when it must)."""
    report = getattr(tool, "version", None)
    return str(report()) if callable(report) else tool.name


def fingerprint(assignment: Assignment) -> str:
    """A short, stable name of ``assignment`` (its key's digest): work folders and the
    records of ``verify.json`` are named by it."""
    return hashlib.sha256(assignment.key().encode()).hexdigest()[:16]


class TargetVerifier:
    """Compiles assignments of one quantizer with the profile's toolchain, once each (a
    refusal or a crash is remembered too, and raised again without compiling)."""

    def __init__(self, quantizer: Quantizer, workdir: Path,
                 sample: Mapping[str, np.ndarray]) -> None:
        self.quantizer = quantizer
        self.profile = quantizer.profile
        self.tool = target_for(self.profile)
        ref = self.profile.toolchain
        self.settings = {} if ref is None else dict(ref.settings)
        self.workdir = Path(workdir)
        self.sample = {k: np.asarray(v[:1]) for k, v in sample.items()}
        self._compiled: dict[str, tuple[tuple[str, ...], Compiled]] = {}
        self._refused: dict[str, TargetError] = {}
        #: How many times the toolchain's compiler was run (cached configurations excepted).
        self.compiles = 0

    def compile(self, assignment: Assignment, *, folder: Path | None = None
                ) -> tuple[tuple[str, ...], Compiled]:
        """The output names of ``assignment``'s QDQ model and what the toolchain made of it
        (in ``folder``, by default one of the work directory named after the assignment)."""
        key = assignment.key()
        if key in self._refused:
            raise self._refused[key]
        if key not in self._compiled:
            model = self.quantizer.build(assignment)
            folder = folder or self.workdir / fingerprint(assignment)[:12]
            self.compiles += 1
            try:
                compiled = self.tool.compile(model, folder, calibration=[self.sample],
                                             settings=self.settings)
            except TargetError as e:
                self._refused[key] = e
                raise
            self._compiled[key] = (tuple(o.name for o in model.graph.output), compiled)
        return self._compiled[key]

    def refusal(self, assignment: Assignment) -> str | None:
        """None when the target runs ``assignment`` wholly on its accelerator, else why not
        (the search's feasibility check: a refused compile or a crash is infeasible too)."""
        try:
            _, compiled = self.compile(assignment)
        except TargetError as e:
            return f"the toolchain cannot compile it: {e}"
        fallback = compiled.fallback
        if not fallback:
            return None
        first = fallback[0]
        return (f"{len(fallback)} node(s) fall back to the CPU on {compiled.toolchain}, e.g. "
                f"{first.node}: {first.reason}")

    def outputs(self, compiled: Compiled, names: tuple[str, ...], evaluator: Evaluator,
                done: Callable[[int], None] | None = None) -> np.ndarray:
        """The evaluator's output on all its data, as the target computes it, a batch of
        the evaluator's size per call (``done`` hears each batch's sample count)."""
        index = names.index(evaluator.output)
        parts = []
        for feeds in evaluator.data.batches(evaluator.batch_size):
            parts.append(self.tool.run(compiled, feeds)[index])
            if done is not None:
                done(len(parts[-1]))
        return np.concatenate(parts, axis=0)

    def affordable(self, assignments: Iterable[Assignment], data: Dataset
                   ) -> tuple[int, float | None]:
        """How many of ``data``'s first samples the target runs for each assignment in
        :data:`AUTO_SECONDS` (all when they fit, at least :data:`AUTO_FLOOR`), and the seconds
        a sample that came from: one sample of the first assignment that compiles, timed
        after a warm-up run that loads its artifact (None when none compiles)."""
        one = next(iter(data.batches(1)))
        for assignment in assignments:
            try:
                _, compiled = self.compile(assignment)
                self.tool.run(compiled, one)
                start = time.perf_counter()
                self.tool.run(compiled, one)
            except TargetError:
                continue  # its verification records why
            each = time.perf_counter() - start
            fits = int(AUTO_SECONDS / max(each, 1e-6))
            return min(len(data), max(AUTO_FLOOR, fits)), each
        return len(data), None

    def shown(self, front: Front) -> list[Assignment]:
        """The assignments of ``front``'s shown points."""
        return [self._assignment(p) for p in front.shown]

    def verify(self, assignment: Assignment, evaluator: Evaluator,
               done: Callable[[int], None] | None = None, *, subset: bool = False
               ) -> Verified:
        """``assignment`` compiled and run on ``evaluator``'s data: its record (an error
        record when the toolchain refuses, crashes or fails, never an exception). With
        ``subset`` (the data is part of the held-out split), ONNX Runtime's metric on the
        same samples is kept beside it."""
        start = time.perf_counter()
        version = toolchain_version(self.tool)
        try:
            names, compiled = self.compile(assignment)
        except TargetError as e:
            return Verified.failed(self.tool.name, version, "compile", e,
                                   time.perf_counter() - start)
        try:
            outputs = self.outputs(compiled, names, evaluator, done)
        except TargetError as e:
            return Verified.failed(self.tool.name, version, "run", e,
                                   time.perf_counter() - start)
        primary = evaluator.primary.name
        ort = (evaluator.evaluate(self.quantizer.build(assignment)).metrics[primary]
               if subset else None)
        return Verified(metric=evaluator.metrics(outputs)[primary],
                        placement={**placement_record(compiled), "samples": len(outputs),
                                   "ort_metric": ort},
                        cost=dict(compiled.cost), seconds=time.perf_counter() - start,
                        samples=len(outputs), ort_metric=ort)

    def front(self, front: Front, evaluator: Evaluator, *,
              known: Mapping[str, Verified] | None = None,
              save: Callable[[str, Verified], None] | None = None,
              progress: Reporter | None = None, subset: bool = False) -> Front:
        """``front`` with every shown point verified on the target and judged: a record in
        ``known`` (by :func:`fingerprint`) is used as it is, any other is measured and
        handed to ``save`` before the next point starts. ``progress`` hears stage
        ``verify`` in samples (``info``: points verified so far); ``subset``: the
        evaluator holds only the first held-out samples (:meth:`verify`)."""
        known = dict(known or {})
        tolerance = target_tolerance(self.profile, evaluator.primary.name)
        names = {p.index: fingerprint(self._assignment(p)) for p in front.points if p.shown}
        todo = [p for p in front.points if p.shown and names[p.index] not in known]
        ticker = _Ticker(progress, len(todo), len(evaluator.data))
        for done, point in enumerate(todo, start=1):
            record = self.verify(self._assignment(point), evaluator, ticker.samples,
                                 subset=subset)
            known[names[point.index]] = record
            self._log(point, record, evaluator.primary.name)
            if save is not None:
                save(names[point.index], record)
            ticker.point(done)
        points = tuple(_judged(p, known[names[p.index]], evaluator.primary.name, tolerance)
                       if p.shown else p for p in front.points)
        return dataclasses.replace(front, points=points)

    def _assignment(self, point: FrontPoint) -> Assignment:
        return make_assignment(self.quantizer.graph, self.profile, point.assignment)

    @staticmethod
    def _log(point: FrontPoint, record: Verified, metric: str) -> None:
        if record.error is not None:
            logger.info("front point %d: %s", point.index, record.error)  # in front.json
            return
        placed = record.placement or {}
        logger.info("front point %d on %s: %s %.4f (ONNX Runtime %.4f), %d node(s) on the CPU, "
                    "%.1f s", point.index, placed.get("toolchain"), metric, record.metric,
                    point.metric, len(placed.get("fallback", ())), record.seconds)


class _Ticker:
    """Stage ``verify``'s reports: samples run on the target of all the points to verify,
    and the points done."""

    def __init__(self, progress: Reporter | None, points: int, samples: int) -> None:
        self.progress, self.each, self.total = progress, samples, points * samples
        self.done, self.points = 0, 0
        self._report()

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(Progress(stage="verify", done=self.done, total=self.total,
                                   unit="sample", info={"verified": self.points}))

    def samples(self, count: int) -> None:
        self.done += count
        self._report()

    def point(self, done: int) -> None:
        """``done`` points verified (a failed one counts all its samples)."""
        self.points, self.done = done, done * self.each
        self._report()


def _judged(point: FrontPoint, record: Verified, metric: str, tolerance: float | None
            ) -> FrontPoint:
    """``point`` with ``record``'s figures and the verdict on them."""
    return dataclasses.replace(
        point, target_metric=record.metric,
        target_placement=None if record.placement is None else dict(record.placement),
        target_cost=None if record.cost is None else dict(record.cost),
        target_failure=failure_of(point, record, metric, tolerance))


def placement_record(compiled: Compiled) -> dict[str, Any]:
    """What a run directory keeps of a compilation: the summary and every placement."""
    return {**compiled.summary(), "placements": [p.to_dict() for p in compiled.placements],
            "settings": dict(compiled.settings)}
