"""RKNN-Toolkit2 adapter, against the real toolkit and its x86 simulator (rk3588).

Our QDQ exports of the ShuffleNet and other fixtures are compiled in the toolkit's own pinned
environment (``python -m mpsearch.targets.rknn_env``); placements are read from the toolkit's
layer table and checked against its raw log lines, and the simulator's outputs are compared
with ONNX Runtime's on the same QDQ file. The environment missing is a skip whose reason says
"is not installed", which CI's skip check turns into a failure.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _paths import FIXTURES

from mpsearch import make_assignment, uniform_assignment
from mpsearch.pipeline import Prepared, prepare_inputs
from mpsearch.profiles import load_profile, runs_fused_int8
from mpsearch.runtime import create_session
from mpsearch.targets import Compiled, RknnToolchain, TargetError
from mpsearch.targets._rknn_table import parse_layers, plain_float

pytestmark = pytest.mark.slow  # whole searches, servers, browsers, toolchains

# "The demo" of these tests: the ShuffleNet fixture the bundled demo was built from until it
# became a residual CNN. They read each Conv's own row of the toolkit's layer table, which the
# toolkit merges into one row where a Conv feeds a residual Add.
DEMO_MODEL, DEMO_DATA = FIXTURES / "shufflenet.onnx", FIXTURES / "digits_eval.npz"

TOOLCHAIN = RknnToolchain()
MISSING = TOOLCHAIN.missing()
needs_rknn = pytest.mark.skipif(
    MISSING is not None, reason=f"RKNN-Toolkit2 environment is not installed: {MISSING}")
SAMPLES = 200  # validation samples simulated per model


def _prepared(model: Path, data: Path) -> Prepared:
    return prepare_inputs(model, "rk3588", data, calibration_samples=128)


def _qdq(prepared: Prepared, formats: dict[str, str] | None = None) -> onnx.ModelProto:
    chosen = dict(uniform_assignment(prepared.graph, prepared.profile, "int8"))
    chosen.update(formats or {})
    return prepared.quantizer.build(make_assignment(prepared.graph, prepared.profile, chosen))


def _inputs(prepared: Prepared) -> dict[str, np.ndarray]:
    return {name: np.asarray(value[:SAMPLES]) for name, value in
            prepared.validation.inputs.items()}


def _compile(prepared: Prepared, model: onnx.ModelProto, workdir: Path) -> Compiled:
    first = {k: v[:1] for k, v in _inputs(prepared).items()}
    return TOOLCHAIN.compile(model, workdir, calibration=[first], settings={})


def _agreement(model: onnx.ModelProto, compiled: Compiled,
               inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """Simulator vs ONNX Runtime on the same QDQ model: top-1 agreement and logits error."""
    sim = TOOLCHAIN.run(compiled, inputs)[0]
    # ONNX Runtime as a search runs it for the NPU: Q/DQ as written where the host's fused int8
    # kernels saturate (mpsearch.profiles.runs_fused_int8)
    fused = runs_fused_int8(load_profile("rk3588"))
    ref = create_session(model, fused_int8=fused).run(inputs)[model.graph.output[0].name]
    assert sim.shape == ref.shape
    return {"top1": float((sim.argmax(1) == ref.argmax(1)).mean()),
            "max_abs": float(np.abs(sim - ref).max()), "sim": sim, "ref": ref}


def _row(log: str, node: str) -> str:
    """The raw layer-table line of the toolkit's log whose FullName is ``node``."""
    lines = [ln for ln in log.splitlines() if re.search(rf":{re.escape(node)}(#\d+\S*)?\s*$", ln)]
    assert lines, f"no layer-table row for {node}"
    return lines[-1]


def _compute_nodes(model: onnx.ModelProto) -> set[str]:
    return {n.name for n in plain_float(model).graph.node
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear", "Cast", "Identity")}


@pytest.fixture(scope="module")
def demo() -> Prepared:
    return _prepared(DEMO_MODEL, DEMO_DATA)


@pytest.fixture(scope="module")
def demo_int8(demo: Prepared, tmp_path_factory: pytest.TempPathFactory) -> tuple[
        onnx.ModelProto, Compiled]:
    if MISSING is not None:
        pytest.skip(f"RKNN-Toolkit2 environment is not installed: {MISSING}")
    model = _qdq(demo)
    return model, _compile(demo, model, tmp_path_factory.mktemp("rknn_demo"))


def test_missing_environment_is_one_line_naming_the_command(demo: Prepared,
                                                             tmp_path: Path) -> None:
    absent = RknnToolchain(venv=tmp_path / "no-venv")
    message = absent.missing()
    assert message is not None and "\n" not in message
    assert "python -m mpsearch.targets.rknn_env" in message
    with pytest.raises(TargetError, match=r"python -m mpsearch\.targets\.rknn_env"):
        absent.compile(_qdq(demo), tmp_path / "w", calibration=[_inputs(demo)], settings={})


def test_unknown_setting_is_refused(demo: Prepared, tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="target_platfrom"):
        TOOLCHAIN.compile(_qdq(demo), tmp_path, calibration=[_inputs(demo)],
                          settings={"target_platfrom": "rk3588"})


def test_plain_float_drops_the_float16_emulation_only(demo: Prepared) -> None:
    model = _qdq(demo, {n: "fp16" for n, node in demo.graph.nodes.items()
                        if "fp16" in demo.profile.formats_for_node(node)})
    plain = plain_float(model)
    assert not [n for n in plain.graph.node if n.op_type == "Cast"]
    assert not [i for i in plain.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16]
    x = _inputs(demo)
    a = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
    b = ort.InferenceSession(plain.SerializeToString()).run(None, x)[0]
    # only the float16 rounding of activations goes: two float16 ulps (10-bit mantissa) at
    # the scale of the largest output
    np.testing.assert_allclose(b, a, rtol=0, atol=2 * 2.0**-10 * float(np.abs(a).max()))


@needs_rknn
def test_demo_int8_placements_come_from_the_toolkit(
        demo_int8: tuple[onnx.ModelProto, Compiled]) -> None:
    model, compiled = demo_int8
    assert compiled.toolchain == "rknn" and compiled.version == "2.5.0"
    assert compiled.artifact is not None and compiled.artifact.read_bytes()[:4] == b"RKNN"
    placed = {p.node: p for p in compiled.placements}
    assert set(placed) == _compute_nodes(model)
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    for name in convs:  # each Conv's own row in the toolkit's raw log
        row = _row(compiled.log, name)
        assert (" INT8 " in row) == (placed[name].precision == "int8")
        assert (" NPU " in row) == (placed[name].unit == "accelerator")
    layers = parse_layers(compiled.log)
    assert compiled.cost["cycles"] == compiled.cost["cycles_toolchain"] == sum(
        la.cycles for la in layers) > 0  # nothing on the CPU: no estimate added
    assert compiled.fallback == () and compiled.cost["cpu_flops"] == 0
    assert compiled.cost["cpu_layers"] == sum(
        la.target == "CPU" and la.op not in ("InputOperator", "OutputOperator") for la in layers)


@needs_rknn
def test_demo_int8_simulator_matches_onnxruntime(
        demo: Prepared, demo_int8: tuple[onnx.ModelProto, Compiled]) -> None:
    model, compiled = demo_int8
    got = _agreement(model, compiled, _inputs(demo))
    labels = demo.validation.labels
    assert labels is not None
    if labels is not None:
        sim_acc = float((got["sim"].argmax(1) == labels[:SAMPLES]).mean())
        ort_acc = float((got["ref"].argmax(1) == labels[:SAMPLES]).mean())
        assert abs(sim_acc - ort_acc) <= 0.02, (sim_acc, ort_acc)


@needs_rknn
def test_run_refuses_inputs_of_another_shape(
        demo_int8: tuple[onnx.ModelProto, Compiled]) -> None:
    with pytest.raises(TargetError, match="compiled for"):
        TOOLCHAIN.run(demo_int8[1], {"input": np.zeros((2, 1, 8, 8), np.float32)})


@needs_rknn
def test_demo_mixed_fp16_layers_run_in_fp16(demo: Prepared, tmp_path: Path) -> None:
    fp16 = {n for n in demo.graph.nodes if n.startswith("/features/features.3/")
            and demo.graph.nodes[n].op_type == "Conv"}
    model = _qdq(demo, dict.fromkeys(fp16, "fp16"))
    compiled = _compile(demo, model, tmp_path)
    placed = {p.node: p for p in compiled.placements}
    for name in (n.name for n in model.graph.node if n.op_type == "Conv"):
        row = _row(compiled.log, name)
        want = "FLOAT16" if name in fp16 else "INT8"
        assert f" {want} " in row and placed[name].precision == (
            "fp16" if name in fp16 else "int8"), row
    got = _agreement(model, compiled, _inputs(demo))
    assert got["top1"] >= 0.97, got["top1"]


@needs_rknn
def test_profile_float_formats_against_the_toolkit(demo: Prepared, tmp_path: Path) -> None:
    """rk3588.yaml's float claims against the toolkit's layer table and cycle estimates: fp32
    and fp16 both build every layer FLOAT16 on the NPU at the same cycles (fp32 executes on
    the accelerator in fp16), and fp16's relative_cost is within 5 % of the demo's fp16 /
    int8 cycle ratio."""
    cycles = {}
    for fmt in ("int8", "fp16", "fp32"):
        chosen = dict(uniform_assignment(demo.graph, demo.profile, fmt))
        model = demo.quantizer.build(make_assignment(demo.graph, demo.profile, chosen))
        compiled = _compile(demo, model, tmp_path / fmt)
        assert not compiled.fallback
        cycles[fmt] = compiled.cost["cycles"]
        if fmt == "int8":
            continue
        assert {(p.unit, p.precision) for p in compiled.placements} == {("accelerator", "fp16")}
        for name in (n.name for n in model.graph.node if n.op_type == "Conv"):
            assert " FLOAT16 " in _row(compiled.log, name)
    assert demo.profile.format("fp32").executes == "accelerator"
    assert cycles["fp32"] == cycles["fp16"]
    assert demo.profile.format("fp32").relative_cost == demo.profile.format("fp16").relative_cost
    claim = demo.profile.format("fp16").relative_cost
    ratio = cycles["fp16"] / cycles["int8"]
    assert claim is not None and abs(ratio - claim) <= 0.05 * ratio, (ratio, claim)


@needs_rknn
def test_fixture_mobilenetv2_int8_simulates_as_onnxruntime(tmp_path: Path) -> None:
    prepared = _prepared(FIXTURES / "mobilenetv2.onnx", FIXTURES / "digits_eval.npz")
    model = _qdq(prepared)
    compiled = _compile(prepared, model, tmp_path)
    assert not compiled.fallback
    got = _agreement(model, compiled, _inputs(prepared))
    assert got["top1"] >= 0.99, got["top1"]


@needs_rknn
def test_opset_21_is_lowered_for_the_toolkit(demo: Prepared, tmp_path: Path) -> None:
    model = onnx.version_converter.convert_version(_qdq(demo), 21)
    compiled = _compile(demo, model, tmp_path)
    saved = onnx.load(str(tmp_path / "model.onnx"))
    assert max(o.version for o in saved.opset_import if o.domain in ("", "ai.onnx")) == 19
    assert {p.node for p in compiled.placements} == _compute_nodes(model)


@needs_rknn
def test_transformer_erf_falls_back_to_the_cpu(tmp_path: Path) -> None:
    """Erf has no NPU kernel: the toolkit places it on the CPU with 0/0/0 cycles in its table,
    so the cost adds its work on the host core (4 FLOPs per element, the summary's count, on
    the toolkit's own output shape) to the table's sum, which stays as cycles_toolchain."""
    from mpsearch.targets._cpu_cost import HOST_FLOPS_PER_CYCLE

    prepared = _prepared(FIXTURES / "transformer.onnx", FIXTURES / "digits_eval.npz")
    graph = prepared.graph
    formats = {n: "fp16" for n, node in graph.nodes.items()
               if node.op_type not in ("Conv", "MatMul", "Gemm")
               and "fp16" in prepared.profile.formats_for_node(node)}
    model = _qdq(prepared, formats)
    compiled = _compile(prepared, model, tmp_path)
    erf = [n.name for n in model.graph.node if n.op_type == "Erf"]
    fallback = {p.node: p for p in compiled.fallback}
    elements = 0
    for name in erf:
        assert " CPU " in _row(compiled.log, name) and name in fallback
        assert "CPU" in fallback[name].reason
        cells = _row(compiled.log, name).split()
        assert "0/0/0" in cells  # the toolkit's table: no cycles for a CPU layer
        shape = cells[cells.index("0/0/0") - 1]  # its output shape, e.g. (1,16,1,96)
        elements += int(np.prod([int(d) for d in shape.strip("()").split(",")]))
    assert set(fallback) == set(erf) and elements > 0
    cost = compiled.cost
    assert cost["cycles_toolchain"] == sum(la.cycles for la in parse_layers(compiled.log)) > 0
    assert cost["cpu_flops"] == 4 * elements
    assert cost["cpu_cycles_estimate"] == cost["cpu_flops"] / HOST_FLOPS_PER_CYCLE["rknn"]
    assert cost["cycles"] == cost["cycles_toolchain"] + cost["cpu_cycles_estimate"]
    got = _agreement(model, compiled, _inputs(prepared))
    assert got["top1"] >= 0.97, got["top1"]


@needs_rknn
def test_a_toolkit_crash_is_recorded_with_its_last_lines_and_is_infeasible(
        tmp_path: Path) -> None:
    """Uniform INT8 on the transformer kills RKNN-Toolkit2 2.5.0 (int8 Mul/Softmax in the
    attention block): the error carries the signal and the toolkit's last lines, never our
    traceback; the search's feasibility check calls it infeasible with those words without
    compiling it twice, and a verified point records it as its failure."""
    from mpsearch.evaluate import Evaluator
    from mpsearch.targets._base import ToolchainCrash
    from mpsearch.targets._verify import TargetVerifier

    prepared = _prepared(FIXTURES / "transformer.onnx", FIXTURES / "digits_eval.npz")
    data = prepared.validation.take(8)
    verifier = TargetVerifier(prepared.quantizer, tmp_path, next(iter(data.batches(1))))
    assignment = make_assignment(prepared.graph, prepared.profile, uniform_assignment(
        prepared.graph, prepared.profile, "int8"))
    with pytest.raises(ToolchainCrash) as crash:
        verifier.compile(assignment)
    assert crash.value.status is not None and crash.value.status < 0
    assert crash.value.tail and str(crash.value).endswith(f"its last lines: {crash.value.tail}")
    assert "Traceback" not in str(crash.value)
    why = verifier.refusal(assignment)
    assert why is not None and why.startswith("the toolchain cannot compile it: ")
    assert f"crashed (exit status {crash.value.status})" in why
    record = verifier.verify(assignment, Evaluator(prepared.graph, data, metric="agreement"))
    assert record.metric is None and record.error is not None
    assert record.error.startswith("rknn crashed while compiling it: ")
    assert verifier.compiles == 1  # the crash is remembered, not compiled again


@needs_rknn
def test_rk3588_formats_the_toolkit_accepts(tmp_path: Path) -> None:
    """What hw_profiles/rk3588.yaml is checked against: the toolkit's own quantizer on the FP32
    demo builds w8a8 (INT8) and w16a16i_dfp (INT16) for rk3588 and refuses w8a16."""
    model = onnx.load(str(DEMO_MODEL))
    samples = [{"input": x[None]} for x in np.load(DEMO_DATA)["input"][:16]]
    found = {}
    for dtype in ("w8a8", "w16a16i_dfp"):
        compiled = TOOLCHAIN.compile(model, tmp_path / dtype, calibration=samples,
                                     settings={"quantized_dtype": dtype})
        convs = [p for p in compiled.placements if p.node.endswith("Conv")]
        found[dtype] = {p.precision for p in convs}
        for p in convs:
            assert f" {p.precision.replace('int', 'INT')} " in _row(compiled.log, p.node)
    assert found == {"w8a8": {"int8"}, "w16a16i_dfp": {"int16"}}
    with pytest.raises(TargetError, match="w8a16' not support in 'rk3588'"):
        TOOLCHAIN.compile(model, tmp_path / "w8a16", calibration=samples,
                          settings={"quantized_dtype": "w8a16"})


@needs_rknn
def test_a_relative_out_with_a_space_verifies_every_shown_point(tmp_path: Path) -> None:
    """The toolkit's worker runs in its own folder: a relative run directory (with a space)
    is resolved before it is handed over, so every shown point compiles and simulates."""
    import json
    import subprocess
    import sys

    spec = tmp_path / "demo_rk.yaml"
    spec.write_text(
        f"model: {DEMO_MODEL}\nprofile: rk3588\n"
        f"data: {{source: {DEMO_DATA}, calibration: 128, held_out: 0.5, seed: 0}}\n"
        "metric: accuracy\nobjectives: [metric, size]\nbudget: {trials: 3}\n"
        "analysis: false\nseed: 0\nverify: front\n")
    done = subprocess.run([sys.executable, "-m", "mpsearch", "-q", "search", spec.name,
                           "--out", "runs/rel out", "--no-report"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    front = json.loads((tmp_path / "runs" / "rel out" / "front.json").read_text())
    shown = [p for p in front["points"] if p["shown"]]
    assert shown
    for point in shown:
        assert point["target_placement"]["toolchain"] == "rknn", point["target_placement"]
        assert point["target_placement"].get("error") is None
        assert point["target_metric"] is not None and point["target_failure"] is None
        assert abs(point["target_metric"] - point["metric"]) <= 0.01
    assert "verdict" in done.stdout and " ok" in done.stdout
