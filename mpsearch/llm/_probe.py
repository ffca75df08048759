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

__all__ = ["ProbeResult", "probe_kernel", "probe_kernels", "tolerance"]

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
