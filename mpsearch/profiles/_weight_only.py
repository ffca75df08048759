"""The ``weight_only`` section of a hardware profile: which weight-only block formats the
target's kernel runs, at which ``accuracy_level``, and where it quantizes the activations.

Consumes the section's YAML mapping; produces a frozen :class:`WeightOnly`. Each kernel group
is a product of bits x blocks x zero-point kinds x accuracy levels; the named formats are
:mod:`mpsearch.llm._formats` names (``w4b32a``, ...). ``int8_activation_levels`` lists the
levels at which the kernel quantizes the activations to int8 rather than computing in float.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpsearch._yaml import LineList, Section

__all__ = ["EMBEDDING_OPS", "WEIGHT_ONLY_OPS", "WeightOnly", "WeightOnlyEmbedding",
           "WeightOnlyKernel", "parse_weight_only"]

WEIGHT_ONLY_OPS = ("MatMulNBits",)
EMBEDDING_OPS = ("GatherBlockQuantized",)
_ZEROS = {"none": "s", "uint8": "a", "float": "f"}
_KERNEL_KEYS = ("bits", "blocks", "zero_points", "accuracy_levels", "int8_activation_levels")
_FLOAT_WEIGHTS = ("fp32", "fp16")


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightOnlyKernel:
    """One group of variants the kernel runs: every combination of its fields."""

    bits: tuple[int, ...]
    blocks: tuple[int, ...]
    zero_points: tuple[str, ...]
    accuracy_levels: tuple[int, ...]
    int8_activation_levels: tuple[int, ...] = ()

    def formats(self) -> tuple[str, ...]:
        return tuple(f"w{b}b{k}{_ZEROS[z]}" for b in self.bits for k in self.blocks
                     for z in self.zero_points)

    def to_dict(self) -> dict[str, Any]:
        return {"bits": list(self.bits), "blocks": list(self.blocks),
                "zero_points": list(self.zero_points),
                "accuracy_levels": list(self.accuracy_levels),
                "int8_activation_levels": list(self.int8_activation_levels)}


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightOnlyEmbedding:
    """The block formats ``op`` gathers an embedding table in, a tied ``lm_head`` (MatMulNBits
    on the same blocks) included."""

    op: str
    bits: tuple[int, ...]
    blocks: tuple[int, ...]
    zero_points: tuple[str, ...]

    def formats(self) -> tuple[str, ...]:
        return WeightOnlyKernel(bits=self.bits, blocks=self.blocks,
                                zero_points=self.zero_points, accuracy_levels=()).formats()

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "bits": list(self.bits), "blocks": list(self.blocks),
                "zero_points": list(self.zero_points)}


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightOnly:
    """The weight-only formats of a target: ``op`` runs ``kernels``; ``float_weights`` are the
    float weight formats kept as MatMul; ``embedding`` the table formats (None: none)."""

    op: str
    kernels: Mapping[str, WeightOnlyKernel]
    float_weights: tuple[str, ...] = _FLOAT_WEIGHTS
    embedding: WeightOnlyEmbedding | None = None

    def runs(self) -> frozenset[tuple[str, int]]:
        """Every ``(format name, accuracy_level)`` the kernel runs."""
        return frozenset((f, level) for k in self.kernels.values() for f in k.formats()
                         for level in k.accuracy_levels)

    def int8_activations(self) -> frozenset[tuple[str, int]]:
        """The ``(format, accuracy_level)`` pairs computed with int8 activations."""
        return frozenset((f, level) for k in self.kernels.values() for f in k.formats()
                         for level in k.int8_activation_levels)

    def formats(self) -> tuple[str, ...]:
        """Integer formats run at some level, then the float ones."""
        names = sorted({f for f, _ in self.runs()})
        return (*names, *self.float_weights)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "float_weights": list(self.float_weights),
                "kernels": {n: k.to_dict() for n, k in self.kernels.items()},
                **({"embedding": self.embedding.to_dict()} if self.embedding else {})}


def _int_list(sec: Section, key: str, allowed: tuple[int, ...]) -> tuple[int, ...]:
    value = sec.data[key] if key in sec else None
    if not isinstance(value, list):
        sec.fail(key, f"{sec.path(key)} must be a list of integers from {list(allowed)}")
    marks = value.marks if isinstance(value, LineList) else []
    for i, item in enumerate(value):
        if isinstance(item, bool) or item not in allowed:
            mark = marks[i] if i < len(marks) else sec.mark_of(key)
            sec.fail_at(mark, f"{sec.path(key)}[{i}] must be one of {list(allowed)}, "
                        f"got {item!r}")
    return tuple(value)


def _kernel(sec: Section) -> WeightOnlyKernel:
    sec.check_keys(_KERNEL_KEYS, required=_KERNEL_KEYS[:4])
    levels = _int_list(sec, "accuracy_levels", (0, 1, 2, 3, 4))
    int8 = (_int_list(sec, "int8_activation_levels", levels)
            if "int8_activation_levels" in sec else ())
    return WeightOnlyKernel(
        bits=_int_list(sec, "bits", (2, 4, 8)),
        blocks=_int_list(sec, "blocks", (16, 32, 64, 128, 256)),
        zero_points=sec.get_str_list("zero_points", choices=tuple(_ZEROS), non_empty=True),
        accuracy_levels=levels, int8_activation_levels=int8)


def _embedding(sec: Section) -> WeightOnlyEmbedding:
    sec.check_keys(("op", "bits", "blocks", "zero_points"),
                   required=("op", "bits", "blocks", "zero_points"))
    return WeightOnlyEmbedding(
        op=sec.get_str("op", choices=EMBEDDING_OPS), bits=_int_list(sec, "bits", (2, 4, 8)),
        blocks=_int_list(sec, "blocks", (16, 32, 64, 128, 256)),
        zero_points=sec.get_str_list("zero_points", choices=tuple(_ZEROS), non_empty=True))


def parse_weight_only(sec: Section) -> WeightOnly:
    """``weight_only: {op, float_weights, kernels: {group: {bits, blocks, ...}}, embedding:
    {op, bits, blocks, zero_points}}``."""
    sec.check_keys(("op", "float_weights", "kernels", "embedding"), required=("op", "kernels"))
    groups = sec.section("kernels")
    if not groups.data:
        groups.fail_at(groups.data.mark, f"{groups.where} is empty; list at least one group")
    return WeightOnly(
        op=sec.get_str("op", choices=WEIGHT_ONLY_OPS),
        kernels={str(name): _kernel(groups.section(name)) for name in groups.keys()},
        float_weights=sec.get_str_list("float_weights", _FLOAT_WEIGHTS,
                                       choices=_FLOAT_WEIGHTS),
        embedding=_embedding(sec.section("embedding")) if "embedding" in sec else None)
