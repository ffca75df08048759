"""Weight-only block formats of MatMul weights, their exact size, and their packed storage.

A format quantizes a ``[K, N]`` MatMul weight in blocks of ``block`` values along K (the input
dimension), one scale per block and, when asymmetric, one zero point per block, exactly as
ONNX Runtime's ``MatMulNBits`` stores it: codes packed into ``B`` uint8 ``[N, n_blocks, blob]``,
``scales`` float ``[N * n_blocks]``, ``zero_points`` uint8 packed ``bits`` wide (a row of
``ceil(n_blocks * bits / 8)`` bytes per output column) or float like the scales. Names read
``w<bits>b<block><zero>``: ``s`` symmetric (no zero points; the kernel's default code
``2^(bits-1)`` is the zero), ``a`` asymmetric with packed uint8 zero points, ``f`` asymmetric
with float zero points (HQQ's form); ``fp16`` and ``fp32`` keep the weight in float.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from mpsearch.errors import SpecError

__all__ = ["BITS", "BLOCKS", "ZEROS", "BlockFormat", "Quantized", "pack_codes", "pack_zeros",
           "parse_format", "unpack_codes"]

BITS = (2, 4, 8)
BLOCKS = (32, 64, 128)
#: zero-point kinds: none (symmetric), packed uint8 codes, float (the scales' type)
ZEROS = ("none", "uint8", "float")
_SUFFIX = {"none": "s", "uint8": "a", "float": "f"}
_NAME = re.compile(r"^w(\d+)b(\d+)([saf])$")
FLOAT_FORMATS = {"fp32": 32, "fp16": 16}


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockFormat:
    """One weight-only format: ``bits`` 2/4/8 in blocks of ``block`` along K with zero points
    ``zero`` (:data:`ZEROS`), or a float weight (``bits`` 16 or 32, ``block`` 0)."""

    bits: int
    block: int = 0
    zero: str = "none"

    def __post_init__(self) -> None:
        if self.is_float:
            if self.block or self.zero != "none":
                raise SpecError(f"float format fp{self.bits} takes no block or zero point")
            return
        if self.bits not in BITS:
            raise SpecError(f"weight-only bits {self.bits} unsupported; use one of {BITS}")
        if self.block < 16 or self.block & (self.block - 1):
            raise SpecError(f"block {self.block} must be a power of two >= 16, e.g. "
                              f"{BLOCKS}")
        if self.zero not in ZEROS:
            raise SpecError(f"zero point kind '{self.zero}' unknown; use one of {ZEROS}")

    @property
    def is_float(self) -> bool:
        return self.bits in (16, 32)

    @property
    def name(self) -> str:
        if self.is_float:
            return f"fp{self.bits}"
        return f"w{self.bits}b{self.block}{_SUFFIX[self.zero]}"

    @property
    def symmetric(self) -> bool:
        return self.zero == "none"

    @property
    def levels(self) -> int:
        """Largest code, ``2^bits - 1``."""
        return (1 << self.bits) - 1

    @property
    def default_zero(self) -> int:
        """The zero code a symmetric block uses (MatMulNBits' default zero point)."""
        return 1 << (self.bits - 1)

    def n_blocks(self, k: int) -> int:
        return -(-k // self.block)

    def storage(self, k: int, n: int, scale_bytes: int = 4) -> dict[str, int]:
        """Bytes of each stored tensor of a ``[k, n]`` weight: ``B``, ``scales`` and
        ``zero_points`` as MatMulNBits holds them (padding of the last block included);
        ``scale_bytes``: 4 for a float32 model, 2 for float16."""
        if self.is_float:
            return {"weight": k * n * self.bits // 8}
        nb = self.n_blocks(k)
        sizes = {"B": n * nb * self.block * self.bits // 8, "scales": n * nb * scale_bytes}
        if self.zero == "uint8":
            sizes["zero_points"] = n * math.ceil(nb * self.bits / 8)
        elif self.zero == "float":
            sizes["zero_points"] = n * nb * scale_bytes
        return sizes

    def weight_bytes(self, k: int, n: int, scale_bytes: int = 4) -> int:
        """Exact bytes of a ``[k, n]`` weight in this format, every scale and zero counted."""
        return sum(self.storage(k, n, scale_bytes).values())

    def bits_per_weight(self, k: int, n: int, scale_bytes: int = 4) -> float:
        return 8.0 * self.weight_bytes(k, n, scale_bytes) / (k * n)


def parse_format(name: str) -> BlockFormat:
    """``w4b32a`` -> 4 bits, blocks of 32, uint8 zero points; ``fp16``/``fp32`` -> float."""
    if name in FLOAT_FORMATS:
        return BlockFormat(bits=FLOAT_FORMATS[name])
    match = _NAME.match(name)
    if match is None:
        raise SpecError(f"weight-only format '{name}' not understood; write w<bits>b<block>"
                          "<s|a|f> (e.g. w4b32a, w2b64s) or fp16/fp32")
    zero = {v: k for k, v in _SUFFIX.items()}[match[3]]
    return BlockFormat(bits=int(match[1]), block=int(match[2]), zero=zero)


@dataclass(frozen=True, slots=True, kw_only=True)
class Quantized:
    """A ``[k, n]`` weight quantized in ``fmt``: ``codes`` uint8 ``[n, n_blocks * block]``
    (K padded), ``scales`` float32 ``[n, n_blocks]`` and ``zeros`` ``[n, n_blocks]`` (float32;
    whole numbers for uint8 zero points, the default code for symmetric blocks). Each value
    is ``(code - zero) * scale``."""

    fmt: BlockFormat
    k: int
    n: int
    codes: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray

    def dequantize(self) -> np.ndarray:
        """The ``[k, n]`` float32 weight the codes stand for."""
        nb, block = self.scales.shape[1], self.fmt.block
        blocks = self.codes.reshape(self.n, nb, block).astype(np.float32)
        values = (blocks - self.zeros[:, :, None]) * self.scales[:, :, None]
        return np.ascontiguousarray(values.reshape(self.n, nb * block)[:, :self.k].T)

    def packed(self) -> dict[str, np.ndarray]:
        """The MatMulNBits tensors: ``B``, ``scales`` and, when asymmetric, ``zero_points``."""
        nb = self.scales.shape[1]
        out = {"B": pack_codes(self.codes, self.fmt.bits).reshape(self.n, nb, -1),
               "scales": self.scales.astype(np.float32).reshape(-1)}
        if self.fmt.zero == "uint8":
            out["zero_points"] = pack_zeros(self.zeros, self.fmt.bits).reshape(-1)
        elif self.fmt.zero == "float":
            out["zero_points"] = self.zeros.astype(np.float32).reshape(-1)
        return out


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack a row-major uint8 code array ``[rows, cols]`` (cols a multiple of ``8 // bits``)
    ``bits`` wide, the first value of each byte in its lowest bits."""
    per = 8 // bits
    rows, cols = codes.shape
    grouped = codes.astype(np.uint8).reshape(rows, cols // per, per)
    out = np.zeros((rows, cols // per), np.uint8)
    for j in range(per):
        out |= (grouped[:, :, j] << (bits * j)).astype(np.uint8)
    return out


def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_codes`."""
    per = 8 // bits
    mask = (1 << bits) - 1
    parts = [(packed >> (bits * j)) & mask for j in range(per)]
    return np.stack(parts, axis=-1).reshape(packed.shape[0], -1).astype(np.uint8)


def pack_zeros(zeros: np.ndarray, bits: int) -> np.ndarray:
    """Zero points ``[n, n_blocks]`` as MatMulNBits stores them: each row packed ``bits``
    wide and padded to whole bytes."""
    per = 8 // bits
    n, nb = zeros.shape
    padded = np.zeros((n, -(-nb // per) * per), np.uint8)
    padded[:, :nb] = np.rint(zeros).astype(np.uint8)
    return pack_codes(padded, bits)
