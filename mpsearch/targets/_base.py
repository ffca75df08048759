"""The target-toolchain interface: one adapter per vendor compiler or emulator.

An adapter compiles our QDQ export with the vendor's own toolchain and reports, in the
toolchain's own words, where each node runs and in which precision (:class:`Placement`), the
toolchain's cost figures and the deployable artifact (:class:`Compiled`); ``run`` computes the
outputs as the target (emulator or simulator) computes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx

from mpsearch.errors import MpsearchError

__all__ = ["Compiled", "Placement", "TargetError", "Toolchain"]


class TargetError(MpsearchError):
    """A target toolchain is missing, refused the model or failed to compile or run it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    node: str          # node name in the model given to compile() (our QDQ export)
    unit: str          # "accelerator" or "cpu"
    precision: str     # as the toolchain reports it: "int8", "int16", "fp16", "fp32", ...
    reason: str = ""   # the toolchain's own words when the node is not on the accelerator


@dataclass(frozen=True, slots=True, kw_only=True)
class Compiled:
    toolchain: str     # "qnn" | "rknn" | "vela"
    version: str
    placements: tuple[Placement, ...]
    # the toolchain's own figures, e.g. {"cycles": ..., "sram_bytes": ...}
    cost: Mapping[str, float]
    artifact: Path | None       # the deployable file in workdir
    log: str = ""

    @property
    def fallback(self) -> tuple[Placement, ...]:
        return tuple(p for p in self.placements if p.unit == "cpu")


class Toolchain(Protocol):
    name: str

    # None when usable, else one line: what to install and how
    def missing(self) -> str | None: ...

    def compile(self, model: onnx.ModelProto, workdir: Path, *,
                calibration: Sequence[Mapping[str, np.ndarray]],
                settings: Mapping[str, Any]) -> Compiled: ...

    def run(self, compiled: Compiled, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]: ...
