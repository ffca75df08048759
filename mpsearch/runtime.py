"""ONNX Runtime sessions: the only module that imports onnxruntime.

Consumes an ONNX model (``ModelProto``, serialized bytes or a path); produces a :class:`Session`
that runs input dicts, optionally exposing intermediate tensors as extra outputs, on the CPU with
a fixed thread count.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from mpsearch.clock import ROUNDS, time_runs
from mpsearch.errors import DataError, ModelError

__all__ = ["Session", "SharedWeights", "create_plugin_session", "create_session", "ort_version",
           "with_outputs"]

logger = logging.getLogger(__name__)

ort.set_default_logger_severity(3)

#: Session option: draw memory from the allocators registered with ONNX Runtime's environment.
_USE_ENV_ALLOCATORS = "session.use_env_allocators"
_ALLOW_SPINNING = "session.intra_op.allow_spinning"
#: Session option: no QDQ fusion, so Q and DQ nodes run as written around float operators.
_DISABLE_QDQ_FUSION = "session.disable_quant_qdq"
_pool_lock = threading.Lock()
_pool_ready = False


def _memory_pool() -> None:
    """Register one CPU arena with ONNX Runtime's environment, once per process.

    Each session otherwise gets an arena of its own, freed with it: a new session's first run
    then page-faults in every activation buffer and is slower than its next ones. Sessions opened
    with ``pooled=True`` share this arena, whose memory earlier sessions already touched. It
    keeps what it grew to (the largest pooled run's activations) until the process ends, so it
    grows only by what a request lacks (not ORT's default doubling), and pooled sessions place
    each tensor on its own (:data:`_POOLED_PATTERN`): one block per run for the whole memory
    pattern fits no hole the weights of the sessions alive leave, and grew the arena by
    doublings from configuration to configuration."""
    global _pool_ready
    with _pool_lock:
        if _pool_ready:
            return
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                 ort.OrtMemType.DEFAULT)
        # no size limit; extend by the request (kSameAsRequested = 1); ORT's default first
        # chunk and dead-bytes limit
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, 1, -1, -1))
        _pool_ready = True


#: Whether pooled sessions plan a run's memory as one block (ORT's memory pattern).
_POOLED_PATTERN = False


def ort_version() -> str:
    return str(ort.__version__)


def with_outputs(model: onnx.ModelProto, tensors: Sequence[str]) -> onnx.ModelProto:
    """Copy of ``model`` whose graph also outputs ``tensors`` (intermediate activations)."""
    existing = {o.name for o in model.graph.output}
    wanted = [t for t in dict.fromkeys(tensors) if t not in existing]
    if not wanted:
        return model
    types = {v.name: v.type.tensor_type.elem_type
             for v in (*model.graph.value_info, *model.graph.input)}
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    for name in wanted:
        elem = types.get(name, onnx.TensorProto.FLOAT)
        exposed.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
    return exposed


#: ORT's session option naming the folder of external data when a model is loaded from bytes.
_EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"
#: The file of :class:`SharedWeights` in its folder.
_WEIGHTS_FILE = "weights.bin"


class SharedWeights:
    """The large float initializers of a reference model, written once to a private folder, so
    that sessions of models carrying them unchanged (same name, same bytes: a configuration
    leaves most weights float) read them as external data instead of serializing and parsing
    them again: on a weight-heavy model that serialization is most of a small configuration's
    session time. The outputs are bit-identical, since the bytes are.

    Only tensors stored as ``raw_data`` of at least ``min_bytes`` are shared; the folder is
    removed with this object. :attr:`stand_ins` maps each shared tensor's name to its
    external-data reference, which a build can emit in its place
    (:meth:`mpsearch.quantize.Quantizer.build`), skipping the copy and the comparison too."""

    def __init__(self, model: onnx.ModelProto, *, min_bytes: int = 1 << 16) -> None:
        self.folder = tempfile.mkdtemp(prefix="mpsearch-weights-")
        # removed when this object is collected, or at exit (no ResourceWarning: the removal
        # is the intended lifetime, not a leak)
        weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)
        self._shared: dict[str, bytes] = {}
        self.stand_ins: dict[str, onnx.TensorProto] = {}
        offset = 0
        with open(os.path.join(self.folder, _WEIGHTS_FILE), "wb") as file:
            for tensor in model.graph.initializer:
                data = tensor.raw_data
                if (tensor.data_location == onnx.TensorProto.EXTERNAL
                        or len(data) < min_bytes):
                    continue
                pad = -offset % 4096  # page-aligned, as ORT may map the file
                file.write(b"\0" * pad + data)
                offset += pad
                self._shared[tensor.name] = data
                self.stand_ins[tensor.name] = _reference(tensor, offset)
                offset += len(data)
        self.bytes = sum(len(data) for data in self._shared.values())

    def externalize(self, model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
        """A copy of ``model`` whose initializers equal to shared ones point at the shared file
        (their bytes are not copied), and how many initializers do (stand-ins included)."""
        out = onnx.ModelProto()
        _copy_fields(model, out, skip="graph")
        graph = out.graph
        _copy_fields(model.graph, graph, skip="initializer")
        count = 0
        for tensor in model.graph.initializer:
            stand_in = self.stand_ins.get(tensor.name)
            if stand_in is not None and self._holds(tensor, stand_in):
                graph.initializer.append(stand_in)
                count += 1
            else:
                graph.initializer.append(tensor)
        return out, count

    def _holds(self, tensor: onnx.TensorProto, stand_in: onnx.TensorProto) -> bool:
        """True when the shared file holds ``tensor``'s data (it is the stand-in, or its bytes
        are the shared ones)."""
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            return tensor == stand_in
        return tensor.raw_data == self._shared[tensor.name]


def _reference(tensor: onnx.TensorProto, offset: int) -> onnx.TensorProto:
    """A header of ``tensor`` whose data are the bytes at ``offset`` of the shared file."""
    stub = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims,
                            data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", _WEIGHTS_FILE), ("offset", str(offset)),
                       ("length", str(len(tensor.raw_data)))):
        entry = stub.external_data.add()
        entry.key, entry.value = key, value
    return stub


def _copy_fields(source: Any, target: Any, *, skip: str) -> None:
    """Copy every set field of protobuf message ``source`` into ``target`` but ``skip``."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        repeated = getattr(field, "is_repeated", None)  # protobuf >= 5.28; older: label
        if repeated if repeated is not None else field.label == field.LABEL_REPEATED:
            getattr(target, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


class Session:
    """A CPU ONNX Runtime session with named inputs and outputs."""

    def __init__(self, session: ort.InferenceSession, label: str) -> None:
        self._session = session
        self.label = label
        self.input_names: tuple[str, ...] = tuple(i.name for i in session.get_inputs())
        self.output_names: tuple[str, ...] = tuple(o.name for o in session.get_outputs())
        self.input_types: Mapping[str, str] = {i.name: i.type for i in session.get_inputs()}
        self.fixed_batch = _fixed_batch(session)

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run one batch; returns the requested outputs (all by default) by name.

        A model whose batch is fixed (every input's first dimension is the same number ``k``,
        as many exports write 1) runs any batch size: ``k`` samples at a time, the last chunk
        padded by repeating its final sample, the outputs concatenated and trimmed."""
        names = list(outputs) if outputs is not None else list(self.output_names)
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise DataError(f"{self.label}: no data for model input(s) {missing}; "
                            f"the data provides {sorted(feeds)}")
        if not names:  # ONNX Runtime would read an empty list as "every output"
            return {}
        feeds = {n: feeds[n] for n in self.input_names}
        count = len(next(iter(feeds.values()))) if feeds else 0
        k = self.fixed_batch
        if k is None or count == k:
            return dict(zip(names, self._run(names, feeds), strict=True))
        parts: list[list[np.ndarray]] = []
        for start in range(0, count, k):
            chunk = {n: _pad(v[start:start + k], k) for n, v in feeds.items()}
            values = self._run(names, chunk)
            for name, value in zip(names, values, strict=True):
                if value.ndim == 0 or value.shape[0] != k:
                    raise DataError(
                        f"{self.label}: the model's batch is fixed to {k} but output '{name}' "
                        f"has shape {list(value.shape)}, not batch-first; run it with batches "
                        f"of {k} samples")
            parts.append(values)
        return {name: np.concatenate([p[i] for p in parts])[:count]
                for i, name in enumerate(names)}

    def _run(self, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[Any]:
        try:
            return list(self._session.run(list(names), dict(feeds)))
        except Exception as e:
            raise DataError(f"{self.label}: ONNX Runtime could not run the batch "
                            f"({_first_line(e)}); check the data shapes and dtypes") from e

    def run_all(
        self, batches: Iterable[Mapping[str, np.ndarray]], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run every batch and concatenate each output along the batch axis."""
        collected: dict[str, list[np.ndarray]] = {}
        for feeds in batches:
            for name, value in self.run(feeds, outputs).items():
                collected.setdefault(name, []).append(value)
        return {name: np.concatenate(parts, axis=0) for name, parts in collected.items()}

    def time_batch(self, feeds: Mapping[str, np.ndarray], repeat: int = ROUNDS) -> float:
        """Median seconds for one run of ``feeds`` over ``repeat`` runs after a warm-up
        (:mod:`mpsearch.clock`)."""
        return time_runs([self.run], feeds, rounds=repeat)[0].seconds


def create_session(
    model: onnx.ModelProto | bytes | str | os.PathLike[str],
    *,
    threads: int = 2,
    extra_outputs: Sequence[str] = (),
    optimize: bool = True,
    label: str | None = None,
    shared: SharedWeights | None = None,
    pooled: bool = False,
    arena: bool = True,
    fused_int8: bool = True,
) -> Session:
    """Open a CPU session. ``extra_outputs`` exposes intermediate tensors as outputs;
    ``shared``: a ``ModelProto``'s initializers equal to those are read from its file;
    ``pooled``: memory from the process's one pool (:func:`_memory_pool`), for the many
    short-lived sessions of measurements (not for calibration's, whose peak it would keep);
    ``arena`` False: no CPU memory arena, so a session whose few runs move large exposed
    activations (calibration's) returns their memory after each run instead of keeping it;
    ``fused_int8`` False: a QDQ model runs as written (DQ -> float op -> Q, its weights' DQ still
    folded), the exact arithmetic of an integer target, for a host whose fused int8 kernels
    saturate (:func:`mpsearch.profiles.runs_fused_int8`).

    The intra-op threads never spin: mpsearch keeps many sessions open at once and runs them
    in turn, and a spinning pool of one steals the cores of the next, so that identical sessions
    timed in turn differed several-fold (``benchmarks/bench_clock.py``)."""
    if extra_outputs:
        proto = model if isinstance(model, onnx.ModelProto) else _load(model)
        model = with_outputs(proto, extra_outputs)
    external = 0
    if shared is not None and isinstance(model, onnx.ModelProto):
        model, external = shared.externalize(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry(_ALLOW_SPINNING, "0")
    if not fused_int8:
        options.add_session_config_entry(_DISABLE_QDQ_FUSION, "1")
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    if shared is not None and external:
        options.add_session_config_entry(_EXTERNAL_FOLDER, shared.folder)
    options.enable_cpu_mem_arena = arena
    if pooled:
        _memory_pool()
        options.add_session_config_entry(_USE_ENV_ALLOCATORS, "1")
        options.enable_mem_pattern = _POOLED_PATTERN
    source: Any
    if isinstance(model, onnx.ModelProto):
        source = model.SerializeToString()
        name = label or (model.graph.name or "<model>")
    elif isinstance(model, bytes):
        source, name = model, label or "<model>"
    else:
        source = name = os.fspath(model)
    try:
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise ModelError(f"{name}: ONNX Runtime cannot load the model ({_first_line(e)}); "
                         "check it with onnx.checker or re-export it") from e
    return Session(session, name)


_plugins: set[str] = set()


def create_plugin_session(
    model: str | os.PathLike[str], *, ep_name: str, library: str,
    provider_options: Mapping[str, str], config: Mapping[str, str] = {},
    capture_log: bool = False, label: str | None = None,
) -> tuple[Session, str]:
    """Open a session of ``model`` (a file: an EP context model names its binary relative to
    it) on the plugin execution provider ``ep_name`` (its shared ``library``, registered once
    per process), with ONNX Runtime's CPU EP for what the plugin does not take.

    ``config``: session config entries (``session.disable_cpu_ep_fallback``,
    ``ep.context_enable``, ...). With ``capture_log`` the session is created at verbose log
    severity and ONNX Runtime's native log (written to the process's stderr, so the capture
    is process-wide while it lasts) is returned: it names each node the plugin refused and
    why. Returns the session and that log ('' without ``capture_log``)."""
    name = label or os.fspath(model)
    try:
        if ep_name not in _plugins:
            ort.register_execution_provider_library(ep_name, library)
            _plugins.add(ep_name)
        devices = [d for d in ort.get_ep_devices() if d.ep_name == ep_name]
    except Exception as e:
        raise ModelError(f"{library}: ONNX Runtime {ort.__version__} cannot load the execution "
                         f"provider {ep_name} ({_first_line(e)}); reinstall it") from e
    if not devices:
        raise ModelError(f"{library}: the execution provider {ep_name} reports no device")
    options = ort.SessionOptions()
    options.log_severity_level = 0 if capture_log else 3
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    options.add_provider_for_devices(devices, dict(provider_options))
    try:
        with _native_log(capture_log) as read:
            session = ort.InferenceSession(os.fspath(model), options)
        # a failed run must fail, not be retried silently on the CPU EP alone
        session.disable_fallback()
    except Exception as e:
        raise ModelError(f"{name}: {ep_name} cannot run the model ({_first_line(e)})") from e
    return Session(session, name), read()


@contextlib.contextmanager
def _native_log(capture: bool) -> Iterator[Any]:
    """While the block runs, send what native code prints to stdout to stderr instead (the
    QNN backend prints a line there as it loads, which would corrupt a command's JSON), and
    with ``capture`` both to a temporary file; yields a function returning what was
    captured."""
    text: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    with tempfile.TemporaryFile() as file:
        if capture:
            os.dup2(file.fileno(), 2)
        os.dup2(2, 1)
        try:
            yield lambda: "".join(text)
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            file.seek(0)
            text.append(file.read().decode("utf-8", errors="replace"))


def _fixed_batch(session: ort.InferenceSession) -> int | None:
    """``k`` when every input's first dimension is the number ``k``, else None."""
    firsts = {i.shape[0] if i.shape else None for i in session.get_inputs()}
    first = firsts.pop() if len(firsts) == 1 else None
    return first if isinstance(first, int) and first > 0 else None


def _pad(value: np.ndarray, size: int) -> np.ndarray:
    """``value`` with its last row repeated up to ``size`` rows."""
    short = size - len(value)
    return value if short <= 0 else np.concatenate([value, np.repeat(value[-1:], short, 0)])


def _load(model: bytes | str | os.PathLike[str]) -> onnx.ModelProto:
    if isinstance(model, bytes):
        return onnx.load_from_string(model)
    return onnx.load(os.fspath(model))


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else type(error).__name__
