"""Which weight-only MatMulNBits variants ONNX Runtime's CPU kernels run, checked by running them.

For each bits, block size, zero-point kind and ``accuracy_level``, builds a one-node
``MatMulNBits`` model of a round-to-nearest weight (K not a multiple of the larger blocks, so
padding is exercised), runs it on the CPU execution provider and compares it with
``x @ dequantize(W)`` in float64. Produces one :class:`ProbeResult` per variant: whether the
session loaded and ran, and the maximum error relative to the largest reference output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from mpsearch.errors import MpsearchError
from mpsearch.llm._export import matmul_nbits_node
from mpsearch.llm._formats import BITS, BLOCKS, ZEROS, BlockFormat
from mpsearch.llm._quant import rtn

__all__ = ["ProbeResult", "probe_embedding", "probe_embeddings", "probe_kernel", "probe_kernels",
           "tolerance"]

PROBE_K, PROBE_N, PROBE_M = 288, 48, 16
LEVELS = (0, 1, 4)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    """One variant: ``runs`` when the session loaded, ran and matched within
    :func:`tolerance`; ``error`` the max relative error (None when it did not run)."""

    fmt: str
    accuracy_level: int
    loaded: bool
    error: float | None
    message: str = ""

    @property
    def runs(self) -> bool:
        return self.error is not None and self.error <= tolerance(self.accuracy_level)

    @property
    def int8_activations(self) -> bool:
        """Runs with an error beyond float accumulation's: the activations went to int8."""
        return self.runs and self.error is not None and self.error > tolerance(0)

    def to_dict(self) -> dict[str, object]:
        return {"format": self.fmt, "accuracy_level": self.accuracy_level,
                "loaded": self.loaded, "error": self.error, "runs": self.runs,
                "int8_activations": self.int8_activations,
                "message": self.message}


def tolerance(accuracy_level: int) -> float:
    """Largest max relative error a correct kernel shows: float32 accumulation for levels
    0-3; level 4 quantizes the activations to int8 per block, about 1/127 of a block's peak."""
    return 3e-2 if accuracy_level == 4 else 1e-4


def _model(fmt: BlockFormat, level: int, seed: int) -> tuple[onnx.ModelProto, np.ndarray,
                                                               np.ndarray]:
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((PROBE_K, PROBE_N)).astype(np.float32)
    quantized = rtn(weight, fmt)
    node, tensors = matmul_nbits_node(quantized, "A", "Y", ("B", "scales", "zero_points"),
                                      accuracy_level=level, node_name="probe")
    graph = helper.make_graph(
        [node], "probe",
        [helper.make_tensor_value_info("A", onnx.TensorProto.FLOAT, [PROBE_M, PROBE_K])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [PROBE_M, PROBE_N])],
        tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    x = rng.standard_normal((PROBE_M, PROBE_K)).astype(np.float32)
    reference = x.astype(np.float64) @ quantized.dequantize().astype(np.float64)
    return model, x, reference


def probe_kernel(fmt: BlockFormat, accuracy_level: int, *, seed: int = 0) -> ProbeResult:
    """Run one variant on the CPU EP and compare it with the float64 reference."""
    from mpsearch.runtime import create_session

    model, x, reference = _model(fmt, accuracy_level, seed)
    try:
        session = create_session(model, label=f"probe {fmt.name}")
    except MpsearchError as e:
        return ProbeResult(fmt=fmt.name, accuracy_level=accuracy_level, loaded=False,
                           error=None, message=str(e))
    try:
        y = session.run({"A": x})["Y"]
    except MpsearchError as e:
        return ProbeResult(fmt=fmt.name, accuracy_level=accuracy_level, loaded=True,
                           error=None, message=str(e))
    err = float(np.max(np.abs(y - reference)) / np.max(np.abs(reference)))
    return ProbeResult(fmt=fmt.name, accuracy_level=accuracy_level, loaded=True, error=err)


def probe_kernels(bits: tuple[int, ...] = BITS, blocks: tuple[int, ...] = BLOCKS,
                  zeros: tuple[str, ...] = ZEROS, levels: tuple[int, ...] = LEVELS
                  ) -> tuple[ProbeResult, ...]:
    """Every combination of ``bits`` x ``blocks`` x ``zeros`` x ``levels``."""
    return tuple(probe_kernel(BlockFormat(bits=b, block=k, zero=z), level)
                 for b in bits for k in blocks for z in zeros for level in levels)


def _tied_lm(vocab: int, d: int, seed: int) -> tuple[onnx.ModelProto, np.ndarray]:
    """input_ids -> Gather(E) -> MatMul Transpose(E) -> logits: an embedding and tied head."""
    table = np.random.default_rng(seed).standard_normal((vocab, d)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["E", "ids"], ["x"]),
             helper.make_node("Transpose", ["E"], ["E_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "E_t"], ["logits"])]
    graph = helper.make_graph(
        nodes, "tied", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [1, 6])],
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 6, d]),
         helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, 6, vocab])],
        [onnx.numpy_helper.from_array(table, "E")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), table


def probe_embedding(fmt: BlockFormat, *, seed: int = 0) -> ProbeResult:
    """Export a tiny tied embedding in ``fmt`` (GatherBlockQuantized, and MatMulNBits sharing
    its blocks, at accuracy_level 0) and compare the gathered rows and the logits with the
    dequantized table's, in float64. ``accuracy_level`` is reported as 0."""
    from mpsearch.llm._export import export_weight_only
    from mpsearch.runtime import create_session

    model, table = _tied_lm(96, PROBE_K, seed)
    ids = np.array([[0, 95, 7, 7, 42, 3]], np.int64)
    try:
        # the export refuses float zero points: offer ORT the node it would have written
        exported = (_float_zero_gather(table, fmt) if fmt.zero == "float"
                    else export_weight_only(model, {"E": fmt}, accuracy_level=0))
        outputs = create_session(exported, label=f"probe {fmt.name}").run({"ids": ids})
    except MpsearchError as e:
        return ProbeResult(fmt=fmt.name, accuracy_level=0, loaded=False, error=None,
                           message=str(e))
    deq = rtn(np.ascontiguousarray(table.T), fmt).dequantize().T.astype(np.float64)
    rows = deq[ids]
    errors = [np.max(np.abs(outputs["x"] - rows)) / np.max(np.abs(rows))]
    logits = rows @ deq.T
    errors.append(np.max(np.abs(outputs["logits"] - logits)) / np.max(np.abs(logits)))
    return ProbeResult(fmt=fmt.name, accuracy_level=0, loaded=True, error=float(max(errors)))


def _float_zero_gather(table: np.ndarray, fmt: BlockFormat) -> onnx.ModelProto:
    """One GatherBlockQuantized node with float zero points (outputs ``x`` and, to keep the
    probe's outputs, ``logits`` through an Identity)."""
    q = rtn(np.ascontiguousarray(table.T), fmt)
    data = q.packed()["B"].reshape(q.n, -1)
    inits = [onnx.numpy_helper.from_array(v, n) for n, v in
             (("data", data), ("scales", q.scales), ("zeros", q.zeros))]
    nodes = [helper.make_node("GatherBlockQuantized", ["data", "ids", "scales", "zeros"], ["x"],
                              domain="com.microsoft", bits=fmt.bits, block_size=fmt.block,
                              gather_axis=0, quantize_axis=1),
             helper.make_node("Identity", ["x"], ["logits"])]
    graph = helper.make_graph(
        nodes, "gather", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [1, 6])],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in ("x", "logits")],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("com.microsoft", 1)])


def probe_embeddings(bits: tuple[int, ...] = BITS, blocks: tuple[int, ...] = BLOCKS,
                     zeros: tuple[str, ...] = ZEROS) -> tuple[ProbeResult, ...]:
    """:func:`probe_embedding` for every combination of ``bits`` x ``blocks`` x ``zeros``."""
    return tuple(probe_embedding(BlockFormat(bits=b, block=k, zero=z))
                 for b in bits for k in blocks for z in zeros)
