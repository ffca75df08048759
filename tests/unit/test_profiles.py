"""Tests for hardware profiles: shipped-profile contract, malformed-profile table, queries."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from _paths import ROOT

from mpsearch.cli._profiles import add_profiles_parser
from mpsearch.errors import MpsearchError, ProfileError
from mpsearch.profiles import (
    Format,
    HardwareProfile,
    OpRule,
    TensorFormat,
    list_profiles,
    load_profile,
    validate_profile_file,
)

SHIPPED_DIR = ROOT / "hw_profiles"
REQUIRED_SHIPPED = ("x86_ort", "qnn_htp", "ethos_u55", "ethos_u85", "coral_edgetpu", "tensorrt",
                    "intel_npu", "ryzen_ai", "rk3588", "hailo8", "nxp_neutron")


@dataclass(frozen=True)
class Node:
    op_type: str
    quantizable: bool = True


# A small valid profile; the malformed table edits it line by line (line numbers matter).
BASE = """\
schema: 1
description: test profile
versions: "test 1.0"
sources: [https://example.com/doc]
formats:
  int8:
    activation: {dtype: uint8, symmetric: false, granularity: per_tensor}
    weight:
      dtype: int8
      symmetric: true
      granularity: per_channel
    bias: int32
    executes: accelerator
    relative_cost: 0.5
  fp32:
    activation: {dtype: float32}
    weight: {dtype: float32}
    bias: float32
    executes: accelerator
    relative_cost: 1.0
default_format: fp32
fallback: per_op
op_rules:
  Conv: {formats: [int8]}
  Add:
    formats: [int8]
transition_cost: 0.1
memory_budget_bytes: 1000000
"""


def _write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _edit(old: str, new: str) -> str:
    assert BASE.count(old) == 1, old
    return BASE.replace(old, new)


# -- shipped profiles (contract) -------------------------------------------------------------
def test_required_profiles_are_shipped() -> None:
    assert set(REQUIRED_SHIPPED) <= set(list_profiles())


@pytest.mark.parametrize("name", list_profiles())
def test_shipped_profile_loads_and_is_complete(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert profile.description and profile.versions and profile.sources
    assert all(s.startswith("http") for s in profile.sources)
    assert profile.formats[profile.default_format].is_float
    assert profile.formats[profile.cost_reference].relative_cost == 1.0
    assert profile.unknowns, "every shipped profile states what is not known"
    for op in (*profile.op_rules, "SomeUnlistedOp"):
        assert profile.formats_for(op), op
    # validate_profile_file answers the same for the file
    assert validate_profile_file(SHIPPED_DIR / f"{name}.yaml").to_dict() == profile.to_dict()


@pytest.mark.parametrize("name", list_profiles())
def test_shipped_profile_cites_sources_in_comments(name: str) -> None:
    text = (SHIPPED_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert any("http" in line for line in comments)
    for source in load_profile(name).sources:
        assert source.rstrip("/") in text


@pytest.mark.parametrize("name", list_profiles())
def test_to_dict_round_trips(name: str, tmp_path: Path) -> None:
    profile = load_profile(name)
    path = _write(tmp_path, yaml.safe_dump(profile.to_dict(), sort_keys=False), f"{name}.yaml")
    again = load_profile(path)
    assert again.to_dict() == profile.to_dict()
    assert again.formats == profile.formats and again.op_rules == profile.op_rules


def test_x86_profile_matches_measurements() -> None:
    p = load_profile("x86_ort")
    int8, int16, fp32 = p.format("int8"), p.format("int16"), p.format("fp32")
    assert int8.activation == TensorFormat(dtype="uint8", symmetric=False)
    assert int8.weight == TensorFormat(dtype="int8", symmetric=True, granularity="per_channel")
    assert (int8.bias, int8.executes, int8.relative_cost) == ("int32", "accelerator", 0.33)
    assert int16.activation.bits == 16 and int16.weight.bits == 8
    assert (int16.executes, int16.relative_cost) == ("emulated", 2.0)
    assert fp32.is_float and fp32.relative_cost == 1.0 and p.cost_reference == "fp32"
    a16w16, fp16w = p.format("a16w16"), p.format("fp16w")
    assert a16w16.activation.bits == a16w16.weight.bits == 16 and a16w16.executes == "emulated"
    assert fp16w.activation.dtype == "float32" and fp16w.weight.dtype == "float16"
    assert p.formats_for("Conv") == ("int8", "int16", "a16w16", "fp16w", "fp32")
    assert p.formats_for("Erf") == ("fp32",)
    assert p.fallback == "per_op" and p.memory_budget_bytes is None


def test_tensorrt_has_no_int16_and_htp_has_fp16_on_chip() -> None:
    trt = load_profile("tensorrt")
    assert all(f.activation.bits != 16 or f.is_float for f in trt.formats.values())
    htp = load_profile("qnn_htp")
    assert htp.format("fp16").executes == "accelerator"
    # the QNN EP puts float nodes on the HTP in fp16 (onnxruntime-qnn 2.7.0; a probe of
    # tests/integration/test_targets_qnn.py checks it against the emulator)
    assert htp.format("fp32").executes == "accelerator"


def test_ethos_u55_16x8_cost_and_u85_extends() -> None:
    # int16 costs: medians of Vela 5.2.0's whole-network int16/int8 cycle ratios (checked
    # against Vela in tests/integration/test_targets_vela.py)
    u55, u85 = load_profile("ethos_u55"), load_profile("ethos_u85")
    assert u55.relative_cost("Conv", "int16", 100.0) == pytest.approx(115.0)
    assert u55.relative_cost("Conv", "int8", 100.0) == 100.0
    assert u85.format("int16").relative_cost == 1.19  # overridden by the child
    assert u85.format("int16").activation == u55.format("int16").activation  # inherited
    assert "Gather" in u85.op_rules and "Gather" not in u55.op_rules
    assert u85.formats_for("HardSwish") == ("int8", "fp32")
    assert u85.formats_for("Gelu") == ("int8", "fp32")  # Vela's GELU is 8-bit only


def test_rk3588_float_is_fp16_on_the_npu() -> None:
    # RKNN-Toolkit2 2.5.0 builds every float layer FLOAT16 on the NPU, fp32 at fp16's cycles,
    # and crashes on INT8 attention Softmax (checked in tests/integration/test_targets_rknn.py)
    rk = load_profile("rk3588")
    assert rk.format("fp32").executes == "accelerator"
    assert rk.format("fp32").relative_cost == rk.format("fp16").relative_cost == 1.35
    assert rk.formats_for("Softmax") == rk.formats_for("Erf") == ("fp16", "fp32")
    assert rk.formats_for("Conv") == ("int8", "fp16", "fp32")
    assert not any(f.activation.dtype.endswith("16") and not f.is_float
                   for f in rk.formats.values())  # a 16-bit QDQ import is refused


def test_edge_tpu_fallback_and_budget() -> None:
    tpu = load_profile("coral_edgetpu")
    assert tpu.fallback == "after_first_unsupported"
    assert tpu.memory_budget_bytes == 8 * 1024 * 1024
    assert tpu.formats_for("Conv") == ("int8", "fp32")


# -- queries -----------------------------------------------------------------------------------
def test_formats_for_node() -> None:
    p = load_profile("x86_ort")
    assert p.formats_for_node(Node("Conv")) == ("int8", "int16", "a16w16", "fp16w", "fp32")
    assert p.formats_for_node(Node("Conv", quantizable=False)) == ("fp32",)
    assert p.formats_for_node(Node("NonMaxSuppression")) == ("fp32",)


def test_error_fallback_profile(tmp_path: Path) -> None:
    text = _edit("fallback: per_op\n", "fallback: error\nunlisted_ops: []\n")
    p = load_profile(_write(tmp_path, text))
    assert p.formats_for("Conv") == ("int8",)  # nothing added in an error profile
    assert p.formats_for("Erf") == ()
    with pytest.raises(ProfileError, match="op Erf has no allowed format and fallback is 'error'"):
        p.formats_for_node(Node("Erf"))
    with pytest.raises(ProfileError, match="non-quantizable op Conv has no allowed format"):
        p.formats_for_node(Node("Conv", quantizable=False))


def test_format_lookup_and_meaning() -> None:
    p = load_profile("x86_ort")
    with pytest.raises(ProfileError) as info:
        p.format("int4")
    assert str(info.value) == "profile x86_ort has no format 'int4'; did you mean 'int8'?"
    assert p.format("int8").activation.qmin == 0 and p.format("int8").activation.qmax == 255
    assert p.format("int8").weight.qmin == -128 and p.format("int8").weight.qmax == 127
    u55 = load_profile("ethos_u55")
    assert (u55.format("int8").weight.qmin, u55.format("int8").weight.qmax) == (-127, 127)
    assert (u55.format("int16").activation.qmin, u55.format("int16").activation.qmax) == (
        -32768, 32767)
    with pytest.raises(ProfileError, match="float32 has no integer range"):
        _ = p.format("fp32").weight.qmin


def test_rank_orders_precisions() -> None:
    p = load_profile("qnn_htp")
    ranks = [p.format(n).rank for n in ("int8", "int16", "fp16", "fp32")]
    assert ranks == sorted(ranks) and len(set(ranks)) == 4
    assert p.lowest_formats() == ("int8",)
    assert load_profile("ryzen_ai").lowest_formats() == ("int8", "xint8")


def test_relative_cost() -> None:
    p = load_profile("x86_ort")
    assert p.relative_cost("Conv", "int8", 1000.0) == pytest.approx(330.0)
    assert p.relative_cost("Conv", "fp32", 1000.0) == 1000.0
    assert p.relative_cost("Sub", "int8", 10.0) is None  # per-op override: unknown
    assert p.relative_cost("Sub", "int16", 10.0) == 20.0
    with pytest.raises(ProfileError, match="format 'int8' is not allowed for Erf; allowed: fp32"):
        p.relative_cost("Erf", "int8", 1.0)
    assert load_profile("qnn_htp").relative_cost("Conv", "int16", 5.0) is None


def test_weight_axis_and_weight_format() -> None:
    p = load_profile("x86_ort")
    assert p.weight_axis("Conv", {}) == 0
    assert p.weight_axis("ConvTranspose", {}) == 1
    assert p.weight_axis("Gemm", {"transB": 1}) == 0
    assert p.weight_axis("Gemm", {}) == 1
    assert p.weight_axis("MatMul", {}) == -1
    assert p.weight_axis("MatMul", {}, weight_rank=3) == 2
    assert load_profile("qnn_htp").weight_axis("ConvTranspose", {}) == 1
    u55 = load_profile("ethos_u55")
    assert u55.weight_format("Conv", "int8").granularity == "per_channel"
    # per-channel FULLY_CONNECTED runs on the NPU (Vela 5.2.0;
    # tests/integration/test_targets_vela.py)
    assert u55.weight_format("Gemm", "int8").granularity == "per_channel"
    assert load_profile("qnn_htp").weight_format("Gemm", "int8").granularity == "per_tensor"
    assert u55.weight_format("Gemm", "fp32").is_float


def test_fixed_qparams_and_rules() -> None:
    htp = load_profile("qnn_htp")
    assert htp.fixed_qparams("Sigmoid", "int16") == (1.0 / 65536, 0)  # uint16 activations
    assert htp.fixed_qparams("Tanh", "int16") == (1.0 / 32768, 32768)
    assert htp.fixed_qparams("Sigmoid", "int8") is None
    assert htp.fixed_qparams("Erf", "int16") is None
    rule = htp.op_rule("Add")
    assert isinstance(rule, OpRule) and rule.same_input_precision
    assert htp.op_rule("Loop") is None
    assert load_profile("intel_npu").op_rule("Concat").same_input_scale  # type: ignore[union-attr]


def test_exclude_and_format_named_fixed_qparams(tmp_path: Path) -> None:
    text = BASE.replace("  int8:\n", "  q8:\n").replace("[int8]", "[q8]")
    text = text.replace("  Conv: {formats: [q8]}\n", "  Conv: {exclude: [fp32]}\n  Sigmoid:\n"
                        "    formats: [q8]\n    fixed_qparams: {q8: [0.00390625, 0]}\n")
    p = load_profile(_write(tmp_path, text))
    assert p.formats_for("Conv") == ("q8", "fp32")  # fp32 excluded, but the fallback adds it
    assert p.op_rule("Conv").formats == ("q8",)  # type: ignore[union-attr]
    assert p.fixed_qparams("Sigmoid", "q8") == (0.00390625, 0)


def test_unknown_figures_are_listed(tmp_path: Path) -> None:
    text = _edit("    relative_cost: 0.5\n", "    relative_cost: unknown\n")
    text = text.replace("memory_budget_bytes: 1000000\n", "memory_budget_bytes: null\n"
                        "unknowns: [int8 rate on this board]\n")
    p = load_profile(_write(tmp_path, text))
    assert p.format("int8").relative_cost is None
    assert p.relative_cost("Conv", "int8", 10.0) is None
    assert p.memory_budget_bytes is None
    assert p.unknowns == ("int8 rate on this board", "formats.int8.relative_cost",
                          "memory_budget_bytes")


def test_profile_is_frozen() -> None:
    p = load_profile("x86_ort")
    with pytest.raises(AttributeError):
        p.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.formats["int8"] = p.formats["fp32"]  # type: ignore[index]


def test_python_constructed_profile_is_checked() -> None:
    fp32 = Format(name="fp32", activation=TensorFormat(dtype="float32"),
                  weight=TensorFormat(dtype="float32"), bias="float32",
                  executes="accelerator", relative_cost=1.0)
    kwargs = dict(name="mine", description="d", versions="v", sources=("https://x",),
                  formats={"fp32": fp32}, default_format="fp32", cost_reference="fp32",
                  op_rules={}, fallback="per_op", unlisted_ops=("fp32",), transition_cost=None,
                  memory_budget_bytes=None)
    assert HardwareProfile(**kwargs).formats_for("Conv") == ("fp32",)  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match="format 'int8' is not defined"):
        HardwareProfile(**{**kwargs, "unlisted_ops": ("int8",)})  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match="TensorFormat.dtype must be one of"):
        TensorFormat(dtype="int4")


# -- loading by name / path / extends -------------------------------------------------------------
def test_load_errors() -> None:
    with pytest.raises(ProfileError) as info:
        load_profile("x86")
    assert str(info.value) == "unknown hardware profile 'x86'; did you mean 'x86_ort'?"
    with pytest.raises(ProfileError, match=r"nope\.yaml: no such profile file"):
        load_profile("nope.yaml")
    assert issubclass(ProfileError, MpsearchError)


def test_name_defaults_to_file_stem(tmp_path: Path) -> None:
    assert load_profile(_write(tmp_path, BASE, "my_board.yaml")).name == "my_board"


def test_extends_local_file_deep_merges(tmp_path: Path) -> None:
    _write(tmp_path, BASE, "base.yaml")
    child = _write(tmp_path, "schema: 1\nextends: base\nformats:\n  int8:\n"
                   "    relative_cost: 0.25\nop_rules:\n  Relu: {formats: [int8]}\n", "child.yaml")
    p = load_profile(child)
    assert p.name == "child"
    assert p.format("int8").relative_cost == 0.25
    assert p.format("int8").weight.granularity == "per_channel"  # inherited
    assert set(p.op_rules) == {"Conv", "Add", "Relu"}
    assert p.memory_budget_bytes == 1000000


def test_extends_relative_path(tmp_path: Path) -> None:
    """A path inside the profile's folder (``..`` is refused)."""
    (tmp_path / "boards").mkdir()
    _write(tmp_path, BASE, "boards/base.yaml")
    child = _write(tmp_path, "schema: 1\nextends: boards/base.yaml\nfallback: error\n",
                   "strict.yaml")
    assert load_profile(child).fallback == "error"


def test_extends_shipped_profile(tmp_path: Path) -> None:
    child = _write(tmp_path, "schema: 1\nextends: qnn_htp\nfallback: error\n"
                   "unlisted_ops: []\n", "htp_no_cpu.yaml")
    p = load_profile(child)
    assert p.fallback == "error" and p.formats_for("Loop") == ()
    assert p.formats_for("Conv") == ("int8", "int16", "fp16")


def test_error_in_inherited_key_names_parent_file(tmp_path: Path) -> None:
    base = _write(tmp_path, _edit("    relative_cost: 0.5\n", "    relative_cost: -1\n"),
                  "base.yaml")
    child = _write(tmp_path, "schema: 1\nextends: base\n", "child.yaml")
    with pytest.raises(ProfileError) as info:
        load_profile(child)
    assert str(info.value) == (f"{base}:14: formats.int8.relative_cost must be greater than 0, "
                               "got -1")


def test_extends_cycle(tmp_path: Path) -> None:
    _write(tmp_path, "schema: 1\nextends: b\n", "a.yaml")
    _write(tmp_path, "schema: 1\nextends: a\n", "b.yaml")
    with pytest.raises(ProfileError) as info:
        load_profile(tmp_path / "a.yaml")
    assert str(info.value) == (f"{(tmp_path / 'b.yaml').resolve()}:2: extends cycle: a.yaml -> "
                               "b.yaml -> a.yaml; remove one of the extends keys")


# -- malformed profiles: one line each -----------------------------------------------------
ACT8 = "    activation: {dtype: uint8, symmetric: false, granularity: per_tensor}\n"
MALFORMED = [
    ("unknown_key", "      granularity: per_channel\n", "      granulariy: per_channel\n",
     "{f}:11: unknown key 'granulariy' in formats.int8.weight; did you mean 'granularity'?"),
    ("unknown_top_key", "fallback: per_op\n", "fallbak: per_op\n",
     "{f}:22: unknown key 'fallbak' at top level; did you mean 'fallback'?"),
    ("unknown_rule_key", "    formats: [int8]\n", "    formats: [int8]\n    same_input_scal: 1\n",
     "{f}:27: unknown key 'same_input_scal' in op_rules.Add; did you mean 'same_input_scale'?"),
    ("wrong_dtype", "      dtype: int8\n", "      dtype: int9\n",
     "{f}:9: formats.int8.weight.dtype must be one of int8, uint8, int16, uint16, float32, "
     "float16, got 'int9'"),
    ("wrong_type_bool", "      symmetric: true\n", "      symmetric: maybe\n",
     "{f}:10: formats.int8.weight.symmetric must be true or false, got 'maybe'"),
    ("wrong_type_cost", "    relative_cost: 0.5\n", "    relative_cost: cheap\n",
     "{f}:14: formats.int8.relative_cost must be a number, null or unknown, got 'cheap'"),
    ("wrong_type_budget", "memory_budget_bytes: 1000000\n", "memory_budget_bytes: 1.5e6\n",
     "{f}:28: memory_budget_bytes must be an integer, null or unknown, got 1500000.0"),
    ("wrong_type_sources", "sources: [https://example.com/doc]\n", "sources: https://x\n",
     "{f}:4: sources must be a list, got 'https://x'"),
    ("wrong_type_rule", "  Add:\n    formats: [int8]\n", "  Add: [int8]\n",
     "{f}:25: op_rules.Add must be a mapping, got a list"),
    ("undefined_format", "  Conv: {formats: [int8]}\n", "  Conv: {formats: [int8, int4]}\n",
     "{f}:24: op_rules.Conv.formats[1] names format 'int4', which formats does not define; "
     "defined: fp32, int8"),
    ("undefined_default", "default_format: fp32\n", "default_format: fp16\n",
     "{f}:21: default_format names format 'fp16', which formats does not define; "
     "defined: fp32, int8"),
    ("empty_op_list", "    formats: [int8]\n", "    formats: []\n",
     "{f}:26: op_rules.Add.formats is an empty list; list at least one entry"),
    ("forbids_every_format", "    formats: [int8]\n", "    exclude: [int8, fp32]\n",
     "{f}:26: op_rules.Add.exclude forbids every format (fp32, int8); keep at least one"),
    ("formats_and_exclude", "    formats: [int8]\n", "    formats: [int8]\n    exclude: [fp32]\n",
     "{f}:26: op_rules.Add needs exactly one of formats or exclude"),
    ("undefined_unlisted", "fallback: per_op\n", "fallback: per_op\nunlisted_ops: [fp64]\n",
     "{f}:23: unlisted_ops[0] names format 'fp64', which formats does not define; "
     "defined: fp32, int8"),
    ("negative_budget", "memory_budget_bytes: 1000000\n", "memory_budget_bytes: -1\n",
     "{f}:28: memory_budget_bytes must be >= 0, got -1"),
    ("negative_transition", "transition_cost: 0.1\n", "transition_cost: -0.1\n",
     "{f}:27: transition_cost must be >= 0.0, got -0.1"),
    ("zero_cost", "    relative_cost: 0.5\n", "    relative_cost: 0\n",
     "{f}:14: formats.int8.relative_cost must be greater than 0, got 0"),
    ("bad_fallback", "fallback: per_op\n", "fallback: cpu\n",
     "{f}:22: fallback must be one of per_op, after_first_unsupported, error, got 'cpu'"),
    ("default_not_float", "default_format: fp32\n", "default_format: int8\n",
     "{f}:21: default_format 'int8' is not a float format; name the float format kept for ops "
     "that are not quantized (e.g. fp32)"),
    ("reference_not_one", "    relative_cost: 1.0\n", "    relative_cost: 2.0\n",
     "{f}:21: cost_reference format 'fp32' has relative_cost 2.0; the reference format must "
     "cost 1.0"),
    ("schema_version", "schema: 1\n", "schema: 2\n",
     "{f}:1: schema 2 is not supported; this mpsearch reads schema 1"),
    ("missing_schema", "schema: 1\n", "",
     "{f}:1: missing key 'schema' at top level; add it"),
    ("missing_symmetric", "      symmetric: true\n", "",
     "{f}:9: missing key 'symmetric' in formats.int8.weight; add it"),
    ("float_with_quant_key", "    activation: {dtype: float32}\n",
     "    activation: {dtype: float32, symmetric: true}\n",
     "{f}:16: formats.fp32.activation.symmetric has no meaning for dtype float32; remove it"),
    ("narrow_unsigned", ACT8, ACT8.replace("}", ", narrow_range: true}"),
     "{f}:7: formats.int8.activation.narrow_range applies to signed dtypes only, got dtype uint8"),
    ("axis_per_tensor", ACT8, ACT8.replace("}", ", axis: 1}"),
     "{f}:7: formats.int8.activation.axis only applies with granularity per_channel"),
    ("float_bias_mismatch", "    bias: float32\n", "    bias: int32\n",
     "{f}:18: formats.fp32.bias must be float32 with float32 weights, got 'int32'"),
    ("bad_fixed_qparams", "    formats: [int8]\n",
     "    formats: [int8]\n    fixed_qparams: {uint8: [0.5]}\n",
     "{f}:27: op_rules.Add.fixed_qparams.uint8 must be [scale, zero_point] with scale > 0 and an "
     "integer zero_point, got [0.5]"),
    ("fixed_qparams_zero_point_range", "    formats: [int8]\n",
     "    formats: [int8]\n    fixed_qparams: {int8: [0.5, 300]}\n",
     "{f}:27: op_rules.Add.fixed_qparams.int8 zero_point 300 is outside the int8 range "
     "[-128, 127]"),
    ("fixed_qparams_unknown_key", "    formats: [int8]\n",
     "    formats: [int8]\n    fixed_qparams: {fp32: [0.5, 0]}\n",
     "{f}:27: op_rules.Add.fixed_qparams.fp32 must name a quantized format of this op (int8) or "
     "an integer dtype (int8, uint8, int16, uint16)"),
    ("cost_for_disallowed_format", "    formats: [int8]\n",
     "    formats: [int8]\n    cost: {fp32: 2.0}\n",
     "{f}:27: op_rules.Add.cost.fp32 names format 'fp32', which this op does not allow; "
     "allowed: int8"),
    ("duplicate_key", "memory_budget_bytes: 1000000\n",
     "memory_budget_bytes: 1000000\nfallback: error\n",
     "{f}:29: duplicate key 'fallback' (first written on line 22); keep one"),
    ("bad_extends", "schema: 1\n", "schema: 1\nextends: nope\n",
     "{f}:2: extends names 'nope', which is neither a file next to this one nor a shipped "
     "profile ({shipped})"),
    ("not_a_mapping", BASE, "- just\n- a list\n", "{f}:1: the file must be a mapping, got a list"),
]


@pytest.mark.parametrize(("old", "new", "expected"), [c[1:] for c in MALFORMED],
                         ids=[c[0] for c in MALFORMED])
def test_malformed_profile_message(tmp_path: Path, old: str, new: str, expected: str) -> None:
    path = _write(tmp_path, _edit(old, new))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert message == expected.format(f=path, shipped=", ".join(list_profiles()))
    assert "\n" not in message


def test_invalid_yaml_message(tmp_path: Path) -> None:
    path = _write(tmp_path, _edit("  Conv: {formats: [int8]}\n", "  Conv: {formats: [int8}\n"))
    with pytest.raises(ProfileError, match=rf"^{re.escape(str(path))}:24: invalid YAML: "):
        load_profile(path)


def test_base_profile_is_valid(tmp_path: Path) -> None:
    p = load_profile(_write(tmp_path, BASE))
    assert p.unknowns == ()
    assert p.formats_for("Add") == ("int8", "fp32")


# -- CLI -------------------------------------------------------------------------------------
def _run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_profiles_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return int(args.func(args))


def test_cli_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run_cli("profiles", "list") == 0
    out = capsys.readouterr().out
    assert all(name in out for name in REQUIRED_SHIPPED)
    assert _run_cli("profiles", "show", "x86_ort") == 0
    out = capsys.readouterr().out
    assert "int8     act uint8 asym per_tensor" in out and "Conv" in out
    assert _run_cli("profiles", "show", "qnn_htp", "--json") == 0
    assert '"default_format": "fp32"' in capsys.readouterr().out


def test_cli_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = SHIPPED_DIR / "x86_ort.yaml"
    bad = _write(tmp_path, _edit("memory_budget_bytes: 1000000\n", "memory_budget_bytes: -5\n"))
    assert _run_cli("profiles", "validate", str(good)) == 0
    assert capsys.readouterr().out == f"ok {good}\n"
    assert _run_cli("profiles", "validate", str(good), str(bad), str(good)) == 2
    captured = capsys.readouterr()
    assert captured.out == f"ok {good}\n"
    assert captured.err == f"mpsearch: error: {bad}:28: memory_budget_bytes must be >= 0, got -5\n"


@pytest.mark.parametrize("target", ["/etc/passwd.yaml", "../outside.yaml", "sub/../../x.yaml"])
def test_extends_cannot_leave_the_profile_folder(tmp_path: Path, target: str) -> None:
    folder = tmp_path / "uploads"
    folder.mkdir()
    (tmp_path / "outside.yaml").write_text("schema: 1\nsecret: 42\n")
    profile = folder / "mine.yaml"
    profile.write_text(f"schema: 1\nname: mine\nextends: {target}\n")
    with pytest.raises(ProfileError) as caught:
        load_profile(profile)
    assert str(caught.value) == (
        f"{profile}:3: extends '{target}' leaves the profile's folder; name a shipped profile "
        "or a file next to this one")


def test_extends_through_a_link_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "uploads"
    folder.mkdir()
    (tmp_path / "outside.yaml").write_text("schema: 1\nsecret: 42\n")
    (folder / "base.yaml").symlink_to(tmp_path / "outside.yaml")
    profile = folder / "mine.yaml"
    profile.write_text("schema: 1\nname: mine\nextends: base\n")
    with pytest.raises(ProfileError) as caught:
        load_profile(profile)
    assert str(caught.value) == (
        f"{profile}:3: extends 'base' resolves outside the profile's folder "
        f"({(tmp_path / 'outside.yaml').resolve()}); name a shipped profile or a file next to "
        "this one")


def test_extends_a_shipped_profile_or_a_sibling(tmp_path: Path) -> None:
    shipped = tmp_path / "derived.yaml"
    shipped.write_text("schema: 1\nname: derived\nextends: qnn_htp\n")
    assert load_profile(shipped).formats.keys() == load_profile("qnn_htp").formats.keys()
    sibling = tmp_path / "child.yaml"
    sibling.write_text("schema: 1\nname: child\nextends: derived.yaml\n")
    assert load_profile(sibling).name == "child"
