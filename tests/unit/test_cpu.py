"""The host CPU's int8 instructions and the x86 profile they call for (x86_ort_auto)."""

from __future__ import annotations

import pytest

from mpsearch.profiles import load_profile
from mpsearch.profiles._cpu import (
    AUTO_X86_PROFILE,
    Int8Isa,
    _flags_from_cpuinfo,
    check_profile_for_cpu,
    host_int8_isa,
    isa_from_flags,
    x86_profile_for,
)

CPUINFO = {  # the flags line of real /proc/cpuinfo files, shortened to what matters here
    "zen1": "fpu sse2 avx avx2 fma bmi2",
    "cascade_lake": "fpu sse2 avx avx2 avx512f avx512bw avx512vl avx512_vnni",
    "alder_lake": "fpu sse2 avx avx2 avx_vnni",
    "sapphire_rapids": "avx2 avx512f avx512_vnni amx_bf16 amx_tile amx_int8",
    "skylake_sp": "avx2 avx512f avx512bw avx512vl",
}


def _isa(cpu: str) -> Int8Isa:
    return isa_from_flags(_flags_from_cpuinfo(f"processor : 0\nflags\t\t: {CPUINFO[cpu]}\n"))


@pytest.mark.parametrize(("cpu", "profile", "describe"), [
    ("zen1", "x86_ort_avx2", "x86 AVX2, no VNNI"),
    ("skylake_sp", "x86_ort_avx2", "x86 AVX2, AVX-512, no VNNI"),
    ("cascade_lake", "x86_ort", "x86 AVX2, AVX-512, VNNI"),
    ("alder_lake", "x86_ort", "x86 AVX2, VNNI"),
    ("sapphire_rapids", "x86_ort", "x86 AVX2, AVX-512, VNNI, AMX-INT8"),
])
def test_profile_follows_the_int8_instructions(cpu: str, profile: str, describe: str) -> None:
    isa = _isa(cpu)
    assert x86_profile_for(isa) == profile
    assert isa.describe() == describe
    assert check_profile_for_cpu(profile, isa) is None


def test_mismatch_warns_with_the_fix() -> None:
    warning = check_profile_for_cpu("x86_ort", _isa("zen1"))
    assert warning is not None and "use profile x86_ort_avx2" in warning
    assert "x86 AVX2, no VNNI" in warning
    warning = check_profile_for_cpu("x86_ort_avx2", _isa("cascade_lake"))
    assert warning is not None and "use x86_ort" in warning


def test_other_targets_and_hosts_are_not_checked() -> None:
    assert check_profile_for_cpu("qnn_htp", _isa("zen1")) is None
    arm = isa_from_flags(set(), x86=False)
    assert check_profile_for_cpu("x86_ort", arm) is None
    assert x86_profile_for(arm) == "x86_ort"


def test_auto_profile_resolves_for_this_host() -> None:
    assert load_profile(AUTO_X86_PROFILE).name == x86_profile_for(host_int8_isa())
