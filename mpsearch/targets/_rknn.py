"""Rockchip RKNN-Toolkit2 adapter: our QDQ ONNX -> ``.rknn``, layer placement, simulator numerics.

The toolkit runs in its own pinned environment (:mod:`mpsearch.targets.rknn_env`) behind a
subprocess running ``_rknn_worker.py``; requests and results are JSON, arrays NPZ. ``compile``
fixes the input shapes to the calibration sample's, lowers the opset to 19 (the toolkit's
limit) when needed, builds with the QDQ scales as they are (``do_quantization`` false: float
layers become FP16), exports the ``.rknn`` file and parses the verbose build's "Network Layer
Information Table" into placements (dtype, NPU or CPU) and cost (estimated cycles; the table
gives a CPU layer none, so ``cycles`` adds an estimate of the CPU's share,
:mod:`mpsearch.targets._cpu_cost`, and ``cycles_toolchain`` keeps the table's sum). ``run``
rebuilds the same model in a worker that keeps the x86 simulator open for the next call.
"""

from __future__ import annotations

import atexit
import json
import logging
import re
import select
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import version_converter

from mpsearch.errors import TargetError
from mpsearch.graph import default_opset
from mpsearch.targets import _rknn_env as rknn_env
from mpsearch.targets._base import Compiled, ToolchainCrash, log_tail
from mpsearch.targets._cpu_cost import with_cpu_estimate
from mpsearch.targets._rknn_table import cost_of, parse_layers, place, plain_float

__all__ = ["RknnToolchain"]

logger = logging.getLogger(__name__)

MAX_OPSET = 19  # RKNN-Toolkit2 2.5.0 loads ONNX opset <= 19
_MAX_IR = 10    # onnx 1.18 reads IR <= 11; our onnx may write newer
_WORKER = Path(__file__).with_name("_rknn_worker.py")
_SETTINGS = frozenset({"target_platform", "timeout_s", "quantized_dtype"})
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REQUEST = "rknn_request.json"


def _for_toolkit(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    """``model`` at opset <= 19 and an IR version onnx 1.18 reads."""
    opset = default_opset(model)
    if opset > MAX_OPSET:
        try:
            model = version_converter.convert_version(model, MAX_OPSET)
            notes.append(f"opset {opset} lowered to {MAX_OPSET} (the toolkit's limit)")
        except Exception as e:  # the converter raises bare RuntimeErrors
            raise TargetError(f"RKNN-Toolkit2 loads ONNX opset <= {MAX_OPSET}; this model is "
                              f"opset {opset} and onnx's converter failed ({e}); export it "
                              f"at opset <= {MAX_OPSET}") from e
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.ir_version = min(out.ir_version, _MAX_IR)
    return out


def _static_shapes(model: onnx.ModelProto, calibration: Sequence[Mapping[str, np.ndarray]],
                   notes: list[str]) -> dict[str, list[int]]:
    """Graph input -> the static shape the toolkit builds for: the first calibration sample's."""
    if not calibration:
        raise TargetError("RKNN compile: no calibration sample given; one sample fixes the "
                          "static input shapes the toolkit needs")
    sample = calibration[0]
    known = {i.name for i in model.graph.initializer}
    shapes: dict[str, list[int]] = {}
    for graph_input in model.graph.input:
        if graph_input.name in known:
            continue
        if graph_input.name not in sample:
            raise TargetError(f"RKNN compile: the calibration sample has no input "
                              f"{graph_input.name!r} (it has {sorted(sample)})")
        shapes[graph_input.name] = [int(d) for d in np.shape(sample[graph_input.name])]
        dims = graph_input.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") for d in dims):
            notes.append(f"input {graph_input.name} fixed to shape {shapes[graph_input.name]} "
                         "(the toolkit needs static shapes)")
            logger.info("rknn: %s", notes[-1])
    return shapes


def _scratch(workdir: Path) -> Path:
    """Where the toolkit drops its intermediate ``check*.onnx`` files (its working folder)."""
    folder = workdir / "toolkit"
    folder.mkdir(exist_ok=True)
    return folder


def _write_dataset(workdir: Path, names: list[str],
                   calibration: Sequence[Mapping[str, np.ndarray]]) -> str:
    """The toolkit's dataset file: one line a sample, its inputs' ``.npy`` files in order."""
    folder = workdir / "dataset"
    folder.mkdir(exist_ok=True)
    lines = []
    for i, sample in enumerate(calibration):
        files = []
        for k, name in enumerate(names):
            path = folder / f"{i}_{k}.npy"
            np.save(path, np.asarray(sample[name]))
            files.append(str(path))
        lines.append(" ".join(files))
    (workdir / "dataset.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(workdir / "dataset.txt")


class RknnToolchain:
    """RKNN-Toolkit2 2.5.0 in its own environment; ``settings``: ``target_platform``
    (default ``rk3588``), ``timeout_s`` (per worker call, default 1800) and
    ``quantized_dtype`` (``w8a8``, ``w8a16``, ...): when given, the toolkit quantizes a float
    model itself from the calibration samples instead of reading QDQ scales."""

    name = "rknn"

    def __init__(self, venv: Path | None = None) -> None:
        self._venv = venv
        self._open: tuple[Path, subprocess.Popen[str]] | None = None
        atexit.register(self.close)

    def missing(self) -> str | None:
        venv = self._venv or rknn_env.venv_dir()
        if rknn_env.ready(venv):
            return None
        return (f"RKNN-Toolkit2 environment not found at {venv}: create it with "
                f"`{rknn_env.INSTALL_COMMAND}` (pinned {rknn_env.TOOLKIT}, about 1.5 GB; "
                f"${rknn_env.VENV_ENV} moves it)")

    def _call(self, request: dict[str, Any], workdir: Path, timeout: float) -> tuple[dict[
            str, Any], str]:
        problem = self.missing()
        if problem is not None:
            raise TargetError(problem)
        command = request["command"]
        request = {**request, "result": str(workdir / f"rknn_{command}_result.json")}
        path = workdir / f"rknn_{command}.json"
        path.write_text(json.dumps(request), encoding="utf-8")
        Path(request["result"]).unlink(missing_ok=True)
        python = rknn_env.venv_python(self._venv)
        try:
            done = subprocess.run([str(python), str(_WORKER), str(path)], capture_output=True,
                                  text=True, errors="replace", timeout=timeout,
                                  cwd=_scratch(workdir))
        except subprocess.TimeoutExpired as e:
            raise TargetError(f"RKNN {command} of {request['model']}: no answer in {timeout:g} "
                              "s; raise settings timeout_s") from e
        log = _ANSI.sub("", done.stdout + done.stderr)
        (workdir / f"rknn_{command}.log").write_text(log, encoding="utf-8")
        result_file = Path(request["result"])
        if not result_file.is_file():
            raise ToolchainCrash(f"RKNN {command} of {request['model']}: RKNN-Toolkit2 "
                                 f"crashed (exit status {done.returncode}); its log: "
                                 f"{workdir / f'rknn_{command}.log'}",
                                 status=done.returncode, tail=log_tail(log))
        result: dict[str, Any] = json.loads(result_file.read_text(encoding="utf-8"))
        if not result.get("ok"):
            errors = [ln.strip() for ln in log.splitlines() if ln.startswith(("E ", "E RKNN"))]
            said = result.get("error") or (errors[-1] if errors else "no error message")
            raise TargetError(f"RKNN {command} of {request['model']}: {result['stage']} failed "
                              f"({said}); full log: {workdir / f'rknn_{command}.log'}")
        return result, log

    def compile(self, model: onnx.ModelProto, workdir: Path, *,
                calibration: Sequence[Mapping[str, np.ndarray]],
                settings: Mapping[str, Any]) -> Compiled:
        unknown = sorted(set(settings) - _SETTINGS)
        if unknown:
            raise TargetError(f"rknn settings: unknown key(s) {unknown}; valid: "
                              f"{sorted(_SETTINGS)}")
        # absolute: the worker runs in its own folder (a relative --out would point elsewhere)
        workdir = Path(workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        if self._open is not None and self._open[0] == workdir:
            self.close()  # its simulator runs the model this compile replaces
        notes: list[str] = []
        shapes = _static_shapes(model, calibration, notes)
        plain = plain_float(model)
        if len(plain.graph.node) != len(model.graph.node):
            notes.append("float16 emulation (Cast round trips, float16-stored weights) undone: "
                         "the toolkit runs float layers in FP16 itself")
        onnx.save(_for_toolkit(plain, notes), str(workdir / "model.onnx"))
        request: dict[str, Any] = {
            "command": "compile", "model": str(workdir / "model.onnx"), "inputs": list(shapes),
            "shapes": list(shapes.values()),
            "target_platform": str(settings.get("target_platform", "rk3588")),
            "artifact": str(workdir / "model.rknn"),
            "timeout_s": float(settings.get("timeout_s", 1800))}
        if settings.get("quantized_dtype"):
            request["quantized_dtype"] = str(settings["quantized_dtype"])
            request["dataset"] = _write_dataset(workdir, list(shapes), calibration)
        Path(request["artifact"]).unlink(missing_ok=True)  # never hand back an older build
        result, log = self._call(request, workdir, request["timeout_s"])
        layers = parse_layers(log)
        if not layers:
            raise TargetError(f"RKNN compile of {request['model']}: the build log has no "
                              f"layer table; log: {workdir / 'rknn_compile.log'}")
        (workdir / _REQUEST).write_text(json.dumps(request), encoding="utf-8")
        logger.info("rknn %s: %d layers, %d on the CPU", request["target_platform"],
                    len(layers), sum(la.target.startswith("CPU") for la in layers))
        placements = place(model, layers, log)
        cost = with_cpu_estimate(cost_of(layers, log), model, placements, self.name)
        return Compiled(toolchain=self.name, version=str(result.get("version", "")),
                        placements=placements, cost=cost,
                        artifact=Path(request["artifact"]), log=log, notes=tuple(notes),
                        settings=dict(settings), source=Path(request["model"]))

    def run(self, compiled: Compiled, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The simulator's outputs for ``inputs`` (stacked samples along axis 0, in multiples
        of the compiled batch), one array per model output. The simulator of the last model
        run stays open for the next call (one at a time), as a worker reading jobs on stdin."""
        if compiled.artifact is None or not (compiled.artifact.parent / _REQUEST).is_file():
            raise TargetError("RKNN run: this Compiled has no RKNN workdir; compile it first")
        workdir = compiled.artifact.parent.resolve()
        request = json.loads((workdir / _REQUEST).read_text(encoding="utf-8"))
        batch = int(request["shapes"][0][0]) if request["shapes"][0] else 1
        arrays: dict[str, np.ndarray] = {}
        for name, shape in zip(request["inputs"], request["shapes"], strict=True):
            if name not in inputs:
                raise TargetError(f"RKNN run: no input {name!r} given (got {sorted(inputs)})")
            array = np.ascontiguousarray(inputs[name])
            if list(array.shape[1:]) != shape[1:] or array.shape[0] % batch:
                raise TargetError(f"RKNN run: input {name!r} has shape {list(array.shape)}; "
                                  f"the model was compiled for {shape} (stack samples on "
                                  f"axis 0 in multiples of {batch})")
            arrays[name] = array
        worker = self._simulator(workdir, request)
        np.savez(workdir / "rknn_inputs.npz", **arrays)  # type: ignore[arg-type]
        job = {"data": str(workdir / "rknn_inputs.npz"), "inputs": request["inputs"],
               "batch": batch, "outputs": str(workdir / "rknn_outputs.npz"),
               "result": str(workdir / "rknn_job_result.json")}
        Path(job["result"]).unlink(missing_ok=True)
        assert worker.stdin is not None
        worker.stdin.write(json.dumps(job) + "\n")
        worker.stdin.flush()
        self._answer(worker, workdir, "done", request["timeout_s"])
        answer = json.loads(Path(job["result"]).read_text(encoding="utf-8"))
        if not answer.get("ok"):
            raise TargetError(f"RKNN run of {request['model']}: the simulator failed "
                              f"({answer.get('error', 'no error message')}); its log: "
                              f"{workdir / 'rknn_run.log'}")
        with np.load(job["outputs"], allow_pickle=False) as out:
            return [out[f"output_{k}"] for k in range(len(out.files))]

    def _simulator(self, workdir: Path, request: dict[str, Any]) -> subprocess.Popen[str]:
        """The open simulator for ``workdir``, started (built once) when it is not."""
        if self._open is not None and self._open[0] == workdir and self._open[1].poll() is None:
            return self._open[1]
        self.close()
        problem = self.missing()
        if problem is not None:
            raise TargetError(problem)
        serve = {**request, "command": "serve", "log": str(workdir / "rknn_run.log"),
                 "result": str(workdir / "rknn_serve_result.json")}
        path = workdir / "rknn_serve.json"
        path.write_text(json.dumps(serve), encoding="utf-8")
        Path(serve["result"]).unlink(missing_ok=True)
        worker = subprocess.Popen(
            [str(rknn_env.venv_python(self._venv)), str(_WORKER), str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=_scratch(workdir))
        self._open = (workdir, worker)
        try:
            self._answer(worker, workdir, "ready", float(request["timeout_s"]))
        except TargetError:
            result = Path(serve["result"])
            if result.is_file():
                said = json.loads(result.read_text(encoding="utf-8"))
                raise TargetError(f"RKNN run of {request['model']}: {said['stage']} failed "
                                  f"({said.get('error', 'no error message')}); its log: "
                                  f"{workdir / 'rknn_run.log'}") from None
            raise
        return worker

    def _answer(self, worker: subprocess.Popen[str], workdir: Path, want: str,
                timeout: float) -> None:
        """Wait for the worker's ``want`` line; a crash, an exit or a timeout is a
        TargetError (and the worker is gone)."""
        assert worker.stdout is not None
        ready, _, _ = select.select([worker.stdout], [], [], timeout)
        line = worker.stdout.readline().strip() if ready else ""
        if line == want:
            return
        self.close()
        status = worker.poll()
        log = workdir / "rknn_run.log"
        if not ready:
            raise TargetError(f"RKNN run in {workdir}: no answer in {timeout:g} s; raise "
                              f"settings timeout_s; its log: {log}")
        said = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        raise ToolchainCrash(f"RKNN run in {workdir}: RKNN-Toolkit2's simulator stopped (exit "
                             f"status {status}); its log: {log}", status=status,
                             tail=log_tail(_ANSI.sub("", said)))

    def close(self) -> None:
        """Stop the open simulator, if any (also done when the interpreter exits)."""
        if self._open is None:
            return
        _, worker = self._open
        self._open = None
        if worker.stdin is not None:
            worker.stdin.close()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        if worker.stdout is not None:
            worker.stdout.close()
