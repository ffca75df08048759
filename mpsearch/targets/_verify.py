"""The target's toolchain in the search: placement as feasibility, front points re-measured
with the target's numerics, and the artifact beside an export.

Consumes the run's quantizer, the profile's ``toolchain`` and held-out data; produces
:class:`Compiled` values (cached by assignment) and front points carrying
``target_metric`` (the held-out metric as the target computes it), ``target_placement``
(counts, every node with its unit, precision and the toolchain's reason) and
``target_cost`` (the toolchain's own figures).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from mpsearch.assignment import Assignment, make_assignment
from mpsearch.errors import TargetError
from mpsearch.evaluate import Evaluator
from mpsearch.profiles import HardwareProfile
from mpsearch.quantize import Quantizer
from mpsearch.rundir import Front, FrontPoint
from mpsearch.targets import Compiled, Toolchain, toolchain

__all__ = ["TargetVerifier", "placement_record", "target_for", "toolchain_version"]

logger = logging.getLogger(__name__)


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


class TargetVerifier:
    """Compiles assignments of one quantizer with the profile's toolchain, once each."""

    def __init__(self, quantizer: Quantizer, workdir: Path,
                 sample: Mapping[str, np.ndarray]) -> None:
        self.quantizer = quantizer
        self.profile = quantizer.profile
        self.tool = target_for(self.profile)
        ref = self.profile.toolchain
        self.settings = {} if ref is None else dict(ref.settings)
        self.workdir = Path(workdir)
        self.sample = {k: np.asarray(v[:1]) for k, v in sample.items()}
        self._compiled: dict[str, tuple[onnx.ModelProto, Compiled]] = {}

    def compile(self, assignment: Assignment, *, folder: Path | None = None
                ) -> tuple[onnx.ModelProto, Compiled]:
        """The QDQ model of ``assignment`` and what the toolchain made of it (in ``folder``,
        by default one of the work directory named after the assignment)."""
        key = assignment.key()
        if key not in self._compiled:
            model = self.quantizer.build(assignment)
            if folder is None:
                folder = self.workdir / hashlib.sha256(key.encode()).hexdigest()[:12]
            compiled = self.tool.compile(model, folder, calibration=[self.sample],
                                         settings=self.settings)
            self._compiled[key] = (model, compiled)
        return self._compiled[key]

    def refusal(self, assignment: Assignment) -> str | None:
        """None when the target runs ``assignment`` wholly on its accelerator, else why not
        (the search's feasibility check)."""
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

    def outputs(self, compiled: Compiled, model: onnx.ModelProto,
                evaluator: Evaluator) -> np.ndarray:
        """The evaluator's output on all its data, as the target computes it."""
        names = [o.name for o in model.graph.output]
        index = names.index(evaluator.output)
        parts = [self.tool.run(compiled, feeds)[index]
                 for feeds in evaluator.data.batches(evaluator.batch_size)]
        return np.concatenate(parts, axis=0)

    def point(self, point: FrontPoint, evaluator: Evaluator) -> FrontPoint:
        """``point`` with its target metric, placement and cost."""
        assignment = make_assignment(self.quantizer.graph, self.profile, point.assignment)
        try:
            model, compiled = self.compile(assignment)
        except TargetError as e:  # shown with the point: the target cannot take it at all
            logger.warning("front point %d: %s", point.index, e)
            return dataclasses.replace(point, target_placement={
                "toolchain": self.tool.name, "version": toolchain_version(self.tool),
                "error": str(e), "fallback": [], "nodes": 0,
                "on_accelerator": 0, "counts": {}, "placements": []})
        metrics = evaluator.metrics(self.outputs(compiled, model, evaluator))
        metric = metrics[evaluator.primary.name]
        logger.info("front point %d on %s: %s %.4f (ONNX Runtime %.4f), %d node(s) on the CPU",
                    point.index, compiled.toolchain, evaluator.primary.name, metric,
                    point.metric, len(compiled.fallback))
        return dataclasses.replace(point, target_metric=metric,
                                   target_placement=placement_record(compiled),
                                   target_cost=dict(compiled.cost))

    def front(self, front: Front, evaluator: Evaluator) -> Front:
        """Every front point re-measured on the target (:meth:`point`)."""
        points = tuple(self.point(p, evaluator) for p in front.points)
        return dataclasses.replace(front, points=points)


def placement_record(compiled: Compiled) -> dict[str, Any]:
    """What a run directory keeps of a compilation: the summary and every placement."""
    return {**compiled.summary(), "placements": [p.to_dict() for p in compiled.placements],
            "settings": dict(compiled.settings)}
