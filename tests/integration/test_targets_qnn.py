"""The QNN HTP adapter against onnxruntime-qnn's own emulator: placement with the EP's
reasons, emulated numerics next to ONNX Runtime's CPU EP, cycle counts from the backend's
profile and a context binary that reloads and computes what the emulator computed.

CI installs the ``qnn`` extra; these tests are not skipped when it is missing (they fail).
"""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from _paths import FIXTURES
from onnx import TensorProto, helper, numpy_helper

from mpsearch.assignment import uniform_assignment
from mpsearch.calibration import calibrate
from mpsearch.data import load_data
from mpsearch.demo import DEMO_DATA, DEMO_MODEL
from mpsearch.errors import ProfileError, TargetError
from mpsearch.graph import load_model
from mpsearch.pipeline import Prepared, prepare_inputs
from mpsearch.profiles import ToolchainRef, load_profile, runs_fused_int8
from mpsearch.quantize import Quantizer
from mpsearch.runtime import create_plugin_session, create_session
from mpsearch.targets import CPU, Compiled, toolchain
from mpsearch.targets._qnn import EP

pytestmark = pytest.mark.slow  # whole searches, servers, browsers, toolchains

SETTINGS = {"htp_arch": 73, "soc_model": 43}


@pytest.fixture(scope="module")
def demo() -> tuple[Quantizer, np.ndarray, np.ndarray]:
    """The demo model's quantizer under qnn_htp, and 96 held-out samples with labels."""
    graph = load_model(DEMO_MODEL)
    data = load_data(DEMO_DATA)
    table = calibrate(graph, data.take(128))
    x = data.inputs["input"][128:224]
    assert data.labels is not None
    return Quantizer(graph, table, load_profile("qnn_htp")), x, data.labels[128:224]


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((logits.argmax(axis=1) == labels).mean())


def _compile(model: onnx.ModelProto, x: np.ndarray, workdir: Path) -> Compiled:
    return toolchain("qnn").compile(model, workdir, calibration=[{"input": x[:1]}],
                                    settings=SETTINGS)


def test_the_extra_is_installed() -> None:
    assert toolchain("qnn").missing() is None


def test_uniform_demo_runs_fully_on_the_htp_and_scores_as_on_the_cpu(
        demo: tuple[Quantizer, np.ndarray, np.ndarray], tmp_path: Path) -> None:
    """The regression of the per-axis bias beside a per-tensor Gemm weight: the emulator
    scored uniform int16 0.087 against 0.984 on the CPU EP. (Uniform int8 is not held to
    this: the HTP's 8-bit depthwise convolutions compute differently from the CPU EP's.)"""
    quantizer, x, labels = demo
    fmt = "int16"
    model = quantizer.build(uniform_assignment(quantizer.graph, quantizer.profile, fmt))
    compiled = _compile(model, x, tmp_path)
    assert compiled.fallback == ()
    assert {p.precision for p in compiled.placements if p.node.endswith("Conv")} == {fmt}
    assert compiled.notes == ("input 'input' dimension 0 (batch) fixed to 1, the data's",)
    target = toolchain("qnn")
    htp = target.run(compiled, {"input": x})[0]
    cpu = create_session(model).run({"input": x})["logits"]
    assert abs(_accuracy(htp, labels) - _accuracy(cpu, labels)) <= 0.02
    assert htp.shape == cpu.shape


def test_context_binary_reloads_and_computes_what_the_emulator_computed(
        demo: tuple[Quantizer, np.ndarray, np.ndarray], tmp_path: Path) -> None:
    quantizer, x, _ = demo
    model = quantizer.build(uniform_assignment(quantizer.graph, quantizer.profile, "int16"))
    compiled = _compile(model, x, tmp_path)
    assert compiled.artifact is not None and compiled.artifact.is_file()
    binaries = list(tmp_path.glob("model_ctx*.bin"))
    assert binaries and compiled.cost["context_bytes"] == sum(b.stat().st_size for b in binaries)
    ctx = onnx.load(str(compiled.artifact))
    assert [n.op_type for n in ctx.graph.node] == ["EPContext"]
    import onnxruntime_qnn

    # a session of our own on the exported file, CPU fallback forbidden: the whole graph is
    # the context binary, and it computes bit for bit what the adapter's emulator run did
    session, _ = create_plugin_session(
        compiled.artifact, ep_name=EP, library=onnxruntime_qnn.get_library_path(),
        provider_options={"backend_type": "htp", "htp_arch": "73", "soc_model": "43"},
        config={"session.disable_cpu_ep_fallback": "1"})
    own = session.run({"input": x[:8]})["logits"]
    np.testing.assert_array_equal(own, toolchain("qnn").run(compiled, {"input": x[:8]})[0])


def test_cycles_are_the_median_of_the_backend_profile(
        demo: tuple[Quantizer, np.ndarray, np.ndarray], tmp_path: Path) -> None:
    quantizer, x, _ = demo
    model = quantizer.build(uniform_assignment(quantizer.graph, quantizer.profile, "int8"))
    compiled = _compile(model, x, tmp_path)
    assert {p.precision for p in compiled.placements if p.node.endswith("Conv")} == {"int8"}
    with (tmp_path / "profile.csv").open(newline="") as file:
        rows = [r for r in csv.DictReader(file) if r["Unit of Measurement"] == "CYCLES"]
    totals = [float(r["Time"]) for r in rows
              if r["Event Identifier"] == "Accelerator (execute) time (cycles)"]
    assert len(totals) == 5
    assert compiled.cost["cycles"] == statistics.median(totals)
    gemm = [p for p in compiled.placements if p.node == "/fc/Gemm"]
    assert gemm and gemm[0].cycles is not None
    per_gemm = [float(r["Time"]) for r in rows if r["Event Identifier"].startswith("/fc/Gemm")]
    assert gemm[0].cycles == statistics.median(per_gemm)


@pytest.fixture(scope="module")
def vit() -> Prepared:
    """The tests' ViT-style transformer fixture under qnn_htp (two blocks: LayerNormalization,
    attention whose q, k and v are Gathers of one 5-D tensor, Erf GELU), calibrated on 64
    digits; its validation split holds the held-out ones."""
    return prepare_inputs(FIXTURES / "transformer.onnx", "qnn_htp",
                          FIXTURES / "digits_eval.npz", calibration_samples=64)


def _erf_only(compiled: Compiled) -> None:
    """Every node on the HTP but the Erfs (the QNN EP has no Erf) and the Q/DQ around them."""
    assert compiled.fallback
    for placed in compiled.fallback:
        assert "Erf" in placed.reason, (placed.node, placed.reason)


@pytest.mark.parametrize("fmt", ["int8", "int16", "fp16"])
def test_the_transformer_finalizes_on_the_htp_and_computes_as_on_the_cpu(
        vit: Prepared, fmt: str, tmp_path: Path) -> None:
    """The transformer's uniform models load on the HTP of the profile's SoC (without one the
    emulator's graph finalize fails with QNN_COMMON_ERROR_MEM_ALLOC). In the integer models each
    GELU erf pattern is fused into one Gelu, so every node runs on the HTP; the fp16 model
    keeps its Erfs, which fall back to the CPU.

    Tolerances: fp16 logits within 2 half-precision steps at their largest magnitude of the CPU
    EP's on the same static file (every tensor is rounded to fp16 on both sides); A16W8 within
    2 steps of an 8-bit grid over their range, the weights' precision (the HTP's 16-bit
    LayerNormalization, Softmax and requantizations round otherwise than the CPU EP's float
    arithmetic). Uniform int8: the emulator's accuracy within 2 points of the exported model's
    in the CPU EP (the fused Gelu rounds once where the exported chain rounds four times)."""
    model = vit.quantizer.build(uniform_assignment(vit.graph, vit.profile, fmt))
    settings = dict(vit.profile.toolchain.settings) if vit.profile.toolchain else {}
    assert settings == SETTINGS
    held = vit.validation.take(64)
    x, labels = np.asarray(held.inputs["input"]), held.labels
    assert labels is not None
    target = toolchain("qnn")
    compiled = target.compile(model, tmp_path, calibration=[{"input": x[:1]}],
                              settings=settings)
    if fmt == "fp16":
        _erf_only(compiled)
    else:
        assert not compiled.fallback, [(p.node, p.reason) for p in compiled.fallback]
        assert any("GELU erf pattern(s) fused" in note for note in compiled.notes)
    precisions = {p.precision for p in compiled.placements
                  if p.unit != CPU and p.node.endswith(("MatMul", "Gather", "Softmax"))}
    assert precisions == {fmt}
    htp = np.concatenate([target.run(compiled, {"input": x[i:i + 1]})[0]
                          for i in range(len(x))])
    if fmt == "int8":
        fused = runs_fused_int8(vit.profile)  # as a search runs the HTP's stand-in here
        exported = create_session(model, fused_int8=fused).run({"input": x})["logits"]
        assert abs(_accuracy(htp, labels) - _accuracy(exported, labels)) <= 0.02
        return
    assert compiled.source is not None
    cpu = create_session(onnx.load(str(compiled.source))).run({"input": x})["logits"]
    if fmt == "fp16":
        step = float(np.spacing(np.float16(np.abs(cpu).max())))
    else:
        step = float(np.ptp(cpu)) / 255
    assert float(np.abs(htp - cpu).max()) <= 2 * step
    assert _accuracy(htp, labels) == _accuracy(cpu, labels)


def _depthwise(stride: tuple[int, int]) -> onnx.ModelProto:
    """One float depthwise 3x3 Conv of 8 channels (ppocr_cls's second block's shape)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 1, 3, 3)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="dw", group=8,
                          kernel_shape=[3, 3], strides=list(stride), pads=[1, 1, 1, 1])],
        "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 24, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_htp_arch_alone_gets_its_reference_soc(tmp_path: Path) -> None:
    """A float depthwise Conv with stride (2, 1) (ppocr_cls's fp16 model) fails the emulator's
    finalize with soc_model 0, the EP's default; given htp_arch 73 alone, the adapter uses
    SM8550 (soc_model 43), says so, and the emulator computes the Conv as the CPU EP does, to
    half precision."""
    model = _depthwise((2, 1))
    x = np.random.default_rng(1).standard_normal((1, 8, 24, 96)).astype(np.float32)
    target = toolchain("qnn")
    assert target.provider_options({"htp_arch": 73})["soc_model"] == "43"
    assert "soc_model" not in target.provider_options({})
    # in a process of its own: the QNN backend keeps the SoC of its first session
    onnx.save(model, str(tmp_path / "dw.onnx"))
    script = ("import sys, numpy as np, onnx\n"
              "from mpsearch.targets import toolchain\n"
              "x = np.zeros((1, 8, 24, 96), np.float32)\n"
              "toolchain('qnn').compile(onnx.load(sys.argv[1]), sys.argv[2],"
              " calibration=[{'x': x}], settings={'htp_arch': 73, 'soc_model': 0})\n")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "dw.onnx"),
                          str(tmp_path / "soc0")], capture_output=True, text=True, timeout=600)
    assert out.returncode != 0 and "QNN_COMMON_ERROR_MEM_ALLOC" in out.stderr, out.stderr[-2000:]
    compiled = target.compile(model, tmp_path / "arch", calibration=[{"x": x}],
                              settings={"htp_arch": 73})
    assert compiled.notes == ("soc_model 43 (SM8550), the reference SoC of htp_arch 73: "
                              "without a SoC the emulator fails to finalize some graphs",)
    assert [(p.node, p.unit, p.precision) for p in compiled.placements] == [
        ("dw", "accelerator", "fp16")]
    htp = target.run(compiled, {"x": x})[0]
    cpu = create_session(model).run({"x": x})["y"]
    np.testing.assert_allclose(htp, cpu, rtol=0,
                               atol=2 * float(np.spacing(np.float16(np.abs(cpu).max()))))


def _erf_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
         helper.make_node("Erf", ["m"], ["e"], name="erf"),
         helper.make_node("Relu", ["e"], ["y"], name="relu")],
        "erf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_refused_op_falls_back_with_the_eps_own_reason(tmp_path: Path) -> None:
    model = _erf_model()
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    target = toolchain("qnn")
    compiled = target.compile(model, tmp_path, calibration=[{"x": x[:1]}], settings=SETTINGS)
    (erf,) = compiled.fallback
    assert erf.node == "erf" and erf.unit == CPU and erf.precision == "fp32"
    # the reason is the QNN EP's own line, as its verbose log printed it
    assert f"REASON : {erf.reason}" in compiled.log
    assert "Erf" in erf.reason
    assert {p.node: p.unit for p in compiled.placements} == {
        "matmul": "accelerator", "erf": "cpu", "relu": "accelerator"}
    # float ops on the HTP run in half precision: the emulator's output is the fp16 one
    htp = np.concatenate([target.run(compiled, {"x": x[i:i + 1]})[0] for i in range(4)])
    cpu = create_session(model).run({"x": x})["y"]
    assert not np.array_equal(htp, cpu)
    np.testing.assert_allclose(htp, cpu, rtol=0, atol=2e-2)


def test_unknown_settings_and_toolchains_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="unknown toolchain 'qnm'; known: qnn"):
        toolchain("qnm")
    with pytest.raises(TargetError, match=r"unknown setting\(s\) \['htp_arc'\]"):
        toolchain("qnn").compile(_erf_model(), tmp_path, calibration=[
            {"x": np.zeros((1, 8), np.float32)}], settings={"htp_arc": 73})
    with pytest.raises(ProfileError, match="unknown setting"):
        ToolchainRef(name="qnn", settings={"target_platform": "rk3588"})
    assert load_profile("qnn_htp").toolchain == ToolchainRef(name="qnn", settings=SETTINGS)


def _demo_spec(tmp_path: Path, verify: str, trials: int = 4, extra: str = "") -> Path:
    """The demo without its outlier weights (tests/fixtures/build_demo.py), whose front the
    HTP's fixed-point kernels compute as ONNX Runtime does."""
    spec = tmp_path / "demo_qnn.yaml"
    spec.write_text(
        f"model: {FIXTURES / 'demo_stream.onnx'}\nprofile: qnn_htp\n"
        f"data: {{source: {DEMO_DATA}, calibration: 128, held_out: 0.5, seed: 0}}\n"
        "metric: accuracy\nobjectives: [metric, size]\nbudget: {trials: " + str(trials) + "}\n"
        f"analysis: false\nseed: 0\nverify: {verify}\n{extra}")
    return spec


def test_verified_search_reports_the_emulators_metric_and_exports_a_binary_that_agrees(
        tmp_path: Path) -> None:
    """``verify: toolchain``: every shown front point runs wholly on the HTP and carries the
    emulator's held-out metric (hidden points are not verified); ``export --target`` writes
    the context binary, and a session of our own on it scores what the front says."""
    import onnxruntime_qnn

    from mpsearch.pipeline import export_point, prepare, search_run
    from mpsearch.pipeline._prepare import _splits
    from mpsearch.spec import load_spec

    spec = load_spec(_demo_spec(tmp_path, "toolchain"))
    run = search_run(spec, tmp_path / "run")
    assert run.front.points
    held = _splits(prepare(spec), spec)[1]
    assert held.labels is not None
    x, labels = held.inputs["input"], held.labels
    shown = run.front.shown
    assert shown
    for point in run.front.points:
        placed = point.target_placement
        if not point.shown:
            assert placed is None and point.target_metric is None
            continue
        assert placed is not None and placed["fallback"] == [] and placed["toolchain"] == "qnn"
        assert point.target_metric is not None and point.target_cost is not None
        # within the profile's tolerance (0.01 for accuracy), or marked and never recommended:
        # the demo's uniform INT8 is where the HTP's 8-bit kernels and the CPU EP's differ
        if point.target_failure is None:
            assert abs(point.target_metric - point.metric) <= 0.01 + 1e-9
        else:
            assert "outside the profile's target tolerance" in point.target_failure
            assert run.front.recommended != point.index
    verified = [p for p in shown if p.target_failure is None]
    assert verified, "no shown point verified on the HTP"
    first = verified[0]
    built = export_point(tmp_path / "run", first.index, tmp_path / "point0.onnx", target=True)
    assert built.target_artifact == tmp_path / "point0_qnn" / "model_ctx.onnx"
    assert built.target_metric == first.target_metric
    session, _ = create_plugin_session(
        built.target_artifact, ep_name=EP, library=onnxruntime_qnn.get_library_path(),
        provider_options={"backend_type": "htp", "htp_arch": "73", "soc_model": "43",
                          "offload_graph_io_quantization": "0"},
        config={"session.disable_cpu_ep_fallback": "1"})
    own = _accuracy(session.run({"input": x})["logits"], labels)
    assert own == built.target_metric
    # the report shows each point's target metric beside ORT's, and every node's placement
    from mpsearch import write_report

    html = write_report(tmp_path / "run").read_text()
    section = html[html.index('<section id="target">'):]
    section = section[:section.index("</section>")]
    assert f"<td>{first.metric:.4f}</td><td>{first.target_metric:.4f}</td>" in section
    assert section.count("every node on the target") == len(shown)
    assert section.count("<td>ok</td>") == sum(p.target_failure is None for p in shown)


def test_profiles_check_reports_the_toolchains_verdicts(tmp_path: Path) -> None:
    import json

    out = subprocess.run([sys.executable, "-m", "mpsearch", "profiles", "check", "qnn_htp",
                          "--ops", "Conv,Gelu,Erf", "--json"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr  # the profile says what the HTP does
    report = json.loads(out.stdout)
    rows = {(r["op_type"], r["format"]): r for r in report["probes"]}
    assert report["settings"] == SETTINGS
    for fmt, precision in (("int8", "int8"), ("int16", "int16"), ("fp16", "fp16")):
        conv = rows[("Conv", fmt)]
        assert (conv["unit"], conv["precision"], conv["agrees"]) == (
            "accelerator", precision, True)
    # the float Conv is the HTP's too, computed in half precision, as the profile's
    # fp32 runs_as fp16 says: the probe (built as fp16) agrees with ONNX Runtime
    conv = rows[("Conv", "fp32")]
    assert (conv["unit"], conv["precision"], conv["expected"], conv["agrees"]) == (
        "accelerator", "fp16", "fp16", True)
    assert conv["error"] <= 0.05
    # the QNN EP has no Erf: the profile's on_cpu says so
    erf = rows[("Erf", "fp32")]
    assert (erf["claimed"], erf["unit"], erf["agrees"]) == ("cpu", "cpu", True)
    assert "not supported by QNN EP" in erf["reason"]
    # float Gelu finalizes on the SoC the profile names (without one it does not)
    gelu = rows[("Gelu", "fp16")]
    assert (gelu["claimed"], gelu["unit"], gelu["precision"], gelu["agrees"]) == (
        "accelerator", "accelerator", "fp16", True)
    assert rows[("Gelu", "fp32")]["precision"] == "fp16"


def test_verify_is_checked_strictly_and_needs_a_profile_with_a_toolchain(
        tmp_path: Path) -> None:
    from mpsearch.errors import SpecError
    from mpsearch.pipeline import search_run
    from mpsearch.spec import load_spec

    spec = _demo_spec(tmp_path, "toolchian")
    with pytest.raises(SpecError, match=r"verify must be one of none, front, toolchain"):
        load_spec(spec)
    assert load_spec(_demo_spec(tmp_path, "front")).verify == "front"
    x86 = _demo_spec(tmp_path, "toolchain")
    x86.write_text(x86.read_text().replace("profile: qnn_htp", "profile: x86_ort"))
    with pytest.raises(SpecError, match="profile x86_ort names no toolchain"):
        search_run(load_spec(x86), tmp_path / "run")


def test_cost_counts_a_node_left_to_the_cpu(tmp_path: Path) -> None:
    """A lone Erf (no Erf in the QNN EP) leaves nothing on the HTP to profile; its cost is its
    work on the host core (4 FLOPs per element, summary's count), not an empty record."""
    from mpsearch.targets._cpu_cost import HOST_FLOPS_PER_CYCLE
    from mpsearch.targets._probes import probe_model

    tool = toolchain("qnn")
    x = np.zeros((1, 4, 8, 8), np.float32)
    erf = tool.compile(probe_model("Erf"), tmp_path / "erf", calibration=[{"x": x}],
                       settings=SETTINGS)
    assert [(p.node, p.unit) for p in erf.placements] == [("probe", CPU)]
    assert erf.cost["cycles_toolchain"] == 0.0 and erf.cost["cpu_flops"] == 4 * x.size
    assert erf.cost["cycles"] == 4 * x.size / HOST_FLOPS_PER_CYCLE["qnn"]
    conv = tool.compile(probe_model("Conv"), tmp_path / "conv", calibration=[{"x": x}],
                        settings=SETTINGS)
    assert conv.fallback == () and conv.cost["cpu_flops"] == 0.0
    assert conv.cost["cycles"] == conv.cost["cycles_toolchain"] > 0
