"""Arm Ethos-U through Vela: our QDQ export -> integer TFLite -> Vela -> placement and cost.

``compile`` fixes dynamic dimensions (batch 1, the rest from the calibration data), lowers
the QDQ model to an integer TFLite file with the scales and zero points the search chose
(:mod:`._tflite_lower`), runs ``vela`` on it and reads Vela's own CSVs and warnings
(:mod:`._vela_report`). The artifact is Vela's optimised ``model_vela.tflite``.

``run`` computes the TFLite file given to Vela with TFLite's builtin kernels, without the
XNNPACK delegate: TFLite's fixed-point requantization, which TFLite Micro and Ethos-U follow
(the reference resolver is not used: its int8 SUM is wrong). There is no Ethos-U simulator on
the package index: Vela's figures are its performance model, and ``run``'s outputs are the
integer model's, not a simulation of the NPU.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from mpsearch.errors import TargetError
from mpsearch.profiles import toolchain_setting_problem
from mpsearch.targets._base import Compiled
from mpsearch.targets._cpu_cost import with_cpu_estimate
from mpsearch.targets._shapes import fixed_input_shapes, static_shapes
from mpsearch.targets._tflite_lower import lower
from mpsearch.targets._vela_report import placements, read_report

__all__ = ["SETTINGS", "VelaToolchain", "run_vela", "vela_flags"]

logger = logging.getLogger(__name__)

VELA_PIN = "ethos-u-vela==5.2.0"
INTERPRETER_PIN = "ai-edge-litert==2.3.0"
#: The settings a profile's ``toolchain:`` block may give, with Vela's command-line flag.
SETTINGS = {"accelerator_config": "--accelerator-config", "system_config": "--system-config",
            "memory_mode": "--memory-mode", "config": "--config", "optimise": "--optimise",
            "arena_cache_size": "--arena-cache-size"}
DEFAULT_ACCELERATOR = "ethos-u55-128"
_TIMEOUT = 1800


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def vela_flags(settings: Mapping[str, Any]) -> list[str]:
    """Vela's command-line flags for ``settings`` (TargetError for one it does not take)."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise TargetError(f"vela setting(s) {unknown} unknown; valid: {sorted(SETTINGS)}")
    problem = toolchain_setting_problem("vela", settings)
    if problem is not None:
        raise TargetError(f"vela: {problem}")
    chosen = {"accelerator_config": DEFAULT_ACCELERATOR, **settings}
    flags = []
    for key, value in chosen.items():
        if value is not None:
            flags += [SETTINGS[key], str(value)]
    return flags


class VelaToolchain:
    """The Ethos-U adapter (:class:`~mpsearch.targets.Toolchain`)."""

    name = "vela"

    def missing(self) -> str | None:
        try:
            metadata.version("ethos-u-vela")
        except metadata.PackageNotFoundError:
            return f"Vela is not installed: pip install {VELA_PIN}"
        return None

    def version(self) -> str:
        return metadata.version("ethos-u-vela")

    def compile(self, model: onnx.ModelProto, workdir: Path, *,
                calibration: Sequence[Mapping[str, np.ndarray]],
                settings: Mapping[str, Any]) -> Compiled:
        """Lower ``model`` to TFLite in ``workdir`` and compile it with Vela."""
        problem = self.missing()
        if problem is not None:
            raise TargetError(problem)
        flags = vela_flags(settings)
        workdir = Path(workdir)
        created = not workdir.exists()
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            return self._compile(model, workdir, calibration, flags)
        except BaseException:  # a refused model leaves no TFLite file, CSV or record behind
            _remove_outputs(workdir, created)
            raise

    def _compile(self, model: onnx.ModelProto, workdir: Path,
                 calibration: Sequence[Mapping[str, np.ndarray]], flags: list[str]) -> Compiled:
        fixed = fixed_input_shapes(model, calibration)
        flat, signature, _ = lower(model, static_shapes(model, fixed))
        tflite = workdir / "model.tflite"
        _write(tflite, flat.bytes())
        out_dir = workdir / "vela"
        command, stdout = run_vela(tflite, out_dir, flags)
        report = read_report(out_dir, tflite.stem, stdout)
        ops = [(node, flat.tensors[op.outputs[0]].name, flat.tensors[op.outputs[0]].dtype)
               for op in flat.ops for node in (op.node, *op.also)]
        placed, node_cycles = placements(report, ops)
        artifact = out_dir / f"{tflite.stem}_vela.tflite"
        record = {"signature": signature.to_dict(), "fixed_inputs": fixed,
                  "command": command[1:], "node_cycles": node_cycles,
                  "placements": [[p.node, p.unit, p.precision, p.reason] for p in placed]}
        _write(workdir / "model.json", json.dumps(record, indent=1).encode())
        if fixed:
            logger.info("vela: inputs fixed to static shapes %s", fixed)
        cost = with_cpu_estimate(report.cost, model, placed, self.name)
        return Compiled(toolchain=self.name, version=self.version(), placements=placed,
                        cost=cost, artifact=artifact if artifact.exists() else None,
                        log=stdout)

    def run(self, compiled: Compiled, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Outputs of the integer TFLite model Vela compiled, by TFLite's builtin kernels,
        one sample at a time; float inputs are quantized as the QDQ model's first
        QuantizeLinear does (round half to even, saturate)."""
        if compiled.artifact is None:
            raise TargetError("this compilation has no artifact to run")
        workdir = compiled.artifact.parent.parent
        record = json.loads((workdir / "model.json").read_text())
        interpreter = _interpreter(workdir / "model.tflite")
        sig = record["signature"]
        details = interpreter.get_input_details()
        outputs = interpreter.get_output_details()
        count = len(next(iter(inputs.values())))
        results: list[list[np.ndarray]] = [[] for _ in outputs]
        for k in range(count):
            for name, nhwc, detail in zip(sig["inputs"], sig["nhwc_inputs"], details,
                                          strict=True):
                x = np.asarray(inputs[name][k:k + 1], np.float32)
                interpreter.set_tensor(detail["index"], _quantize(
                    x.transpose(0, 2, 3, 1) if nhwc else x, detail))
            try:
                interpreter.invoke()
            except RuntimeError as e:  # e.g. no int16 kernel for an operator
                first = str(e).strip().splitlines()[0]
                raise TargetError(f"TFLite cannot run {workdir / 'model.tflite'}: {first}") from e
            for i, (detail, nhwc) in enumerate(zip(outputs, sig["nhwc_outputs"], strict=True)):
                y = _dequantize(interpreter.get_tensor(detail["index"]), detail)
                results[i].append(y.transpose(0, 3, 1, 2) if nhwc else y)
        return [np.concatenate(r) for r in results]


def _remove_outputs(workdir: Path, created: bool) -> None:
    """Remove what :meth:`VelaToolchain.compile` writes in ``workdir`` (the folder too when
    the call ``created`` it and nothing else is in it)."""
    for name in ("model.tflite", "model.json"):
        (workdir / name).unlink(missing_ok=True)
    shutil.rmtree(workdir / "vela", ignore_errors=True)
    if created:
        with contextlib.suppress(OSError):
            workdir.rmdir()


def run_vela(tflite: Path, out_dir: Path, flags: Sequence[str]) -> tuple[list[str], str]:
    """Run Vela on ``tflite`` (its CSVs into ``out_dir``); returns the command and stdout."""
    command = [sys.executable, "-m", "ethosu.vela", str(tflite), "--output-dir", str(out_dir),
               "--verbose-performance", "--show-cpu-operations", *flags]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT,
                              check=False)
    except subprocess.TimeoutExpired as e:
        raise TargetError(f"vela did not finish on {tflite} in {_TIMEOUT} s") from e
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise TargetError(f"vela refused {tflite} (exit {done.returncode}): {last}")
    return command, done.stdout


def _interpreter(path: Path) -> Any:
    try:
        from ai_edge_litert.interpreter import (  # type: ignore[import-untyped,unused-ignore]
            Interpreter,
            OpResolverType,
        )
    except ImportError as e:
        raise TargetError("the TFLite interpreter is not installed: "
                          f"pip install {INTERPRETER_PIN}") from e
    interpreter = Interpreter(model_path=str(path),
                              experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    try:
        interpreter.allocate_tensors()
    except RuntimeError as e:
        raise TargetError(f"TFLite refuses {path}: {str(e).strip().splitlines()[0]}") from e
    return interpreter


def _quantize(x: np.ndarray, detail: Mapping[str, Any]) -> np.ndarray:
    scale, zero = detail["quantization"]
    dtype = np.dtype(detail["dtype"])
    if dtype.kind == "f" or not scale:
        same: np.ndarray = x.astype(dtype)
        return same
    info = np.iinfo(dtype)
    codes: np.ndarray = np.clip(np.round(x / scale) + zero, info.min, info.max).astype(dtype)
    return codes


def _dequantize(y: np.ndarray, detail: Mapping[str, Any]) -> np.ndarray:
    scale, zero = detail["quantization"]
    if np.dtype(detail["dtype"]).kind == "f" or not scale:
        floats: np.ndarray = np.asarray(y, np.float32)
        return floats
    real: np.ndarray = ((y.astype(np.float64) - zero) * scale).astype(np.float32)
    return real
