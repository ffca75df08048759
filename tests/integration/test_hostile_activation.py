"""Activation memory through the real CLI (a child process reporting its own peak RSS): the
activations of one sample are known from the inferred shapes before calibration or evaluation
runs; batches shrink to fit the budget, and a model whose one sample does not fit exits 2
naming the tensor, its size and the setting to raise (models from tests/hostile/activations.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _paths import HOSTILE
from _peak import cli, read_peak

pytestmark = pytest.mark.slow  # quantizes a model of large activations

_SPEC = importlib.util.spec_from_file_location("hostile_activations", HOSTILE / "activations.py")
assert _SPEC is not None and _SPEC.loader is not None
activations = sys.modules["hostile_activations"] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(activations)

PEAK_LIMIT_KB = 2 << 20  # 2 GiB


def _run(argv: list[str], cwd: Path) -> tuple[int, list[str], int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MPSEARCH_ACTIVATION_MB", None)
    done = subprocess.run(cli(cwd / ".peak", *argv), cwd=cwd, env=env, check=False,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
    lines = [s for s in done.stderr.decode(errors="replace").splitlines() if s.strip()]
    return done.returncode, lines, read_peak(cwd / ".peak")


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _quantize(model: Path, data: Path, out: Path, *flags: str) -> list[str]:
    return [*flags, "quantize", str(model), "--profile", "x86_ort_auto", "--data", str(data),
            "--uniform", "int8", "--out", str(out), "--calibration-samples", "8"]


def test_one_sample_over_the_budget_exits_2_naming_the_tensor(tmp_path: Path) -> None:
    model, data = activations.resize_model(tmp_path, 250)  # 3x8000x8000 floats: 768 MB
    out = tmp_path / "out" / "q.onnx"
    before = _snapshot(tmp_path)
    code, lines, peak = _run(_quantize(model, data, out, "-q"), tmp_path)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == (
        f"mpsearch: error: {model.name}: tensor 'up' takes 768 MB per sample (1536 MB with "
        "ONNX Runtime's working copies and the activations held for evaluation), more than "
        "the 1024 MB activations may use; raise MPSEARCH_ACTIVATION_MB (MB) if the machine "
        "has the memory, or feed smaller inputs")
    assert peak < PEAK_LIMIT_KB, f"peak {peak} kB"
    assert _snapshot(tmp_path) == before and not out.parent.exists()


def test_batches_shrink_to_fit_the_budget(tmp_path: Path) -> None:
    model, data = activations.resize_model(tmp_path, 40)  # 3x1280x1280 floats: 19.7 MB
    out = tmp_path / "q.onnx"
    code, lines, peak = _run(_quantize(model, data, out, "-v"), tmp_path)
    assert code == 0, lines[-5:]
    assert any("evaluation: batches of 26 (not 64): 39.3 MB of activations per sample fit "
               "1024 MB" in line for line in lines), lines
    assert peak < PEAK_LIMIT_KB, f"peak {peak} kB"
    print(f"peak {peak} kB")
    assert out.is_file()
