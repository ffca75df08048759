# mypy: allow-untyped-defs, allow-untyped-calls
"""GPTQ's inner loop, compiled: one block of weight columns rounded one column at a time, each
column's rounding error spread over the block's columns not rounded yet.

Consumes the block ``block`` float64 ``[G, R, B]`` (updated in place), the upper Cholesky factor
of the inverse Hessian ``upper`` ``[G, K, K]`` with the block's first column at ``begin``, the
grid ``scale``, ``zero`` ``[G, R]`` and the code range; writes the block's codes into
``codes[:, :, begin:begin + B]`` and the scaled errors the caller feeds to the later blocks into
``errors`` ``[G, R, B]``. :func:`gptq_block_numpy` is the NumPy twin with the same signature and
the same floating-point operations in the same order, the reference of the tests.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mpsearch.kernels._kernels import _interruptible

__all__ = ["gptq_block", "gptq_block_numpy"]


def gptq_block_numpy(block: np.ndarray, upper: np.ndarray, begin: int, scale: np.ndarray,
                     zero: np.ndarray, qmin: int, qmax: int, codes: np.ndarray,
                     errors: np.ndarray) -> None:
    end = begin + block.shape[2]
    for j in range(block.shape[2]):
        i = begin + j
        column = block[:, :, j]
        code = np.clip(np.rint(column / scale) + zero, qmin, qmax)
        codes[:, :, i] = code
        errors[:, :, j] = (column - (code - zero) * scale) / upper[:, i, i][:, None]
        block[:, :, j + 1:] -= errors[:, :, j, None] * upper[:, None, i, i + 1:end]


@njit(cache=True, nogil=True)
def _block(block, upper, begin, scale, zero, qmin, qmax, codes, errors):
    groups, rows, width = block.shape
    for g in range(groups):
        for j in range(width):
            i = begin + j
            pivot = upper[g, i, i]
            for r in range(rows):
                w = block[g, r, j]
                code = min(max(np.rint(w / scale[g, r]) + zero[g, r], qmin), qmax)
                codes[g, r, i] = code
                error = (w - (code - zero[g, r]) * scale[g, r]) / pivot
                errors[g, r, j] = error
                for k in range(j + 1, width):
                    block[g, r, k] -= error * upper[g, i, begin + k]


@_interruptible
def gptq_block(block: np.ndarray, upper: np.ndarray, begin: int, scale: np.ndarray,
               zero: np.ndarray, qmin: int, qmax: int, codes: np.ndarray,
               errors: np.ndarray) -> None:
    _block(block, upper, begin, scale, zero, float(qmin), float(qmax), codes, errors)
