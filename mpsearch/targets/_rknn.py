"""Rockchip RKNN-Toolkit2 adapter: our QDQ ONNX -> ``.rknn``, layer placement, simulator numerics.

The toolkit runs in its own pinned environment (:mod:`mpsearch.targets.rknn_env`) behind a
subprocess running ``_rknn_worker.py``; requests and results are JSON, arrays NPZ. ``compile``
fixes the input shapes to the calibration sample's, lowers the opset to 19 (the toolkit's
limit) when needed, builds with the QDQ scales as they are (``do_quantization`` false: float
layers become FP16), exports the ``.rknn`` file and parses the verbose build's "Network Layer
Information Table" into placements (dtype, NPU or CPU) and cost (estimated cycles). ``run``
rebuilds the same model in the worker and runs the x86 simulator on the given inputs.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import version_converter

from mpsearch.targets import _rknn_env as rknn_env
from mpsearch.targets._base import Compiled, Placement, TargetError

__all__ = ["Layer", "RknnToolchain", "parse_layers", "place", "plain_float"]

logger = logging.getLogger(__name__)

MAX_OPSET = 19  # RKNN-Toolkit2 2.5.0 loads ONNX opset <= 19
_MAX_IR = 10    # onnx 1.18 reads IR <= 11; our onnx may write newer
_WORKER = Path(__file__).with_name("_rknn_worker.py")
_SETTINGS = frozenset({"target_platform", "timeout_s", "quantized_dtype"})
_PRECISION = {"INT8": "int8", "UINT8": "uint8", "INT16": "int16", "FLOAT16": "fp16",
              "FLOAT": "fp32", "FLOAT32": "fp32", "INT32": "int32", "INT4": "int4"}
_UNPLACED = frozenset({"QuantizeLinear", "DequantizeLinear", "Constant", "Identity"})
_ROW = re.compile(r"RKNN: \[[^\]]*\]\s+(\d+)\s+(\S+)\s+([A-Z0-9]+)\s+([A-Z]+\S*)\s+\S+\s+\S+\s+"
                  r"(\d+)/(\d+)/(\d+)\s+(\d+)\s+(\S.*?)\s*$")
_MEMORY = re.compile(r"Total (Internal|Weight) Memory Size: ([\d.]+)\s*([KMG]?B)")
_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


@dataclass(frozen=True, slots=True, kw_only=True)
class Layer:
    """One row of the toolkit's Network Layer Information Table."""

    index: int
    op: str           # the toolkit's layer type (fused names such as ConvRelu)
    dtype: str        # DataType column: INT8, FLOAT16, ...
    target: str       # Target column: NPU or CPU
    ddr_cycles: int
    npu_cycles: int
    cycles: int
    rw_kb: int
    name: str         # FullName after "OpType:", e.g. "/fc/Gemm#2"


def parse_layers(log: str) -> tuple[Layer, ...]:
    """The layers of the last "Network Layer Information Table" in a verbose build log."""
    start = log.rfind("Network Layer Information Table")
    if start < 0:
        return ()
    layers: list[Layer] = []
    for line in log[start:].splitlines()[1:]:
        match = _ROW.search(line)
        if match is None:
            if layers and "-----" in line:
                break
            continue
        idx, op, dtype, target, ddr, npu, total, rw, full = match.groups()
        name = full.split(":", 1)[1] if ":" in full else full
        layers.append(Layer(index=int(idx), op=op, dtype=dtype, target=target,
                            ddr_cycles=int(ddr), npu_cycles=int(npu), cycles=int(total),
                            rw_kb=int(rw), name=name.strip()))
    return tuple(layers)


def _base(name: str) -> str:
    """A layer's name without the toolkit's suffixes: ``#N...`` (a node split in layers) and
    ``_2conv``/``_2sl_2sp``/``_2sdpa``... (a node rewritten as another op)."""
    return re.sub(r"(#\d+.*|(_2[a-z]+\d*)+)$", "", name)


def _reason(layer: Layer, log: str) -> str:
    said = [line.split("]", 1)[-1].strip() for line in log.splitlines()
            if ("W RKNN" in line or "E RKNN" in line) and layer.name in line]
    if said:
        return "; ".join(dict.fromkeys(said))[:400]
    return f"RKNN-Toolkit2 placed this {layer.op} layer ({layer.dtype}) on the CPU"


def _placement(node: str, layer: Layer, log: str, how: str = "") -> Placement:
    cpu = layer.target.upper().startswith("CPU")
    reason = _reason(layer, log) if cpu else how
    return Placement(node=node, unit="cpu" if cpu else "accelerator",
                     precision=_PRECISION.get(layer.dtype, layer.dtype.lower()), reason=reason)


def _cast_to(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "to"), -1)


def _fp16_casts(graph: onnx.GraphProto) -> set[str]:
    """Cast nodes that emulate float16: to float16, back from a float16 Cast, or widening a
    float16-stored weight."""
    to16 = {n.output[0] for n in graph.node if n.op_type == "Cast"
            and _cast_to(n) == onnx.TensorProto.FLOAT16}
    to16 |= {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT16}
    return {n.name for n in graph.node if n.op_type == "Cast"
            and (n.output[0] in to16 or (n.input and n.input[0] in to16))}


def plain_float(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with our float16 emulation undone: float16-stored weights widened by a Cast
    become float32 initializers and float32 -> float16 -> float32 Cast pairs go. The toolkit
    runs every float layer in FP16 itself, and rejects float16 weights behind a Cast."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {i.name: i for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    rename: dict[str, str] = {}
    drop: set[int] = set()
    keep: list[onnx.NodeProto] = []
    for n in graph.node:
        if n.op_type != "Cast" or _cast_to(n) != onnx.TensorProto.FLOAT:
            continue
        source = inits.get(n.input[0])
        if source is not None and source.data_type == onnx.TensorProto.FLOAT16:
            wide = onnx.numpy_helper.from_array(
                onnx.numpy_helper.to_array(source).astype(np.float32), n.output[0])
            graph.initializer.append(wide)
            drop.add(id(n))
            continue
        half = next((m for m in graph.node if n.input[0] in m.output), None)
        if (half is not None and half.op_type == "Cast" and _cast_to(half) == onnx.TensorProto.
                FLOAT16 and all(c.op_type == "Cast" for c in consumers.get(half.output[0], []))):
            drop.add(id(n))
            if n.output[0] in outputs:
                keep.append(onnx.helper.make_node("Identity", [half.input[0]], [n.output[0]],
                                                  name=n.name))
            else:
                rename[n.output[0]] = half.input[0]
    nodes = [n for n in graph.node if id(n) not in drop] + keep
    for n in nodes:
        for k, name in enumerate(n.input):
            n.input[k] = rename.get(name, name)
    used = {name for n in nodes for name in n.input}
    dead = {id(n) for n in nodes if n.op_type == "Cast"
            and _cast_to(n) == onnx.TensorProto.FLOAT16 and not used & set(n.output)}
    del graph.node[:]
    graph.node.extend(n for n in nodes if id(n) not in dead)
    live = used | outputs
    kept = [i for i in graph.initializer if i.name in live]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return out


def place(model: onnx.ModelProto, layers: Sequence[Layer], log: str = "") -> tuple[Placement, ...]:
    """Each compute node of ``model`` (not Q/DQ, not a float16-emulating Cast) with the layer
    the toolkit built for it: by name, else by the first layer named after one of its output
    tensors; a node the toolkit fused away takes the placement of its nearest placed producer
    (else consumer), with the layer it was folded into as the reason."""
    graph = model.graph
    skip = _fp16_casts(graph) | {n.name for n in graph.node if n.op_type in _UNPLACED}
    real = [layer for layer in layers if layer.op not in ("InputOperator", "OutputOperator")]
    by_name: dict[str, Layer] = {}
    for layer in real:
        by_name.setdefault(_base(layer.name), layer)
    found: dict[str, tuple[Layer, str]] = {}
    for node in graph.node:
        if node.name in skip:
            continue
        if node.name in by_name:
            found[node.name] = (by_name[node.name], "")
            continue
        for out in node.output:
            hit = next((la for la in real if out and la.name.startswith(out)), None)
            if hit is not None:
                found[node.name] = (hit, f"rewritten by the toolkit as layer {hit.name}")
                break
    producer = {out: n for n in graph.node for out in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)

    def nearest(node: onnx.NodeProto) -> tuple[Layer, str] | None:
        seen, frontier = {node.name}, [node]
        for walk in ("up", "down"):
            seen, frontier = {node.name}, [node]
            while frontier:
                nxt: list[onnx.NodeProto] = []
                for n in frontier:
                    near = ([producer[i] for i in n.input if i in producer] if walk == "up"
                            else [c for o in n.output for c in consumers.get(o, [])])
                    for m in near:
                        if m.name in found:
                            return found[m.name]
                        if m.name not in seen:
                            seen.add(m.name)
                            nxt.append(m)
                frontier = nxt
        return None

    placements: list[Placement] = []
    for node in graph.node:
        if node.name in skip:
            continue
        entry = found.get(node.name)
        if entry is None:
            near = nearest(node)
            if near is None:
                raise TargetError(f"RKNN build of {graph.name or 'the model'}: node "
                                  f"{node.name!r} matches no layer of the toolkit's table")
            entry = (near[0], f"fused by the toolkit into layer {near[0].name}")
        placements.append(_placement(node.name, entry[0], log, entry[1]))
    return tuple(placements)


def cost_of(layers: Sequence[Layer], log: str) -> dict[str, float]:
    """The toolkit's own figures: estimated cycles (sum over layers), DDR/NPU cycles,
    layer counts per unit and the memory sizes it reports."""
    cost: dict[str, float] = {
        "cycles": float(sum(la.cycles for la in layers)),
        "ddr_cycles": float(sum(la.ddr_cycles for la in layers)),
        "npu_cycles": float(sum(la.npu_cycles for la in layers)),
        "rw_kb": float(sum(la.rw_kb for la in layers)),
        "npu_layers": float(sum(la.target.startswith("NPU") for la in layers)),
        "cpu_layers": float(sum(la.target.startswith("CPU") and la.op not in
                                ("InputOperator", "OutputOperator") for la in layers)),
    }
    for kind, value, unit in _MEMORY.findall(log):
        cost[f"{kind.lower()}_memory_bytes"] = float(value) * _UNITS[unit]
    return cost


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REQUEST = "rknn_request.json"


def _for_toolkit(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` at opset <= 19 and an IR version onnx 1.18 reads."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset > MAX_OPSET:
        try:
            model = version_converter.convert_version(model, MAX_OPSET)
        except Exception as e:  # the converter raises bare RuntimeErrors
            raise TargetError(f"RKNN-Toolkit2 loads ONNX opset <= {MAX_OPSET}; this model is "
                              f"opset {opset} and onnx's converter failed ({e}); export it "
                              f"at opset <= {MAX_OPSET}") from e
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.ir_version = min(out.ir_version, _MAX_IR)
    return out


def _static_shapes(model: onnx.ModelProto,
                   calibration: Sequence[Mapping[str, np.ndarray]]) -> dict[str, list[int]]:
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
    return shapes


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
                                  text=True, errors="replace", timeout=timeout, cwd=workdir)
        except subprocess.TimeoutExpired as e:
            raise TargetError(f"RKNN {command} of {request['model']}: no answer in {timeout:g} "
                              "s; raise settings timeout_s") from e
        log = _ANSI.sub("", done.stdout + done.stderr)
        (workdir / f"rknn_{command}.log").write_text(log, encoding="utf-8")
        result_file = Path(request["result"])
        if not result_file.is_file():
            raise TargetError(f"RKNN {command} of {request['model']}: RKNN-Toolkit2 crashed "
                              f"(exit status {done.returncode}); its log: "
                              f"{workdir / f'rknn_{command}.log'}")
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
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        shapes = _static_shapes(model, calibration)
        onnx.save(_for_toolkit(plain_float(model)), str(workdir / "model.onnx"))
        request: dict[str, Any] = {
            "command": "compile", "model": str(workdir / "model.onnx"), "inputs": list(shapes),
            "shapes": list(shapes.values()),
            "target_platform": str(settings.get("target_platform", "rk3588")),
            "artifact": str(workdir / "model.rknn"),
            "timeout_s": float(settings.get("timeout_s", 1800))}
        if settings.get("quantized_dtype"):
            request["quantized_dtype"] = str(settings["quantized_dtype"])
            request["dataset"] = _write_dataset(workdir, list(shapes), calibration)
        result, log = self._call(request, workdir, request["timeout_s"])
        layers = parse_layers(log)
        if not layers:
            raise TargetError(f"RKNN compile of {request['model']}: the build log has no "
                              f"layer table; log: {workdir / 'rknn_compile.log'}")
        (workdir / _REQUEST).write_text(json.dumps(request), encoding="utf-8")
        return Compiled(toolchain=self.name, version=str(result.get("version", "")),
                        placements=place(model, layers, log), cost=cost_of(layers, log),
                        artifact=Path(request["artifact"]), log=log)

    def run(self, compiled: Compiled, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The simulator's outputs for ``inputs`` (stacked samples along axis 0, in multiples
        of the compiled batch), one array per model output."""
        if compiled.artifact is None or not (compiled.artifact.parent / _REQUEST).is_file():
            raise TargetError("RKNN run: this Compiled has no RKNN workdir; compile it first")
        workdir = compiled.artifact.parent
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
        np.savez(workdir / "rknn_inputs.npz", **arrays)  # type: ignore[arg-type]
        request.update(command="run", data=str(workdir / "rknn_inputs.npz"), batch=batch,
                       outputs=str(workdir / "rknn_outputs.npz"))
        self._call(request, workdir, request["timeout_s"])
        with np.load(workdir / "rknn_outputs.npz", allow_pickle=False) as out:
            return [out[f"output_{k}"] for k in range(len(out.files))]
