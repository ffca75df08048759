"""ONNX LSTM as float TFLite operators unrolled over time, for the CPU.

Vela refuses a float UNIDIRECTIONAL_SEQUENCE_LSTM outright ("IFM must be INT8 or INT16")
instead of leaving it to the CPU, so the LSTM is written as the operators it is made of: one
FULLY_CONNECTED of every step's input, then for each step a FULLY_CONNECTED of the previous
output, the gates (LOGISTIC, TANH) and the state update (MUL, ADD). Vela leaves these float
operators to the Cortex-M, and the rest of the model still compiles for the NPU. The steps of a
reverse direction run last to first; ``Y`` is ``[seq, directions, batch, hidden]`` as in ONNX.
The initial state must be absent or zero. ONNX orders the gates i, o, f, c.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mpsearch.targets._tflite_lower import Value
from mpsearch.targets._tflite_ops import Node, refuse

__all__ = ["RNN_WRITERS"]

_DEFAULT_ACTIVATIONS = ("Sigmoid", "Tanh", "Tanh")


def _check(n: Node) -> None:
    """Refuse what the unrolled form does not compute as ONNX does."""
    if n.integer("layout", 0) != 0:
        raise refuse("a batch-major LSTM (layout 1) is not written here")
    if n.integer("input_forget", 0):
        raise refuse("a coupled input-forget gate is not written here")
    if n.attr("clip") is not None:
        raise refuse("a clipped LSTM (clip) is not written here")
    names = n.attr("activations")
    if isinstance(names, list):
        given = [a.decode() if isinstance(a, bytes) else str(a) for a in names]
        if any(tuple(given[i:i + 3]) != _DEFAULT_ACTIVATIONS for i in range(0, len(given), 3)):
            raise refuse(f"activations {given} are not LSTM's sigmoid and tanh")
    for i, what in ((4, "sequence_lens"), (7, "peephole weights (P)")):
        if i < len(n.ins) and n.ins[i] is not None:
            raise refuse(f"an LSTM with {what} is not written here")
    for i, what in ((5, "initial_h"), (6, "initial_c")):
        state = n.ins[i] if i < len(n.ins) else None
        if state is not None and (not state.constant or np.any(state.real() != 0)):
            raise refuse(f"an LSTM with a nonzero {what} is not written here")
    for name in n.out_names[1:]:
        if name and n.low.consumers.get(name):
            raise refuse(f"the LSTM's last state {name!r} is read: only Y is written")


class _Steps:
    """Writes one node's float operators, each output a new scratch tensor."""

    def __init__(self, n: Node) -> None:
        self.n, self.count = n, 0

    def op(self, code: str, inputs: tuple[int, ...], shape: tuple[int, ...],
           options: str | None = None, **fields: object) -> int:
        self.count += 1
        out = self.n.scratch(f"lstm{self.count}", shape, None, False)
        self.n.emit(code, inputs, out, options, **fields)
        return out.index or 0

    def const(self, tag: str, array: np.ndarray) -> int:
        return self.n.low.const(f"{self.n.name}_{tag}",
                                np.ascontiguousarray(array, dtype=np.float32))

    def fc(self, x: int, w: int, b: int, shape: tuple[int, ...]) -> int:
        return self.op("FULLY_CONNECTED", (x, w, b), shape, "FullyConnectedOptions",
                       fused_activation_function=0, keep_num_dims=False)

    def binary(self, code: str, a: int, b: int, shape: tuple[int, ...]) -> int:
        options = {"ADD": "AddOptions", "MUL": "MulOptions"}[code]
        return self.op(code, (a, b), shape, options, fused_activation_function=0)


def _direction(s: _Steps, x: int, d: int, shape: tuple[int, int, int], backward: bool
               ) -> list[int]:
    """One direction's outputs, [batch, hidden] a step, in time order."""
    n = s.n
    seq, batch, hidden = shape
    w, r = n.const_array(1), n.const_array(2)
    if w is None or r is None:
        raise refuse("the LSTM's weights are not constants")
    b = n.const_array(3) if len(n.ins) > 3 else None
    bias = np.zeros(4 * hidden) if b is None else b[d, :4 * hidden] + b[d, 4 * hidden:]
    gates = s.fc(x, s.const(f"w{d}", w[d]), s.const(f"b{d}", bias), (seq * batch, 4 * hidden))
    split = tuple(s.n.scratch(f"x{d}_{t}", (batch, 4 * hidden), None, False).index or 0
                  for t in range(seq))
    n.low.flat.op("SPLIT", (n.low.const(f"{n.name}_axis{d}", np.array(0, np.int32)), gates),
                  split, n.name, "SplitOptions", num_splits=seq)
    recurrent, no_bias = s.const(f"r{d}", r[d]), s.const(f"z{d}", np.zeros(4 * hidden))
    one = (batch, hidden)
    h = c = None
    ys: dict[int, int] = {}
    for t in (range(seq - 1, -1, -1) if backward else range(seq)):
        total = split[t] if h is None else s.binary(
            "ADD", split[t], s.fc(h, recurrent, no_bias, (batch, 4 * hidden)), (batch, 4 * hidden))
        parts = tuple(s.n.scratch(f"g{d}_{t}_{k}", one, None, False).index or 0
                      for k in range(4))
        n.low.flat.op("SPLIT", (n.low.const(f"{n.name}_gaxis{d}_{t}", np.array(1, np.int32)),
                                total), parts, n.name, "SplitOptions", num_splits=4)
        i, o, f = (s.op("LOGISTIC", (parts[k],), one) for k in (0, 1, 2))
        fresh = s.binary("MUL", i, s.op("TANH", (parts[3],), one), one)
        c = fresh if c is None else s.binary("ADD", s.binary("MUL", f, c, one), fresh, one)
        h = s.binary("MUL", o, s.op("TANH", (c,), one), one)
        ys[t] = h
    return [ys[t] for t in range(seq)]


def _lstm(n: Node) -> list[Value]:
    if n.quantized:
        raise refuse("an integer LSTM is not written here")  # then float, as ORT runs it
    _check(n)
    hidden = n.integer("hidden_size", 0)
    direction = n.attr("direction", b"forward")
    x = n.x(0)
    seq, batch, features = x.shape
    s = _Steps(n)
    flat = s.op("RESHAPE", (x.index or 0, n.low.const(f"{n.name}_xshape", np.array(
        [seq * batch, features], np.int32))), (seq * batch, features))
    count = 2 if direction == b"bidirectional" else 1
    outs = [_direction(s, flat, d, (seq, batch, hidden), direction == b"reverse" or d == 1)
            for d in range(count)]
    steps = tuple(outs[d][t] for t in range(seq) for d in range(count))  # as Y's memory
    stacked = s.op("CONCATENATION", steps, (seq * count * batch, hidden),
                   "ConcatenationOptions", axis=0)
    shape = (seq, count, batch, hidden)
    return [n.emit("RESHAPE", (stacked, n.low.const(f"{n.name}_yshape", np.array(
        shape, np.int32))), n.output(0, shape))]


RNN_WRITERS: dict[str, Callable[[Node], list[Value]]] = {"LSTM": _lstm}
