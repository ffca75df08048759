"""An in-memory TFLite model (tensors, operators) -> TFLite flatbuffer bytes.

The flatbuffer tables are written with the schema modules that ``ethos-u-vela`` ships
(``ethosu.vela.tflite``), so no TensorFlow is needed. :class:`FlatModel` is filled by the
lowering (:mod:`mpsearch.targets._tflite_lower`) and serialised once by :meth:`FlatModel.bytes`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["FlatModel", "FlatOp", "FlatTensor"]

_SCHEMA = "ethosu.vela.tflite"

#: numpy dtype name -> TFLite TensorType value (schema.fbs).
TENSOR_TYPES = {"float32": 0, "float16": 1, "int32": 2, "uint8": 3, "int64": 4, "bool": 6,
                "int16": 7, "int8": 9}


#: Operators whose first registered version in TFLite's resolver is not 1.
MIN_VERSION = {"BROADCAST_TO": 2}


def _schema(name: str) -> Any:
    return importlib.import_module(f"{_SCHEMA}.{name}")


@dataclass(slots=True, kw_only=True)
class FlatTensor:
    """One TFLite tensor: a constant when ``data`` is set; quantized when ``scale`` is."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: np.ndarray | None = None
    scale: np.ndarray | None = None
    zero: np.ndarray | None = None
    axis: int = 0


@dataclass(slots=True, kw_only=True)
class FlatOp:
    """One operator: a BuiltinOperator name, its options table name and fields (snake_case)."""

    code: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    node: str
    options: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    also: tuple[str, ...] = ()  # further ONNX nodes this operator computes (a fused pattern)


@dataclass(slots=True)
class FlatModel:
    """Tensors and operators in execution order, with the subgraph's inputs and outputs."""

    tensors: list[FlatTensor] = field(default_factory=list)
    ops: list[FlatOp] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def add(self, tensor: FlatTensor) -> int:
        self.tensors.append(tensor)
        return len(self.tensors) - 1

    def op(self, code: str, inputs: tuple[int, ...], outputs: tuple[int, ...], node: str,
           options: str | None = None, **fields: Any) -> FlatOp:
        made = FlatOp(code=code, inputs=inputs, outputs=outputs, node=node, options=options,
                      fields=fields)
        self.ops.append(made)
        return made

    def bytes(self) -> bytes:
        """The model as a TFLite flatbuffer (file identifier ``TFL3``, schema version 3)."""
        return _Writer(self).write()


class _Writer:
    def __init__(self, model: FlatModel) -> None:
        import flatbuffers  # type: ignore[import-untyped]  # installed with ethos-u-vela

        self.m = model
        self.b = flatbuffers.Builder(1024)

    def _vector(self, values: list[int], kind: str = "Int32") -> int:
        size = 8 if kind == "Int64" else 4
        self.b.StartVector(size, len(values), size)
        for v in reversed(values):
            getattr(self.b, f"Prepend{kind}")(v)
        return int(self.b.EndVector())

    def _floats(self, values: np.ndarray) -> int:
        self.b.StartVector(4, len(values), 4)
        for v in reversed(values.tolist()):
            self.b.PrependFloat32(float(v))
        return int(self.b.EndVector())

    def _offsets(self, values: list[int]) -> int:
        self.b.StartVector(4, len(values), 4)
        for v in reversed(values):
            self.b.PrependUOffsetTRelative(v)
        return int(self.b.EndVector())

    def _buffer(self, data: np.ndarray | None) -> int:
        mod = _schema("Buffer")
        raw = None
        if data is not None:  # 16-byte aligned, as TFLite's own writer aligns buffers
            payload = np.ascontiguousarray(data).reshape(-1).view(np.uint8).tobytes()
            self.b.StartVector(1, len(payload), 16)
            self.b.head = self.b.head - len(payload)
            self.b.Bytes[self.b.head:self.b.head + len(payload)] = payload
            raw = self.b.EndVector()
        mod.BufferStart(self.b)
        if raw is not None:
            mod.BufferAddData(self.b, raw)
        return int(mod.BufferEnd(self.b))

    def _quant(self, t: FlatTensor) -> int | None:
        if t.scale is None or t.zero is None:
            return None
        mod = _schema("QuantizationParameters")
        scale = self._floats(np.asarray(t.scale, np.float32).reshape(-1))
        zero = self._vector([int(z) for z in np.asarray(t.zero).reshape(-1)], "Int64")
        mod.QuantizationParametersStart(self.b)
        mod.QuantizationParametersAddScale(self.b, scale)
        mod.QuantizationParametersAddZeroPoint(self.b, zero)
        mod.QuantizationParametersAddQuantizedDimension(self.b, t.axis)
        return int(mod.QuantizationParametersEnd(self.b))

    def _tensor(self, t: FlatTensor, buffer: int) -> int:
        mod = _schema("Tensor")
        shape = self._vector(list(t.shape))
        name = self.b.CreateString(t.name)
        quant = self._quant(t)
        mod.TensorStart(self.b)
        mod.TensorAddShape(self.b, shape)
        mod.TensorAddType(self.b, TENSOR_TYPES[t.dtype])
        mod.TensorAddBuffer(self.b, buffer)
        mod.TensorAddName(self.b, name)
        if quant is not None:
            mod.TensorAddQuantization(self.b, quant)
        return int(mod.TensorEnd(self.b))

    def _options(self, op: FlatOp) -> tuple[int, int] | None:
        if op.options is None:
            return None
        mod = _schema(op.options)
        vectors = {k: self._vector(list(v)) for k, v in op.fields.items()
                   if isinstance(v, (list, tuple))}
        getattr(mod, f"{op.options}Start")(self.b)
        for key, value in op.fields.items():
            camel = "".join(p.capitalize() for p in key.split("_"))
            getattr(mod, f"{op.options}Add{camel}")(self.b, vectors.get(key, value))
        table = int(getattr(mod, f"{op.options}End")(self.b))
        union = getattr(_schema("BuiltinOptions").BuiltinOptions, op.options)
        return int(union), table

    def _operator(self, op: FlatOp, index: int) -> int:
        mod = _schema("Operator")
        inputs, outputs = self._vector(list(op.inputs)), self._vector(list(op.outputs))
        options = self._options(op)
        mod.OperatorStart(self.b)
        mod.OperatorAddOpcodeIndex(self.b, index)
        mod.OperatorAddInputs(self.b, inputs)
        mod.OperatorAddOutputs(self.b, outputs)
        if options is not None:
            mod.OperatorAddBuiltinOptionsType(self.b, options[0])
            mod.OperatorAddBuiltinOptions(self.b, options[1])
        return int(mod.OperatorEnd(self.b))

    def _opcode(self, code: str) -> int:
        mod = _schema("OperatorCode")
        value = int(getattr(_schema("BuiltinOperator").BuiltinOperator, code))
        mod.OperatorCodeStart(self.b)
        mod.OperatorCodeAddDeprecatedBuiltinCode(self.b, min(value, 127))
        mod.OperatorCodeAddBuiltinCode(self.b, value)
        mod.OperatorCodeAddVersion(self.b, MIN_VERSION.get(code, 1))
        return int(mod.OperatorCodeEnd(self.b))

    def write(self) -> bytes:
        m = self.m
        codes = sorted({op.code for op in m.ops})
        index = {c: i for i, c in enumerate(codes)}
        buffers = [self._buffer(None)]  # buffer 0: the empty sentinel
        tensors = []
        for t in m.tensors:
            buffer = 0
            if t.data is not None:
                buffers.append(self._buffer(t.data))
                buffer = len(buffers) - 1
            tensors.append(self._tensor(t, buffer))
        ops = [self._operator(op, index[op.code]) for op in m.ops]
        sg = _schema("SubGraph")
        t_vec, o_vec = self._offsets(tensors), self._offsets(ops)
        i_vec, out_vec = self._vector(m.inputs), self._vector(m.outputs)
        name = self.b.CreateString("main")
        sg.SubGraphStart(self.b)
        sg.SubGraphAddTensors(self.b, t_vec)
        sg.SubGraphAddInputs(self.b, i_vec)
        sg.SubGraphAddOutputs(self.b, out_vec)
        sg.SubGraphAddOperators(self.b, o_vec)
        sg.SubGraphAddName(self.b, name)
        subgraph = sg.SubGraphEnd(self.b)
        opcodes = [self._opcode(c) for c in codes]
        mod = _schema("Model")
        c_vec, s_vec = self._offsets(opcodes), self._offsets([subgraph])
        b_vec = self._offsets(buffers)
        desc = self.b.CreateString("mpsearch QDQ export")
        mod.ModelStart(self.b)
        mod.ModelAddVersion(self.b, 3)
        mod.ModelAddOperatorCodes(self.b, c_vec)
        mod.ModelAddSubgraphs(self.b, s_vec)
        mod.ModelAddDescription(self.b, desc)
        mod.ModelAddBuffers(self.b, b_vec)
        self.b.Finish(mod.ModelEnd(self.b), file_identifier=b"TFL3")
        return bytes(self.b.Output())
