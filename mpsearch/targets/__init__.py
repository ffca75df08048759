"""Target toolchains: compile a QDQ export with the vendor's compiler for placement, cost,
numerics and the deployable artifact (:class:`Toolchain`)."""

from mpsearch.targets._base import Compiled, Placement, TargetError, Toolchain
from mpsearch.targets._vela import VelaToolchain

__all__ = ["Compiled", "Placement", "TargetError", "Toolchain", "VelaToolchain"]
