"""Per-weight choices (format and method), their exact size, and the quantized weights they feed.

An assignment maps a weight's key (``"3.v"``, ``"lm_head"``) to a :class:`Choice`: a format name
of :mod:`._formats` and the method that quantizes it (``rtn``, ``hqq``, ``kquant``, ``gptq``;
``fp32`` keeps the weight). :class:`WeightBank` holds the FP32 weights and the calibration
Hessians of a :class:`~mpsearch.llm.LanguageModel`, quantizes choices (keeping the ones asked
to be kept, so a search reuses them), counts an assignment's bytes and bits per weight exactly
(every scale and zero point) and turns an assignment into the dequantized arrays a
:class:`~mpsearch.llm.Scorer` feeds. Weights not in an assignment stay FP32 and count 32 bits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from mpsearch.errors import DataError, SpecError
from mpsearch.llm._formats import Quantized, parse_format
from mpsearch.llm._gptq import gptq
from mpsearch.llm._model import LanguageModel, LMWeight
from mpsearch.llm._quant import quantize

__all__ = ["METHODS", "Assignment", "Choice", "WeightBank", "input_hessians", "searchable"]

logger = logging.getLogger(__name__)

METHODS = ("rtn", "hqq", "kquant", "gptq", "fp32")
#: a quantized weight this close to FP32 (relative to the weight's peak) reproduces it
EXACT = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """One weight's format (``w4b32a``, ``fp32``...) and the method that quantizes it."""

    fmt: str
    method: str = "kquant"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SpecError(f"weight-only method '{self.method}' unknown; use one of {METHODS}")
        if (self.method == "fp32") != parse_format(self.fmt).is_float:
            raise SpecError(f"{self.fmt} with method {self.method}: float formats take method "
                            "fp32, integer formats one of rtn, hqq, kquant, gptq")

    @property
    def label(self) -> str:
        return f"{self.fmt}:{self.method}"


Assignment = Mapping[str, Choice]


def searchable(model: LanguageModel) -> tuple[LMWeight, ...]:
    """The weights a per-projection search assigns: every layer projection and the
    ``lm_head`` (with tied embeddings, the table's copy the head reads)."""
    return tuple(w for w in model.weights if w.op == "MatMul" and len(w.shape) == 2
                 and (w.layer is not None or w.role == "lm_head"))


def input_hessians(model: LanguageModel, windows: np.ndarray, names: Iterable[str]
                   ) -> dict[str, np.ndarray]:
    """``X^T X / tokens`` (float32) of the input of each MatMul weight in ``names``, from one
    float ONNX Runtime pass over ``windows``; weights reading one input share one array."""
    from mpsearch.llm._gptq import matmul_weights
    from mpsearch.runtime import create_session

    proto = onnx.load(str(model.path))
    inputs_of = {w: i for w, i in matmul_weights(proto).items() if w in set(names)}
    inputs = sorted(set(inputs_of.values()))
    session = create_session(proto, extra_outputs=inputs, label="hessians", arena=False)
    del proto
    sums: dict[str, np.ndarray] = {}
    for row in windows:
        out = session.run(model.feeds(row[None]), inputs)
        for name in inputs:
            x = out[name].reshape(-1, out[name].shape[-1]).astype(np.float32)
            sums[name] = sums[name] + x.T @ x if name in sums else x.T @ x
    tokens = float(windows.size)
    for name in sums:
        sums[name] /= tokens
    return {w: sums[i] for w, i in inputs_of.items()}


class WeightBank:
    """The FP32 weights of ``model`` (``fp32``: name -> array, a Scorer's own), the Hessians of
    their inputs and the quantized choices kept so far."""

    def __init__(self, model: LanguageModel, fp32: Mapping[str, np.ndarray],
                 hessians: Mapping[str, np.ndarray] | None = None) -> None:
        self.weights = {w.key: w for w in searchable(model)}
        missing = [w.name for w in self.weights.values() if w.name not in fp32]
        if missing:
            raise DataError(f"{model.path}: no FP32 array for {missing[:2]}; give the scorer's")
        self.fp32 = fp32
        self.hessians = dict(hessians or {})
        self.kept: dict[tuple[str, str], Quantized] = {}
        self.quantized = 0  # weights quantized so far (a measure of the work done)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.weights)

    def params(self, keys: Iterable[str] | None = None) -> int:
        return sum(int(np.prod(self.weights[k].shape)) for k in (keys or self.weights))

    def weight_bytes(self, key: str, choice: Choice) -> int:
        """Exact bytes of weight ``key`` stored as ``choice`` (MatMulNBits' tensors)."""
        k, n = self.weights[key].shape
        return parse_format(choice.fmt).weight_bytes(k, n)

    def total_bytes(self, assignment: Assignment) -> int:
        """Bytes of every searchable weight: assigned ones as assigned, the rest FP32."""
        return sum(self.weight_bytes(key, assignment.get(key, Choice(fmt="fp32", method="fp32")))
                   for key in self.weights)

    def bits_per_weight(self, assignment: Assignment) -> float:
        return 8.0 * self.total_bytes(assignment) / self.params()

    def quantize(self, key: str, choice: Choice, *, keep: bool = False) -> Quantized | None:
        """Weight ``key`` quantized as ``choice`` (None for a float format); ``keep`` stores it
        for later calls. With the input's Hessian known, ``hqq`` and ``kquant`` weigh each
        input channel's error by its ``diag(H)`` (llama.cpp's importance matrix)."""
        if choice.method == "fp32":
            return None
        cached = self.kept.get((key, choice.label))
        if cached is not None:
            return cached
        weight = self.weights[key]
        array = self.fp32[weight.name]
        fmt = parse_format(choice.fmt)
        hessian = self.hessians.get(weight.name)
        if choice.method == "gptq":
            if hessian is None:
                raise DataError(f"GPTQ of {key} needs its input's Hessian; compute "
                                "input_hessians on calibration windows first")
            result = gptq(array, fmt, np.asarray(hessian, np.float64))
        else:
            importance = None if hessian is None or choice.method == "rtn" else np.diag(hessian)
            result = quantize(array, fmt, choice.method, importance)
        self.quantized += 1
        if keep:
            self.kept[(key, choice.label)] = result
        return result

    def exact(self, key: str, choice: Choice) -> bool:
        """Whether ``choice`` reproduces weight ``key`` within :data:`EXACT` of its peak (a
        Q4_1-born weight in ``w4b32f``, say): its KL is 0 without a forward pass."""
        array = self.fp32[self.weights[key].name]
        q = self.quantize(key, choice, keep=True)
        if q is None:
            return True
        peak = float(np.max(np.abs(array))) or 1.0
        return float(np.max(np.abs(q.dequantize() - array))) <= EXACT * peak

    def feeds(self, assignment: Assignment, *, keep: bool = False) -> dict[str, np.ndarray]:
        """``{initializer: dequantized float32 array}`` of every assigned integer choice."""
        out: dict[str, np.ndarray] = {}
        for key, choice in assignment.items():
            if key not in self.weights:
                raise DataError(f"no searchable weight '{key}'; keys read like "
                                f"{self.keys[:3]} (layer.projection or lm_head)")
            q = self.quantize(key, choice, keep=keep)
            if q is not None:
                out[self.weights[key].name] = q.dequantize()
        return out

    def group_gptq(self, assignment: Assignment) -> None:
        """Quantize the GPTQ choices of ``assignment`` that share an input (q, k, v; gate, up)
        and a format together, one GPTQ run over their concatenated columns (the columns are
        independent given the Hessian, so the result is the same as one run each), and keep
        them; returns when every GPTQ choice is kept."""
        groups: dict[tuple[int, str], list[str]] = {}
        for key, choice in assignment.items():
            if choice.method == "gptq" and (key, choice.label) not in self.kept:
                hessian = self.hessians.get(self.weights[key].name)
                if hessian is None:
                    raise DataError(f"GPTQ of {key} needs its input's Hessian; compute "
                                    "input_hessians on calibration windows first")
                groups.setdefault((id(hessian), choice.fmt), []).append(key)
        for (_, fmt_name), keys in groups.items():
            arrays = [self.fp32[self.weights[k].name] for k in keys]
            hessian = np.asarray(self.hessians[self.weights[keys[0]].name], np.float64)
            joined = gptq(np.concatenate(arrays, axis=1), parse_format(fmt_name), hessian)
            start = 0
            for key, array in zip(keys, arrays, strict=True):
                n = array.shape[1]
                self.kept[(key, f"{fmt_name}:gptq")] = Quantized(
                    fmt=joined.fmt, k=joined.k, n=n, codes=joined.codes[start:start + n],
                    scales=joined.scales[start:start + n], zeros=joined.zeros[start:start + n])
                start += n
            self.quantized += len(keys)

    def forget(self, assignment: Assignment) -> None:
        """Drop the kept quantized weights of ``assignment`` (a baseline scored and done)."""
        for key, choice in assignment.items():
            self.kept.pop((key, choice.label), None)
