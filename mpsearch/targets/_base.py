"""The target interface: one adapter per vendor toolchain, behind one small protocol.

An adapter compiles our QDQ ONNX export with the vendor's toolchain and returns what the
toolchain says: where each node runs and in which precision (:class:`Placement`), the
toolchain's own cost figures and the deployable artifact (:class:`Compiled`); ``run`` computes
outputs as the target would.
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
    """A target toolchain is missing, refuses the model, or its output cannot be read."""


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
    cost: Mapping[str, float]   # the toolchain's own figures, e.g. {"cycles": ..., "sram_bytes": ...}  # noqa: E501
    artifact: Path | None       # the deployable file in workdir
    log: str = ""

    @property
    def fallback(self) -> tuple[Placement, ...]:
        return tuple(p for p in self.placements if p.unit == "cpu")


class Toolchain(Protocol):
    name: str

    def missing(self) -> str | None: ...   # None when usable, else one line: what to install and how  # noqa: E501

    def compile(self, model: onnx.ModelProto, workdir: Path, *,
                calibration: Sequence[Mapping[str, np.ndarray]],
                settings: Mapping[str, Any]) -> Compiled: ...

    def run(self, compiled: Compiled, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]: ...
