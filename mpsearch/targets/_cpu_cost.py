"""The work a target leaves to its host CPU, counted in its cost.

A toolchain's cycle count covers its accelerator only: Vela gives an operator on the
Cortex-M 0 cycles, and RKNN-Toolkit2's layer table a CPU layer 0/0/0, so a point that moves
work off the NPU looks cheaper, and one entirely on the CPU looks free.
:func:`with_cpu_estimate` adds an estimate of the fallback nodes' cost on the host core to
``cycles``: their floating-point operations (:func:`mpsearch.summary.summarize`: 2 per MAC,
one or more per element otherwise; a Quantize/Dequantize counts one per element) at an
assumed rate of the host core in the accelerator's clock. The rates are optimistic on
purpose (a lower bound of the CPU's cost), so the estimate never overstates a fallback;
the toolchain's own total stays beside it as ``cycles_toolchain``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from mpsearch.graph import load_model
from mpsearch.summary import summarize
from mpsearch.targets._base import ACCELERATOR, Placement

__all__ = ["HOST_FLOPS_PER_CYCLE", "with_cpu_estimate"]

#: Floating-point operations per accelerator clock cycle of the host core, per toolchain:
#: vela: a Cortex-M55 at the NPU's clock (as in Arm's Corstone-300), its scalar FPU at one
#: operation per cycle (TFLite Micro's float kernels are not vectorised); qnn: a Snapdragon
#: CPU core (4-wide NEON fused multiply-add, 8 per cycle) at about twice the HTP's clock;
#: rknn: an RK3588 Cortex-A76 core (two 128-bit NEON FMA pipes, 16 float32 operations per
#: cycle) at 2.4 GHz against the NPU's 1.0 GHz, 38 per NPU cycle.
HOST_FLOPS_PER_CYCLE = {"vela": 1.0, "qnn": 16.0, "rknn": 38.0}
_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})


def with_cpu_estimate(cost: Mapping[str, float], model: onnx.ModelProto,
                      placements: Sequence[Placement], toolchain: str) -> dict[str, float]:
    """``cost`` with ``cpu_flops`` (of the nodes not on the accelerator), ``cpu_cycles_estimate``
    (those at :data:`HOST_FLOPS_PER_CYCLE`), ``cycles_toolchain`` (the toolchain's own total)
    and ``cycles`` = the toolchain's + the estimate. Without a toolchain total, unchanged."""
    if "cycles" not in cost:
        return dict(cost)
    off = {p.node for p in placements if p.unit != ACCELERATOR}
    flops = 0
    if off:
        summary = summarize(load_model(model))
        for row in summary.nodes:
            if row.name not in off:
                continue
            elements = [s for s in row.output_shapes if s is not None]
            flops += row.flops or (_numel(elements[0]) if row.op_type in _QDQ and elements
                                   else 0)
    estimate = flops / HOST_FLOPS_PER_CYCLE[toolchain]
    return {**cost, "cycles_toolchain": float(cost["cycles"]), "cpu_flops": float(flops),
            "cpu_cycles_estimate": estimate, "cycles": float(cost["cycles"]) + estimate}


def _numel(shape: tuple[object, ...]) -> int:
    count = 1
    for d in shape:
        count *= d if isinstance(d, int) and d > 0 else 1
    return count
