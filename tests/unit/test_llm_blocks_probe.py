"""The host's x86 profile states exactly the MatMulNBits variants ONNX Runtime's CPU kernels run,
and where they quantize the activations, as the kernel probe finds them on this machine."""

from __future__ import annotations

from mpsearch.llm._formats import BlockFormat
from mpsearch.llm._probe import probe_embeddings, probe_kernel, probe_kernels, tolerance
from mpsearch.profiles import host_int8_isa, load_profile, x86_profile_for


def test_host_profile_claims_equal_the_probe() -> None:
    isa = host_int8_isa()
    assert isa.x86, "the x86 ORT profiles describe x86 hosts"
    spec = load_profile(x86_profile_for(isa)).weight_only
    assert spec is not None and spec.op == "MatMulNBits"
    results = probe_kernels()
    assert len(results) == 81
    table = {(r.fmt, r.accuracy_level): r for r in results}
    runs = {key for key, r in table.items() if r.runs}
    assert runs == spec.runs(), sorted(runs ^ spec.runs())
    int8 = {key for key, r in table.items() if r.int8_activations}
    assert int8 == spec.int8_activations(), sorted(int8 ^ spec.int8_activations())
    for key, r in table.items():
        if r.runs and key not in int8:  # float accumulation: agrees to float32 rounding
            assert r.error is not None and r.error < tolerance(0), (key, r.error)
        elif key in int8:  # int8 activations: close, but measurably not float
            assert r.error is not None and 1e-3 < r.error < tolerance(4), (key, r.error)


def test_8_bit_float_zero_points_are_refused_not_wrong() -> None:
    result = probe_kernel(BlockFormat(bits=8, block=32, zero="float"), 0)
    assert not result.loaded and result.error is None
    assert "has_unquantized_zero_point" in result.message


def test_host_profile_embedding_claims_equal_the_probe() -> None:
    spec = load_profile(x86_profile_for(host_int8_isa())).weight_only
    assert spec is not None and spec.embedding is not None
    assert spec.embedding.op == "GatherBlockQuantized"
    results = probe_embeddings()
    assert len(results) == 27
    runs = {r.fmt for r in results if r.runs}
    assert runs == set(spec.embedding.formats()), sorted(runs ^ set(spec.embedding.formats()))
    for r in results:  # a refusal is ORT's load error, never a wrong result
        assert r.runs or (not r.loaded and "GatherBlockQuantized" in r.message), r
