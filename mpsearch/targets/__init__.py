"""Target toolchains in the loop: the vendor's compiler or emulator checks what we export.

``toolchain(name)`` returns the adapter for ``name`` from the explicit :data:`TOOLCHAINS`
table (each entry imports its module only when asked for, so a missing vendor package costs
nothing until it is used). Every adapter implements :class:`Toolchain`.
"""

from __future__ import annotations

import importlib

from mpsearch.errors import TargetError
from mpsearch.targets._base import ACCELERATOR, CPU, Compiled, Placement, Toolchain

__all__ = ["ACCELERATOR", "CPU", "TOOLCHAINS", "Compiled", "Placement", "RknnToolchain",
           "TargetError", "Toolchain", "VelaToolchain", "toolchain"]

#: Toolchain name -> "module:class" of its adapter (imported on first use).
TOOLCHAINS: dict[str, str] = {
    "qnn": "mpsearch.targets._qnn:QnnToolchain",
    "rknn": "mpsearch.targets._rknn:RknnToolchain",
    "vela": "mpsearch.targets._vela:VelaToolchain",
}


def toolchain(name: str) -> Toolchain:
    """A new adapter for toolchain ``name`` (:class:`TargetError` listing the known ones)."""
    if name not in TOOLCHAINS:
        raise TargetError(f"unknown toolchain {name!r}; known: {', '.join(sorted(TOOLCHAINS))}")
    module, cls = TOOLCHAINS[name].split(":")
    adapter: Toolchain = getattr(importlib.import_module(module), cls)()
    return adapter


def __getattr__(name: str) -> object:
    """``VelaToolchain`` / ``RknnToolchain`` on first use, so importing the package loads no
    vendor module."""
    if name == "VelaToolchain":
        from mpsearch.targets._vela import VelaToolchain

        return VelaToolchain
    if name == "RknnToolchain":
        from mpsearch.targets._rknn import RknnToolchain

        return RknnToolchain
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
