"""What a target's verification decided about one configuration, and whether it passes.

Consumes what a toolchain made of an assignment (its held-out metric, placement and cost, or
the error that stopped it) and the profile's tolerance; produces :class:`Verified` (the record
a run directory's ``verify.json`` keeps per assignment) and the ``target_failure`` line of a
front point: the toolchain crashed, could not compile or run it, or its target metric lies
outside the tolerance of the metric ONNX Runtime measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpsearch.errors import TargetError
from mpsearch.evaluate import is_proportion
from mpsearch.profiles import HardwareProfile
from mpsearch.rundir import FrontPoint
from mpsearch.targets._base import ToolchainCrash

__all__ = ["DEFAULT_TOLERANCE", "Verified", "failure_of", "target_tolerance"]

#: A proportion metric's default tolerance (one point): the target's held-out metric may
#: differ from ONNX Runtime's by at most this much, either way.
DEFAULT_TOLERANCE = 0.01


def target_tolerance(profile: HardwareProfile, metric: str) -> float | None:
    """How far a point's target metric may lie from its ONNX Runtime metric: the profile's
    ``toolchain.tolerance``, else :data:`DEFAULT_TOLERANCE` for a proportion metric
    (accuracy, top5, agreement); None (no metric check) for other metrics without one."""
    ref = profile.toolchain
    if ref is not None and ref.tolerance is not None:
        return ref.tolerance
    return DEFAULT_TOLERANCE if is_proportion(metric) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Verified:
    """One assignment on the target: ``metric`` (held-out, as the target computes it),
    ``placement`` (:func:`~mpsearch.targets._verify.placement_record`) and ``cost``; or
    ``error``, why the toolchain gave no metric (a crash, a refused compile, a failed run).
    ``seconds``: how long compiling and running it took. ``samples``: how many held-out
    samples the target ran; when those are fewer than the split's (``evaluation.
    target_samples``), ``ort_metric`` is ONNX Runtime's metric on the same samples, the
    figure the verdict compares with."""

    metric: float | None
    placement: Mapping[str, Any] | None
    cost: Mapping[str, float] | None
    error: str | None = None
    seconds: float = 0.0
    samples: int | None = None
    ort_metric: float | None = None

    @classmethod
    def failed(cls, tool: str, version: str, stage: str, error: TargetError,
               seconds: float) -> Verified:
        """The record of ``error``, raised by ``tool`` at ``stage`` (compile or run)."""
        if isinstance(error, ToolchainCrash):
            doing = {"compile": "compiling", "run": "running"}.get(stage, stage)
            said = f"{tool} crashed while {doing} it: {error}"  # its status and last lines
        else:
            said = f"{tool} could not {stage} it: {error}"
        placement = {"toolchain": tool, "version": version, "error": said, "fallback": [],
                     "nodes": 0, "on_accelerator": 0, "counts": {}, "placements": []}
        return cls(metric=None, placement=placement, cost=None, error=said, seconds=seconds)

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "placement": None if self.placement is None
                else dict(self.placement), "cost": None if self.cost is None
                else dict(self.cost), "error": self.error, "seconds": self.seconds,
                "samples": self.samples, "ort_metric": self.ort_metric}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verified:
        return cls(metric=_float(data.get("metric")), placement=data.get("placement"),
                   cost=data.get("cost"), error=data.get("error"),
                   seconds=float(data.get("seconds") or 0.0), samples=data.get("samples"),
                   ort_metric=_float(data.get("ort_metric")))


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def failure_of(point: FrontPoint, verified: Verified, metric: str,
               tolerance: float | None) -> str | None:
    """Why ``verified`` rejects ``point`` (None: it passes): the toolchain's error, or a
    target metric further than ``tolerance`` from the point's ONNX Runtime metric."""
    if verified.error is not None:
        return verified.error
    if verified.metric is None:
        return "the toolchain gave no metric"
    if not math.isfinite(verified.metric):
        return f"{metric} on the target is {verified.metric}, not a number"
    if tolerance is None:
        return None
    ort = point.metric if verified.ort_metric is None else verified.ort_metric
    diff = verified.metric - ort
    if abs(diff) <= tolerance + 1e-9:
        return None
    same = "" if verified.ort_metric is None else f" on the same {verified.samples} samples"
    return (f"{metric} {verified.metric:.4f} on the target vs {ort:.4f} in ONNX Runtime"
            f"{same} ({diff:+.4f}): outside the profile's target tolerance {tolerance:g}")
