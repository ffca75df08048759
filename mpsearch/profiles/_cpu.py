"""The host CPU's integer dot-product instructions, read once, and the x86 profile they call for.

ONNX Runtime's fused INT8 kernels on x86 compute exactly (int32 accumulation) where the CPU has
VNNI (AVX-512 VNNI, AVX-VNNI) or AMX, and through AVX2's VPMADDUBSW otherwise, which adds pairs
of u8 x s8 products into a saturating int16. Full-range int8 weights are therefore exact on the
first kind of CPU and wrong on the second; the shipped ``x86_ort`` profile is for the first,
``x86_ort_avx2`` (7-bit weights) for the second. Consumes ``/proc/cpuinfo`` (Linux) or NumPy's
runtime CPU dispatch table (elsewhere); produces a frozen :class:`Int8Isa`.
"""

from __future__ import annotations

import functools
import importlib
import logging
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpsearch.profiles._types import HardwareProfile

__all__ = ["AUTO_X86_PROFILE", "Int8Isa", "check_profile_for_cpu", "host_int8_isa",
           "measures_latency", "runs_fused_int8", "x86_profile_for"]

logger = logging.getLogger(__name__)

AUTO_X86_PROFILE = "x86_ort_auto"
"""The profile name that resolves to ``x86_ort`` or ``x86_ort_avx2`` by the host CPU."""

_X86_PROFILES = ("x86_ort", "x86_ort_avx2")


@dataclass(frozen=True, slots=True, kw_only=True)
class Int8Isa:
    """Which int8 dot-product instructions a CPU has (all False off x86)."""

    x86: bool
    avx2: bool
    avx512: bool
    vnni: bool
    amx: bool

    @property
    def exact_int8(self) -> bool:
        """True where ORT's U8S8 kernels accumulate without int16 saturation."""
        return self.vnni or self.amx

    def describe(self) -> str:
        """One line for logs and CI: 'x86 AVX2, no VNNI' or 'x86 AVX2, AVX-512, VNNI'."""
        if not self.x86:
            return f"{platform.machine() or 'unknown'} (not x86)"
        names = [n for n, on in (("AVX2", self.avx2), ("AVX-512", self.avx512),
                                 ("VNNI", self.vnni), ("AMX-INT8", self.amx)) if on]
        if not self.exact_int8:
            names.append("no VNNI")
        return "x86 " + ", ".join(names)


def _flags_from_cpuinfo(text: str) -> set[str]:
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def _flags_from_numpy() -> set[str]:
    """NumPy's dispatch table, mapped to cpuinfo's flag names (it has no AVX-VNNI entry)."""
    features: dict[str, bool] = {}
    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # 2.x, 1.x
        try:
            features = getattr(importlib.import_module(module), "__cpu_features__", {})
            break
        except ImportError:
            continue
    names = {"AVX2": "avx2", "AVX512F": "avx512f", "AVX512VNNI": "avx512_vnni",
             "AVXVNNI": "avx_vnni"}
    return {flag for key, flag in names.items() if features.get(key)}


def isa_from_flags(flags: set[str], *, x86: bool = True) -> Int8Isa:
    """The :class:`Int8Isa` a set of ``/proc/cpuinfo`` flag names describes."""
    return Int8Isa(
        x86=x86,
        avx2="avx2" in flags,
        avx512="avx512f" in flags,
        vnni=bool({"avx512_vnni", "avx_vnni", "avx512vnni", "avxvnni"} & flags),
        amx="amx_int8" in flags,
    )


@functools.cache
def host_int8_isa() -> Int8Isa:
    """The host CPU's int8 instructions (read once per process)."""
    machine = platform.machine().lower()
    x86 = machine in ("x86_64", "amd64", "i386", "i686", "x86")
    if not x86:
        return isa_from_flags(set(), x86=False)
    cpuinfo = Path("/proc/cpuinfo")
    try:
        flags = _flags_from_cpuinfo(cpuinfo.read_text(errors="replace"))
    except OSError:
        flags = set()
    return isa_from_flags(flags or _flags_from_numpy())


def x86_profile_for(isa: Int8Isa) -> str:
    """The shipped x86 profile whose int8 weights are exact on a CPU with ``isa``."""
    return "x86_ort" if isa.exact_int8 or not isa.x86 else "x86_ort_avx2"


def check_profile_for_cpu(profile_name: str, isa: Int8Isa | None = None) -> str | None:
    """A warning when an x86 ORT profile does not match the host's integer kernels, else None.

    Only the two shipped x86 profiles are checked: other targets do not run on the host.
    """
    isa = isa or host_int8_isa()
    if profile_name not in _X86_PROFILES or not isa.x86:
        return None
    wanted = x86_profile_for(isa)
    if profile_name == wanted:
        return None
    if wanted == "x86_ort_avx2":
        return (f"profile x86_ort assumes VNNI, but this CPU is {isa.describe()}: ONNX Runtime's "
                "int8 kernels saturate here and measured INT8 accuracy will be lower than on the "
                f"target; use profile x86_ort_avx2 (or {AUTO_X86_PROFILE}) to search for this "
                "machine")
    return (f"profile x86_ort_avx2 gives up one bit of every int8 weight for AVX2-only CPUs, but "
            f"this CPU is {isa.describe()}; use x86_ort (or {AUTO_X86_PROFILE}) to search for "
            "this machine")


def measures_latency(profile: HardwareProfile, isa: Int8Isa | None = None) -> bool:
    """True when this host runs ``profile``'s target runtime itself (``runtime:
    onnxruntime-cpu`` on an x86 CPU), so latency is timed instead of estimated."""
    return profile.runtime == "onnxruntime-cpu" and (isa or host_int8_isa()).x86


def runs_fused_int8(profile: HardwareProfile, isa: Int8Isa | None = None) -> bool:
    """True when ONNX Runtime's fused int8 kernels on this host compute what ``profile``'s
    target computes, so candidates may run them; False on a CPU whose kernels saturate when the
    target is another device (an NPU, a DSP): its integer arithmetic is exact, so the host
    must run the QDQ model as written to stand in for it. A target that is this CPU's own
    ONNX Runtime keeps the host's kernels, saturation included (:func:`check_profile_for_cpu`
    warns when the profile does not suit them)."""
    isa = isa or host_int8_isa()
    return isa.exact_int8 or not isa.x86 or measures_latency(profile, isa)
