"""Small hostile inputs: each exits 2 with one line naming the file, the problem and the fix,
under 1 GiB, touching nothing outside its output (the CLI in a child process)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from _paths import FIXTURES, ROOT
from _peak import cli, read_peak
from onnx import TensorProto, helper, numpy_helper

from mpsearch.errors import ProfileError, SpecError, TargetError
from mpsearch.profiles import ToolchainRef, load_profile
from mpsearch.spec import Constraints

pytestmark = pytest.mark.slow  # each case starts the CLI

PEAK_LIMIT_KB = 1 << 20  # 1 GiB
PROFILES = ROOT / "hw_profiles"


def _run(argv: list[str], cwd: Path) -> tuple[int, list[str], str, int]:
    """(exit code, visible stderr lines, stdout, peak kB) of ``mpsearch -q argv`` in ``cwd``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cli(cwd / ".peak", "-q", *argv), cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    lines = [seg.split("\r")[-1] for seg in done.stderr.split("\n") if seg.split("\r")[-1].strip()]
    return done.returncode, lines, done.stdout, read_peak(cwd / ".peak")


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _fails(argv: list[str], cwd: Path, message: str) -> str:
    """Run a case that must exit 2; the one line it prints."""
    before = _snapshot(cwd)
    code, lines, _, peak = _run(argv, cwd)
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("mpsearch: error: ") and message in lines[0], lines[0]
    assert _snapshot(cwd) == before, "a file was written or changed"
    assert peak < PEAK_LIMIT_KB, f"peak {peak} kB"
    return lines[0]


def _model(path: Path, weight: np.ndarray, *, x_shape: list[object] | None) -> Path:
    rng = np.random.default_rng(0)
    x = (helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape) if x_shape is not None
         else helper.make_tensor_value_info("x", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
         helper.make_node("MatMul", ["x", "V"], ["y"], name="mm2")], "g", [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, ["N", weight.shape[1]])],
        [numpy_helper.from_array(weight, "W"),
         numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "V")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _quantize(model: Path, tmp: Path) -> list[str]:
    rng = np.random.default_rng(1)
    np.savez(tmp / "d.npz", x=rng.normal(size=(40, 4)).astype(np.float32),
             labels=rng.integers(0, 3, 40))
    return ["quantize", str(model), "--profile", "x86_ort", "--data", str(tmp / "d.npz"),
            "--uniform", "int8", "--out", str(tmp / "out" / "q.onnx"),
            "--calibration-samples", "8"]


def test_zero_size_weight_exits_2(tmp_path: Path) -> None:
    model = _model(tmp_path / "zero.onnx", np.zeros((4, 0), np.float32), x_shape=["N", 4])
    line = _fails(_quantize(model, tmp_path), tmp_path,
                  "initializer 'W' of MatMul node 'mm' holds no values (shape [4, 0]); remove")
    assert str(model) in line


def test_input_without_shape_exits_2(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    model = _model(tmp_path / "noshape.onnx", rng.normal(size=(4, 2)).astype(np.float32),
                   x_shape=None)
    line = _fails(_quantize(model, tmp_path), tmp_path,
                  "input 'x' has no shape (onnx.checker requires one); re-export the model")
    assert str(model) in line


def test_profiles_check_unknown_op_lists_the_probes(tmp_path: Path) -> None:
    _fails(["profiles", "check", "ethos_u55", "--ops", "Conv,Nope"], tmp_path,
           "ethos_u55: no probe for op type 'Nope'; pick from Abs, Add, AveragePool")


def test_profiles_check_ops_named_3000_times_probe_once(tmp_path: Path) -> None:
    """``--ops`` repeated 3,000 times (and 3,000 names in one) probes each op once."""
    argv = ["profiles", "check", "ethos_u55", "--json", "--ops", ",".join(["Relu"] * 3000)]
    argv += [a for _ in range(3000) for a in ("--ops", "Relu")]
    code, lines, out, peak = _run(argv, tmp_path)
    probes = json.loads(out)["probes"]
    assert code == 0, lines
    formats = list(load_profile("ethos_u55").formats)
    assert [(p["op_type"], p["format"]) for p in probes] == [("Relu", f) for f in formats]
    assert peak < PEAK_LIMIT_KB


@pytest.mark.parametrize(("setting", "message"), [
    ("htp_arch: 73, soc_model: -5", "toolchain.soc_model must be one of 0, 30, 36,"),
    ("htp_arch: 99", "toolchain.htp_arch must be one of 68, 69, 73, 75, 79, 81, got 99"),
    ("htp_arch: 73, soc_model: 57", "toolchain.soc_model 57 (SM8650) has HTP v75, not "
                                    "htp_arch 73"),
])
def test_bad_qnn_chip_exits_2(setting: str, message: str, tmp_path: Path) -> None:
    text = (PROFILES / "qnn_htp.yaml").read_text()
    shipped = "toolchain: {name: qnn, htp_arch: 73, soc_model: 43}"
    assert text.count(shipped) == 1
    profile = tmp_path / "qnn.yaml"
    profile.write_text(text.replace(shipped, f"toolchain: {{name: qnn, {setting}}}"))
    line = _fails(["profiles", "show", str(profile)], tmp_path, message)
    assert line.startswith(f"mpsearch: error: {profile}:")


def test_bad_vela_accelerator_exits_2(tmp_path: Path) -> None:
    """Once the toolchain's refusal, a disagreement (exit 1); now the profile's error."""
    text = (PROFILES / "ethos_u55.yaml").read_text()
    assert text.count("accelerator_config: ethos-u55-128") == 1
    profile = tmp_path / "u55.yaml"
    profile.write_text(text.replace("accelerator_config: ethos-u55-128",
                                    "accelerator_config: ethos-u55-999"))
    _fails(["profiles", "check", str(profile), "--ops", "Relu"], tmp_path,
           "toolchain.accelerator_config must be one of ethos-u55-32,")


def test_nan_in_a_spec_exits_2(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {FIXTURES / 'resnet.onnx'}\nprofile: x86_ort\n"
                    f"data: {{source: {FIXTURES / 'digits_eval.npz'}, calibration: 32}}\n"
                    "metric: accuracy\nbudget: {trials: 3}\nanalysis: false\n"
                    "constraints: {max_metric_drop: .nan}\n")
    _fails(["search", str(spec), "--out", str(tmp_path / "run")], tmp_path,
           f"{spec}:7: constraints.max_metric_drop must be a finite number, got nan")


@pytest.mark.parametrize("values", [{"max_metric_drop": float("nan")},
                                    {"min_metric": float("-inf")},
                                    {"max_metric_drop": float("inf")}])
def test_non_finite_constraints_are_refused_in_python(values: dict[str, float]) -> None:
    with pytest.raises(SpecError, match="must be a finite number"):
        Constraints(**values)  # type: ignore[arg-type]


def test_bad_chip_is_refused_in_python() -> None:
    with pytest.raises(ProfileError, match="toolchain.soc_model must be one of"):
        ToolchainRef(name="qnn", settings={"soc_model": -5})
    assert ToolchainRef(name="qnn", settings={"htp_arch": 75, "soc_model": 57}).settings
    from mpsearch.targets._qnn import QnnToolchain

    with pytest.raises(TargetError, match="qnn: toolchain.soc_model must be one of"):
        QnnToolchain.provider_options({"soc_model": -5})
    assert QnnToolchain.provider_options({"htp_arch": 73})["soc_model"] == "43"


def test_a_failed_vela_compile_leaves_no_file(tmp_path: Path) -> None:
    from mpsearch import Dataset, calibrate, load_model, uniform_assignment
    from mpsearch.quantize import build_qdq
    from mpsearch.targets import VelaToolchain
    from mpsearch.targets._probes import probe_model

    graph = load_model(probe_model("Relu"))
    x = np.random.default_rng(0).standard_normal((8, 4, 8, 8)).astype(np.float32)
    profile = load_profile("ethos_u55")
    model = build_qdq(graph, calibrate(graph, Dataset(inputs={"x": x})), profile,
                      uniform_assignment(graph, profile, "int8"))
    workdir = tmp_path / "export_vela"
    with pytest.raises(TargetError, match="System_Config.Nope not found"):
        VelaToolchain().compile(model, workdir, calibration=[{"x": x[:1]}],
                                settings={"system_config": "Nope"})
    assert not workdir.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(TargetError):
        VelaToolchain().compile(model, kept, calibration=[{"x": x[:1]}],
                                settings={"system_config": "Nope"})
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]
    compiled = VelaToolchain().compile(model, workdir, calibration=[{"x": x[:1]}], settings={})
    assert compiled.artifact is not None and (workdir / "model.tflite").is_file()
