"""Qualcomm HTP through ``onnxruntime-qnn`` (the QNN execution provider and its x86 HTP
emulator): placement with each refused node's reason, emulated numerics, per-op cycle counts
and the deployable context binary.

Consumes our QDQ model; compiles it once in a work directory with CPU fallback allowed and
ONNX Runtime's verbose log captured (it names every node the QNN EP refused, and why, and the
final node placement), writing the EP context model (``model_ctx.onnx`` + its
``*_qnn.bin`` context binary): that file is the artifact, and :meth:`QnnToolchain.run` runs
it, so the numerics measured are those of what would be deployed. Cycles come from the
backend's ``profiling_level=detailed`` CSV (median over a few runs of one sample: the
emulator's counts vary by some per cent from run to run). The emulator builds for the SoC of
the profile's ``soc_model``, else for the reference SoC of its ``htp_arch``.
"""

from __future__ import annotations

import csv
import importlib.util
import logging
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from mpsearch._names import Namer
from mpsearch.errors import MpsearchError, TargetError
from mpsearch.profiles import toolchain_setting_problem
from mpsearch.runtime import Session, create_plugin_session, ort_version
from mpsearch.targets._base import ACCELERATOR, CPU, Compiled, Placement
from mpsearch.targets._cpu_cost import with_cpu_estimate
from mpsearch.targets._gelu import find_gelu
from mpsearch.targets._static import fix_shapes

__all__ = ["SETTINGS", "QnnToolchain"]

logger = logging.getLogger(__name__)

EP = "QNNExecutionProvider"
#: Profile settings this adapter reads (provider options of the QNN EP).
SETTINGS = ("htp_arch", "soc_model", "offload_graph_io_quantization")
_INSTALL = "pip install 'mpsearch[qnn]' (onnxruntime-qnn 2.7.0, onnxruntime >= 1.24.2)"
_MIN_ORT = (1, 24, 2)
_QDQ = ("QuantizeLinear", "DequantizeLinear")
_PROFILE_RUNS = 5
#: The reference SoC (QNN ``soc_model`` number, its name) of each HTP architecture, used when
#: a profile gives ``htp_arch`` alone: with the EP's default soc_model 0 (unknown SoC) the x86
#: emulator fails to finalize graphs a SoC's build takes (QNN_COMMON_ERROR_MEM_ALLOC; e.g. a
#: float depthwise Conv with stride (2, 1), float ops on 5-D tensors). Numbers from ExecuTorch's
#: Qualcomm backend (backends/qualcomm/serialization/qc_schema.py).
_REFERENCE_SOC = {68: (30, "SM8350"), 69: (36, "SM8450"), 73: (43, "SM8550"),
                 75: (57, "SM8650"), 79: (69, "SM8750"), 81: (87, "SM8850")}

_STAMP = re.compile(r"^\S*\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \[")
_FAILED = re.compile(r"Validation FAILED for \d+ nodes in OrtNodeUnit")
_NODE = re.compile(r"Operator type: (\S+) Node name: (.*?) Node index: \d+")
_REASON = re.compile(r"REASON : (.*)")
_PLACED = re.compile(r"(?:Node\(s\)|All nodes) placed on \[(\w+)\]")
_PLACED_NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s+(\S+) \((.*)\)\s*$")
_VERSION = re.compile(r"Found valid interface, version: (\S+)")
_CYCLE_NODE = re.compile(r"^(.*?)(?:_token_\d+)?:OpId_\d+ \(cycles\)$")


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


class QnnToolchain:
    """The QNN HTP adapter (:class:`~mpsearch.targets.Toolchain`)."""

    name = "qnn"

    def __init__(self) -> None:
        self._sessions: dict[Path, Session] = {}

    def missing(self) -> str | None:
        if importlib.util.find_spec("onnxruntime_qnn") is None:
            return f"onnxruntime-qnn is not installed: {_INSTALL}"
        if _version_tuple(ort_version()) < _MIN_ORT:
            return f"onnxruntime {ort_version()} is too old for onnxruntime-qnn: {_INSTALL}"
        return None

    def _library(self) -> tuple[str, str]:
        why = self.missing()
        if why is not None:
            raise TargetError(why)
        import onnxruntime_qnn

        return str(onnxruntime_qnn.get_library_path()), str(onnxruntime_qnn.__version__)

    def version(self) -> str:
        """``onnxruntime-qnn X`` (the QNN SDK's version shows in :attr:`Compiled.version`)."""
        return f"onnxruntime-qnn {self._library()[1]}, onnxruntime {ort_version()}"

    @staticmethod
    def provider_options(settings: Mapping[str, Any]) -> dict[str, str]:
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise TargetError(f"qnn: unknown setting(s) {unknown}; known: {list(SETTINGS)}")
        problem = toolchain_setting_problem("qnn", settings)
        if problem is not None:  # another chip's numbers, or none at all
            raise TargetError(f"qnn: {problem}")
        # the graph input's Q and output's DQ on the HTP too (the EP's default leaves them on
        # the CPU): "fully on the accelerator" then means every node
        options = {"backend_type": "htp", "offload_graph_io_quantization": "0"}
        options.update({k: str(v) for k, v in settings.items() if v is not None})
        soc = _reference_soc(settings)
        if soc is not None:
            options["soc_model"] = str(soc[0])
        return options

    def compile(self, model: onnx.ModelProto, workdir: Path, *,
                calibration: Sequence[Mapping[str, np.ndarray]],
                settings: Mapping[str, Any]) -> Compiled:
        """Fix dynamic shapes to ``calibration[0]``'s, place, write the context binary and
        profile it on that sample."""
        library, version = self._library()
        if not calibration:
            raise TargetError("qnn: no input sample to fix the model's shapes with")
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        static, notes = fix_shapes(model, calibration[0])
        static, fused = fuse_gelu(static)
        if fused:
            notes += (f"{fused} GELU erf pattern(s) fused into one Gelu each, as ONNX Runtime's "
                      "QNN preprocessing does (the HTP has no Erf)",)
        soc = _reference_soc(settings)
        if soc is not None:
            notes += (f"soc_model {soc[0]} ({soc[1]}), the reference SoC of htp_arch "
                      f"{settings['htp_arch']}: without a SoC the emulator fails to finalize "
                      "some graphs",)
        source = workdir / "model.onnx"
        onnx.save(static, str(source))
        artifact = workdir / "model_ctx.onnx"
        for old in (artifact, *workdir.glob("model_ctx*.bin")):  # the EP will not overwrite
            old.unlink(missing_ok=True)
        self._sessions.clear()  # a file of this work directory is about to change
        options = self.provider_options(settings)
        config = {"ep.context_enable": "1", "ep.context_file_path": str(artifact),
                  "ep.context_embed_mode": "0"}
        try:
            _, log = create_plugin_session(source, ep_name=EP, library=library,
                                           provider_options=options, config=config,
                                           capture_log=True, label=str(source))
        except MpsearchError as e:
            raise TargetError(f"qnn: {e}") from e
        refused, cpu_nodes, lines = _parse_log(log)
        backend = _VERSION.search(log)
        full = f"onnxruntime-qnn {version}" + (f", QNN {backend.group(1)}" if backend else "")
        cycles, per_node = self._profile(artifact, workdir, library, options, calibration[0])
        placements = _placements(static, refused, cpu_nodes, per_node)
        if cycles is None and placements and all(p.unit != ACCELERATOR for p in placements):
            cycles = 0.0  # no HTP graph at all: nothing on the accelerator to profile
        cost = (with_cpu_estimate({"cycles": cycles}, static, placements, self.name)
                if cycles is not None else {})
        binaries = list(workdir.glob("model_ctx*.bin"))
        if binaries:
            cost["context_bytes"] = float(sum(b.stat().st_size for b in binaries))
        return Compiled(toolchain=self.name, version=full, placements=placements, cost=cost,
                        artifact=artifact if artifact.is_file() else None,
                        log="\n".join(lines[-200:]), notes=notes, settings=dict(settings),
                        source=source)

    def _profile(self, artifact: Path, workdir: Path, library: str, options: Mapping[str, str],
                 sample: Mapping[str, np.ndarray]) -> tuple[float | None, dict[str, float]]:
        """Median accelerator cycles of ``_PROFILE_RUNS`` runs of ``sample``, and per node."""
        if not artifact.is_file():
            return None, {}
        path = workdir / "profile.csv"
        path.unlink(missing_ok=True)
        profiled = {**options, "profiling_level": "detailed", "profiling_file_path": str(path)}
        try:
            session, _ = create_plugin_session(artifact, ep_name=EP, library=library,
                                               provider_options=profiled)
            for _ in range(_PROFILE_RUNS):
                session.run(sample)
        except MpsearchError as e:  # e.g. QNN_GRAPH_ERROR_SET_PROFILE on some graphs
            logger.warning("qnn: no cycle counts for %s (%s)", artifact, e)
            return None, {}
        del session  # the CSV is complete once the session is released
        return _read_cycles(path)

    def run(self, compiled: Compiled, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        # the context model; without one (the EP took no node) the model as given, whose
        # every node then runs on ONNX Runtime's CPU EP
        path = compiled.artifact or compiled.source
        if path is None:
            raise TargetError("qnn: the compiled model has neither a context binary nor a "
                              "source model to run")
        session = self._sessions.get(path)
        if session is None:
            library, _ = self._library()
            session, _ = create_plugin_session(
                path, ep_name=EP, library=library,
                provider_options=self.provider_options(compiled.settings))
            self._sessions = {path: session}  # one open context at a time
        outputs = session.run(inputs)
        return [outputs[name] for name in session.output_names]


def fuse_gelu(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with each GELU erf pattern (:mod:`._gelu`) as one ``com.microsoft`` Gelu node
    from ``x`` to the last Mul's output, and how many were fused. The HTP has no Erf, and its
    8-bit Mul by the pattern's constant 0.5 computes a different result from the CPU's; as one
    Gelu the pattern runs on the HTP in the precision of the Q/DQ around it."""
    scalars = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
               if int(np.prod(t.dims)) == 1}
    gelus = find_gelu(model, scalars)
    if not gelus:
        return model, 0
    dropped = {name for g in gelus for name in (*g.nodes, *g.skipped)}
    first = {g.nodes[0]: g for g in gelus}
    namer = Namer.of_model(model)
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    del fused.graph.node[:]
    for node in model.graph.node:
        gelu = first.get(node.name)
        if gelu is not None:
            fused.graph.node.append(onnx.helper.make_node(
                "Gelu", [gelu.x], [gelu.output], name=namer.fresh(f"{node.name}/gelu"),
                domain="com.microsoft"))
        elif node.name not in dropped:
            fused.graph.node.append(node)
    if not any(o.domain == "com.microsoft" for o in fused.opset_import):
        fused.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return fused, len(gelus)


def _reference_soc(settings: Mapping[str, Any]) -> tuple[int, str] | None:
    """(soc_model, name) to use for ``settings`` that name an ``htp_arch`` of
    :data:`_REFERENCE_SOC` but no ``soc_model``, else None."""
    if settings.get("soc_model") is not None:
        return None
    try:
        arch = int(settings.get("htp_arch") or 0)
    except (TypeError, ValueError):
        return None
    return _REFERENCE_SOC.get(arch)


def _parse_log(log: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(refused node -> the QNN EP's reason, CPU-placed node -> op type, the relevant lines)."""
    entries: list[str] = []
    for line in log.splitlines():
        if _STAMP.match(line) or not entries:
            entries.append(line)
        else:
            entries[-1] += "\n" + line
    refused: dict[str, str] = {}
    cpu: dict[str, str] = {}
    relevant: list[str] = []
    provider = ""
    for entry in entries:
        if _FAILED.search(entry):
            reason = _REASON.search(entry)
            for _, node in _NODE.findall(entry):
                refused[node] = reason.group(1).strip() if reason else entry.splitlines()[0]
            relevant.append(entry)
        elif (placed := _PLACED.search(entry)) is not None:
            provider = placed.group(1)
            relevant.append(entry)
        elif (node_line := _PLACED_NODE.search(entry)) is not None:
            if provider == "CPUExecutionProvider":
                cpu[node_line.group(2)] = node_line.group(1)
            relevant.append(entry)
    return refused, cpu, relevant


def _read_cycles(path: Path) -> tuple[float | None, dict[str, float]]:
    if not path.is_file():
        return None, {}
    totals: list[float] = []
    nodes: dict[str, list[float]] = {}
    with path.open(newline="") as file:
        for row in csv.DictReader(file):
            if row.get("Unit of Measurement") != "CYCLES":
                continue
            what, value = row.get("Event Identifier", ""), float(row.get("Time") or 0)
            if what == "Accelerator (execute) time (cycles)":
                totals.append(value)
            elif (match := _CYCLE_NODE.match(what)) is not None:
                nodes.setdefault(match.group(1), []).append(value)
    if not totals:
        return None, {}
    return (float(statistics.median(totals)),
            {k: float(statistics.median(v)) for k, v in nodes.items()})


#: Ops that move data without arithmetic: ONNX Runtime's QDQ propagation carries the grid of
#: their input through them, so the HTP runs them on that integer type.
_MOVES = frozenset({"Reshape", "Transpose", "Split", "Flatten", "Squeeze", "Unsqueeze", "Slice",
                    "Gather", "Identity", "MaxPool", "DepthToSpace", "SpaceToDepth", "Expand",
                    "Tile", "Pad", "Resize"})


def _precisions(model: onnx.ModelProto) -> dict[str, str]:
    """Node -> what it computes in: the widest integer its activation inputs are dequantized
    from (``int8`` / ``int16``; through data-movement ops too), else ``float``. Q/DQ nodes:
    their integer type. The QNN EP's log does not state precisions; this reads the QDQ
    model the EP is given, which is what the HTP runs."""
    types = {i.name: i.data_type for i in model.graph.initializer}
    carried: dict[str, int] = {}  # tensor -> integer bits of the grid it is on
    out: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type in _QDQ:
            zero = node.input[2] if len(node.input) > 2 else ""
            bits = _INT_BITS.get(types.get(zero, onnx.TensorProto.UINT8), 8)
            out[node.name] = f"int{bits}"
            if node.op_type == "DequantizeLinear" and node.input[0] not in types and bits <= 16:
                carried[node.output[0]] = bits
            continue
        bits = max((carried.get(t, 0) for t in node.input), default=0)
        out[node.name] = f"int{bits}" if bits else "float"
        if bits and node.op_type in _MOVES:
            carried.update((t, bits) for t in node.output)
    return out


_INT_BITS = {onnx.TensorProto.INT8: 8, onnx.TensorProto.UINT8: 8, onnx.TensorProto.INT16: 16,
             onnx.TensorProto.UINT16: 16, onnx.TensorProto.INT32: 32}
_INT_NAME = {k: f"int{v}" for k, v in _INT_BITS.items()}


def _placements(model: onnx.ModelProto, refused: Mapping[str, str],
                cpu: Mapping[str, str], cycles: Mapping[str, float]) -> tuple[Placement, ...]:
    """One placement per compute node (Q/DQ nodes only when they fall back to the CPU). A
    float node is ``fp16`` on the HTP (it runs float ops in half precision) and ``fp32`` on
    the CPU."""
    precisions = _precisions(model)
    out: list[Placement] = []
    for node in model.graph.node:
        on_cpu = node.name in cpu or node.name in refused
        if node.op_type in _QDQ and not on_cpu:
            continue
        unit = CPU if on_cpu else ACCELERATOR
        reason = refused.get(node.name, "placed on ONNX Runtime's CPU EP (not in a QNN "
                             "partition)" if on_cpu else "")
        precision = precisions[node.name]
        if precision == "float":
            precision = "fp32" if on_cpu else "fp16"
        out.append(Placement(node=node.name, unit=unit, reason=reason, precision=precision,
                             cycles=cycles.get(node.name)))
    names = {n.name for n in model.graph.node}
    for name, op_type in cpu.items():  # nodes ONNX Runtime made (fused or renamed)
        if name not in names:
            out.append(Placement(node=name, unit=CPU, precision="fp32",
                                 reason=refused.get(name, f"{op_type} placed on ONNX Runtime's "
                                                    "CPU EP (a node ONNX Runtime made)")))
    return tuple(out)
