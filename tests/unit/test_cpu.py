"""The host CPU's int8 instructions and the x86 profile they call for (x86_ort_auto)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from mpsearch.profiles import load_profile, runs_fused_int8
from mpsearch.profiles._cpu import (
    AUTO_X86_PROFILE,
    Int8Isa,
    _flags_from_cpuinfo,
    check_profile_for_cpu,
    host_int8_isa,
    isa_from_flags,
    x86_profile_for,
)
from mpsearch.runtime import create_session

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


@pytest.mark.parametrize(("cpu", "profile", "fused"), [
    ("zen1", "qnn_htp", False),       # the HTP's integers are exact; AVX2's kernels are not
    ("zen1", "ethos_u55", False),
    ("zen1", "x86_ort_avx2", True),   # the host is the target
    ("zen1", "x86_ort", True),        # the host measured as it is, with a warning
    ("cascade_lake", "qnn_htp", True),
    ("skylake_sp", "rk3588", False),
])
def test_targets_run_on_exact_int8(cpu: str, profile: str, fused: bool) -> None:
    assert runs_fused_int8(load_profile(profile), _isa(cpu)) is fused
    assert runs_fused_int8(load_profile(profile), isa_from_flags(set(), x86=False))


def test_unfused_session_computes_the_exact_integers() -> None:
    """u8 x s8 products whose pairs overflow int16: the session that stands in for an exact
    target returns what int32 accumulation gives, on every CPU; the fused kernels do too
    exactly where the host has VNNI or AMX."""
    h = onnx.helper
    k = 64
    weights = np.tile(np.array([127, 127], np.int8), k // 2).reshape(k, 1)
    inits = [h.make_tensor("s", onnx.TensorProto.FLOAT, [], [1.0]),
             h.make_tensor("z", onnx.TensorProto.UINT8, [], [0]),
             h.make_tensor("w", onnx.TensorProto.INT8, [k, 1], weights.ravel().tolist()),
             h.make_tensor("ws", onnx.TensorProto.FLOAT, [], [1.0]),
             h.make_tensor("wz", onnx.TensorProto.INT8, [], [0]),
             h.make_tensor("ys", onnx.TensorProto.FLOAT, [], [10_000.0])]
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             h.make_node("MatMul", ["xd", "wd"], ["m"]),
             h.make_node("QuantizeLinear", ["m", "ys", "z"], ["yq"]),
             h.make_node("DequantizeLinear", ["yq", "ys", "z"], ["y"])]
    graph = h.make_graph(nodes, "saturate", [h.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, [1, k])], [h.make_tensor_value_info(
            "y", onnx.TensorProto.FLOAT, [1, 1])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    x = np.full((1, k), 255.0, np.float32)
    exact = np.round(255 * 127 * k / 10_000.0) * 10_000.0  # 207 codes; saturated pairs: 105
    unfused = create_session(model, fused_int8=False).run({"x": x})["y"]
    assert unfused.item() == exact
    fused = create_session(model).run({"x": x})["y"]
    assert bool(fused.item() == exact) is host_int8_isa().exact_int8  # AVX2: 105 codes
