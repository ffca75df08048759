"""Target toolchains in the loop: vendor compilers and simulators behind one interface.

Each adapter (:class:`RknnToolchain` for Rockchip's RKNN-Toolkit2) compiles our QDQ export with
the vendor's own toolchain and reports placement, cost, the deployable artifact and the
target's own numerics.
"""

from __future__ import annotations

from mpsearch.targets._base import Compiled, Placement, TargetError, Toolchain
from mpsearch.targets._rknn import RknnToolchain

__all__ = ["Compiled", "Placement", "RknnToolchain", "TargetError", "Toolchain"]
