"""Vela's own output -> placements and cost.

Read from what Vela writes, never estimated here:

* ``<net>_per-layer.csv`` (``--verbose-performance``): one row per operator after Vela's
  rewrites, named by its output tensor, with ``Target`` (NPU or CPU) and ``Op Cycles``;
* ``<net>_summary_<system>.csv``: total cycles, SRAM and flash/DRAM use, inference time;
* stdout's ``Warning (supported operators) operator: OP, ofm: 'NAME'`` blocks: the reason
  each refused operator stays on the CPU, in Vela's words.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mpsearch.errors import TargetError
from mpsearch.targets._base import Placement

__all__ = ["VelaReport", "placements", "read_report"]

_LISTED = re.compile(r"^\s*(CPU|NPU): (\w+) = (.*) \(outputs ", re.M)
_COUNT = re.compile(r"^(CPU|NPU) operators = (\d+)", re.M)
_WARNING = re.compile(r"^Warning \(supported operators\) operator: (\w+), ofm: '(.*)'$")
_KIB = 1024.0
_TENSOR = re.compile(r" \([^()\s]*\)")  # "(tensor_name)" in a reason: one reason per kind


@dataclass(frozen=True, slots=True, kw_only=True)
class VelaReport:
    """What one Vela run said: per output tensor, its unit and cycles; reasons; totals."""

    targets: Mapping[str, str]       # Vela's operator name (its output tensor) -> NPU | CPU
    cycles: Mapping[str, float]      # the same names -> Op Cycles
    reasons: Mapping[str, str]       # output tensor name -> Vela's reason for the CPU
    cost: Mapping[str, float]


def _reasons(stdout: str) -> dict[str, str]:
    lines = stdout.splitlines()
    found: dict[str, str] = {}
    for i, line in enumerate(lines):
        match = _WARNING.match(line.strip())
        if match is None:
            continue
        words = []
        for follow in lines[i + 1:]:
            if not follow.strip() or _WARNING.match(follow.strip()):
                break
            words.append(follow.strip().removeprefix("Reason: "))
        found[match.group(2)] = " ".join(words)
    return found


def _number(row: Mapping[str, str], key: str) -> float:
    try:
        return float(row[key])
    except (KeyError, ValueError) as e:
        raise TargetError(f"Vela's summary CSV has no number '{key}'; the Vela version "
                          "may not be the one this adapter reads (ethos-u-vela 5.2.0)") from e


def read_report(out_dir: Path, network: str, stdout: str) -> VelaReport:
    """Parse Vela's CSV files in ``out_dir`` for ``network`` (the input file's stem)."""
    per_layer = out_dir / f"{network}_per-layer.csv"
    summaries = sorted(out_dir.glob(f"{network}_summary_*.csv"))
    if not per_layer.exists() or not summaries:
        raise TargetError(f"Vela wrote no per-layer or summary CSV in {out_dir}; "
                          "its output: " + stdout.strip().splitlines()[-1:][0]
                          if stdout.strip() else "(none)")
    targets: dict[str, str] = {name: unit for unit, _, name in _LISTED.findall(stdout)}
    cycles: dict[str, float] = {}
    with per_layer.open(newline="") as f:
        for row in csv.DictReader(f):
            name = row["Name"].strip()
            if targets.get(name) != "CPU":  # either listing placing it on the CPU counts
                targets[name] = row["Target"].strip()
            cycles[name] = cycles.get(name, 0.0) + float(row["Op Cycles"] or 0)
    with summaries[0].open(newline="") as f:
        summary = next(csv.DictReader(f))
    cost = {
        "cycles": _number(summary, "cycles_total"),
        "cycles_npu": _number(summary, "cycles_npu"),
        "sram_bytes": _number(summary, "sram_memory_used") * _KIB,
        "dram_bytes": _number(summary, "dram_memory_used") * _KIB,
        "flash_bytes": (_number(summary, "off_chip_flash_memory_used")
                        + _number(summary, "on_chip_flash_memory_used")) * _KIB,
        "inference_seconds": _number(summary, "inference_time"),
        "macs": _number(summary, "nn_macs"),
        "clock_hz": _number(summary, "core_clock"),
    }
    cost.update({f"{unit.lower()}_ops": float(n) for unit, n in _COUNT.findall(stdout)})
    return VelaReport(targets=targets, cycles=cycles, reasons=_reasons(stdout), cost=cost)


def _owner(name: str, outputs: Mapping[str, list[int]]) -> list[int]:
    """The operators whose output tensor Vela's ``name`` is, or derives from (Vela appends
    suffixes such as ``_intermediate`` to the operators it splits)."""
    if name in outputs:
        return outputs[name]
    best = max((t for t in outputs if name.startswith(t)), key=len, default=None)
    return [] if best is None else outputs[best]


def placements(report: VelaReport, ops: Sequence[tuple[str, str, str]]) -> tuple[
        tuple[Placement, ...], dict[str, float]]:
    """Per ONNX node: where Vela put its operators and in which precision; and the cycles
    Vela gives each node. ``ops`` are the written operators' (node, output tensor name,
    output dtype) in order; a node is on the CPU when any of its operators is. Operators Vela
    removed (a RESHAPE it folds) count as the accelerator's."""
    outputs: dict[str, list[int]] = {}
    for i, (_, out, _) in enumerate(ops):
        outputs.setdefault(out, []).append(i)
    on_cpu: dict[int, str] = {}
    cycles = [0.0] * len(ops)
    for name, target in report.targets.items():
        for index in _owner(name, outputs):
            cycles[index] += report.cycles.get(name, 0.0)
            if target.upper() == "CPU":
                on_cpu[index] = report.reasons.get(name, "Vela placed it on the CPU")
    for name, reason in report.reasons.items():
        for index in _owner(name, outputs):
            on_cpu.setdefault(index, reason)
    order: list[str] = []
    units: dict[str, list[int]] = {}
    for i, (node, _, _) in enumerate(ops):
        if node not in units:
            order.append(node)
        units.setdefault(node, []).append(i)
    made, per_node = [], {}
    for node in order:
        indices = units[node]
        cpu = [i for i in indices if i in on_cpu]
        dtype = ops[indices[-1]][2]
        reasons = "; ".join(dict.fromkeys(_TENSOR.sub("", on_cpu[i]) for i in cpu))
        made.append(Placement(node=node, unit="cpu" if cpu else "accelerator",
                              precision="fp32" if dtype == "float32" else dtype,
                              reason=reasons))
        per_node[node] = sum(cycles[i] for i in indices)
    return tuple(made), per_node
