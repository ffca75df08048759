"""A profile's declarations of what its target really does: ``runs_as`` (a format computed as
another), ``on_cpu`` and ``withheld`` op rules; and the builder scoring ``runs_as`` formats as
the target computes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

from mpsearch.assignment import make_assignment
from mpsearch.calibration import calibrate
from mpsearch.data import Dataset
from mpsearch.errors import ProfileError
from mpsearch.graph import load_model
from mpsearch.profiles import load_profile
from mpsearch.quantize import Quantizer
from mpsearch.runtime import create_session
from mpsearch.targets._probes import WITHHELD, ProbeResult, _claim, _expected, probe_model

BASE = """\
schema: 1
description: test profile
versions: "test 1.0"
sources: [https://example.com/doc]
formats:
  int8:
    activation: {dtype: int8, symmetric: false, granularity: per_tensor}
    weight: {dtype: int8, symmetric: true, granularity: per_channel}
    bias: int32
    executes: accelerator
    relative_cost: 1.0
  fp16:
    activation: {dtype: float16}
    weight: {dtype: float16}
    bias: float16
    executes: accelerator
    relative_cost: 1.5
  fp32:
    activation: {dtype: float32}
    weight: {dtype: float32}
    bias: float32
    executes: accelerator
    relative_cost: 1.5
    runs_as: fp16
default_format: fp32
cost_reference: int8
fallback: per_op
op_rules:
  Conv: {formats: [int8, fp16]}
  Softmax:
    formats: [fp16]
    withheld: {int8: crashes the toolkit inside attention}
  Erf: {formats: [fp32], on_cpu: no Erf on the accelerator}
transition_cost: unknown
memory_budget_bytes: unknown
"""


def test_declarations_load_and_round_trip(tmp_path: Path) -> None:
    p = load_profile(_write(tmp_path, BASE))
    assert p.format("fp32").runs_as == "fp16"
    assert p.computed_as("fp32") == "fp16" and p.computed_as("int8") == "int8"
    assert p.op_rules["Softmax"].withheld == {"int8": "crashes the toolkit inside attention"}
    assert p.op_rules["Erf"].on_cpu == "no Erf on the accelerator"
    assert p.format("fp32").to_dict()["runs_as"] == "fp16"
    assert "runs_as" not in p.format("int8").to_dict()
    assert p.op_rules["Erf"].to_dict() == {"formats": ["fp32"],
                                           "on_cpu": "no Erf on the accelerator"}
    # what profiles check expects of each probe
    assert _expected(p, "fp32") == "fp16" and _expected(p, "int8") == "int8"
    assert _claim(p, "Erf", "fp32") == "cpu"
    assert _claim(p, "Softmax", "int8") == WITHHELD
    assert _claim(p, "Conv", "fp32") == "accelerator"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("old", "new", "message"), [
    ("    runs_as: fp16\n", "    runs_as: fp8\n", r"runs_as names 'fp8'; name another format"),
    ("    runs_as: fp16\n", "    runs_as: fp32\n", r"runs_as names 'fp32'; name another format"),
    ("    runs_as: fp16\n", "    runs_as: int8\n", r"must both be float or both integer"),
    ("    relative_cost: 1.0\n", "    relative_cost: 1.0\n    runs_as: fp32\n",
     r"which runs as 'fp16' itself"),
    ("    withheld: {int8: crashes the toolkit inside attention}\n",
     "    withheld: {fp16: offered anyway}\n", r"withheld names a format that is not defined or "
     r"is offered"),
    ("    withheld: {int8: crashes the toolkit inside attention}\n",
     "    withheld: {int8: ''}\n", r"must be a non-empty string"),
    ("  Erf: {formats: [fp32], on_cpu: no Erf on the accelerator}\n",
     "  Erf: {formats: [fp32], on_cpu: [no]}\n", r"on_cpu must be a non-empty string"),
    ("    runs_as: fp16\n", "    run_as: fp16\n", r"run_as"),
])
def test_declarations_are_checked(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert BASE.count(old) == 1, old
    with pytest.raises(ProfileError, match=message):
        load_profile(_write(tmp_path, BASE.replace(old, new)))


def test_withheld_probe_agrees_whatever_the_toolchain_does() -> None:
    ran = ProbeResult(op_type="Softmax", format="int8", claimed=WITHHELD, unit="accelerator",
                      precision="int8", expected="int8", error=0.0)
    assert ran.agrees
    offered_not_run = ProbeResult(op_type="Softmax", format="fp16", claimed="accelerator",
                                  unit="cpu", precision="fp16", expected="fp16", error=0.0)
    assert not offered_not_run.agrees


def test_runs_as_format_is_built_and_scored_as_the_target_computes_it(tmp_path: Path) -> None:
    """A Conv assigned fp32 on a profile whose fp32 runs as fp16 is built with fp16's Cast
    round trips and float16 weights, and computes exactly what the fp16 assignment does."""
    p = load_profile(_write(tmp_path, BASE))
    plain = load_profile(_write(tmp_path, BASE.replace("    runs_as: fp16\n", "")))
    graph = load_model(probe_model("Conv"))
    x = np.random.default_rng(0).standard_normal((4, 4, 8, 8)).astype(np.float32) * 30
    table = calibrate(graph, Dataset(inputs={"x": x}))

    def run(profile: object, fmt: str) -> tuple[np.ndarray, list[str]]:
        q = Quantizer(graph, table, profile)  # type: ignore[arg-type]
        model = q.build(make_assignment(graph, profile, {"probe": fmt}))  # type: ignore[arg-type]
        out = create_session(model).run({"x": x})[model.graph.output[0].name]
        casts = [n.name for n in model.graph.node if n.op_type == "Cast"
                 and any(a.i == TensorProto.FLOAT16 for a in n.attribute)]
        return out, casts

    as_fp32, casts32 = run(p, "fp32")
    as_fp16, _ = run(p, "fp16")
    declared, plain_casts = run(plain, "fp32")
    assert casts32 and not plain_casts
    np.testing.assert_array_equal(as_fp32, as_fp16)
    assert float(np.abs(as_fp32 - declared).max()) > 0.0  # fp16 rounding shows
    assert float(np.abs(as_fp32 - declared).max()) < 1e-2 * float(np.abs(declared).max())
