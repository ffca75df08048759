"""The interface every target toolchain adapter implements, and the values it returns.

An adapter takes the QDQ model mpsearch exported for an assignment and hands it to the
vendor's own compiler or emulator; it returns where each node runs and in which precision
(:class:`Placement`, with the toolchain's own reason for a node left on the CPU), the
toolchain's cost figures and the deployable artifact (:class:`Compiled`), and runs that
artifact to give the outputs as the target computes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx

from mpsearch.errors import TargetError

__all__ = ["ACCELERATOR", "CPU", "Compiled", "Placement", "Toolchain", "ToolchainCrash",
           "log_tail"]

ACCELERATOR = "accelerator"
CPU = "cpu"


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where the toolchain runs one node of the model given to ``compile()``.

    ``unit``: ``accelerator`` or ``cpu``; ``precision`` as the toolchain reports it (``int8``,
    ``int16``, ``fp16``, ``fp32``...); ``reason``: the toolchain's own words when the node is
    not on the accelerator; ``cycles``: the toolchain's cycle count for the node, if it gives
    one."""

    node: str
    unit: str
    precision: str
    reason: str = ""
    cycles: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "unit": self.unit, "precision": self.precision,
                "reason": self.reason, "cycles": self.cycles}


@dataclass(frozen=True, slots=True, kw_only=True)
class Compiled:
    """One model through one toolchain: placements, the toolchain's cost figures (its own
    names and units, e.g. ``cycles``, ``sram_bytes``), the deployable ``artifact`` in the
    work directory, the relevant tail of the toolchain's output, and ``notes`` on what the
    adapter changed to get there (dynamic dimensions fixed to the data's)."""

    toolchain: str
    version: str
    placements: tuple[Placement, ...]
    cost: Mapping[str, float]
    artifact: Path | None
    log: str = ""
    notes: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    source: Path | None = None  # the model file the toolchain was given (static shapes)

    @property
    def fallback(self) -> tuple[Placement, ...]:
        """The placements on the CPU."""
        return tuple(p for p in self.placements if p.unit == CPU)

    def summary(self) -> dict[str, Any]:
        """Counts per unit and precision, and each CPU node with its reason (JSON-ready)."""
        counts: dict[str, int] = {}
        for p in self.placements:
            key = f"{p.unit}:{p.precision}"
            counts[key] = counts.get(key, 0) + 1
        return {"toolchain": self.toolchain, "version": self.version,
                "nodes": len(self.placements), "on_accelerator": len(self.placements)
                - len(self.fallback), "counts": counts,
                "fallback": [{"node": p.node, "reason": p.reason} for p in self.fallback],
                "notes": list(self.notes)}


class ToolchainCrash(TargetError):
    """The toolchain's own process died (``status``: its exit status, negative for a signal,
    e.g. -4 SIGILL, -11 SIGSEGV) instead of answering; ``tail`` holds its last output lines,
    which say where it stopped. A verified point records it as its ``target_failure``."""

    def __init__(self, message: str, *, status: int | None, tail: str = "") -> None:
        super().__init__(message + (f"; its last lines: {tail}" if tail else ""))
        self.status = status
        self.tail = tail


def log_tail(log: str, lines: int = 4, width: int = 600) -> str:
    """The last ``lines`` non-blank lines of ``log`` joined by " | " (at most ``width``
    characters, the end kept): what a crash record shows of the toolchain's output."""
    kept = [line.strip() for line in log.splitlines() if line.strip()][-lines:]
    text = " | ".join(kept)
    return text if len(text) <= width else "..." + text[-width:]


class Toolchain(Protocol):
    """A vendor toolchain behind one small interface (see the module docstring)."""

    name: str

    def missing(self) -> str | None:
        """None when usable, else one line: what to install and how."""
        ...

    def compile(self, model: onnx.ModelProto, workdir: Path, *,
                calibration: Sequence[Mapping[str, np.ndarray]],
                settings: Mapping[str, Any]) -> Compiled:
        """Compile ``model`` (our QDQ export) in ``workdir``; ``calibration``: input samples
        (shapes for static dimensions; data for toolchains that calibrate themselves)."""
        ...

    def run(self, compiled: Compiled, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The model's outputs on ``inputs`` as the target computes them."""
        ...
