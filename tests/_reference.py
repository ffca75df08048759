"""NumPy fake quantization of a QDQ model: ``onnx.reference`` with vectorized Conv and MaxPool.

``onnx.reference`` runs QuantizeLinear/DequantizeLinear as the ONNX spec states (x / scale in
float32, round half to even, saturate), so evaluating a built QDQ model with it is NumPy fake
quantization of exactly what the builder emitted. Its Conv loops over groups in Python (a
depthwise layer is one loop turn per channel) and its strided MaxPool over windows; the two
replacements below compute the same sums and maxima with ``sliding_window_view`` + ``einsum``
and fall back to the originals outside the 2-D cases they handle. A mistake in them cannot make
a check pass: ONNX Runtime, which the tests compare against, shares none of this code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx


def _windows(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int],
             dilations: tuple[int, int]) -> np.ndarray:
    """(N, C, OH, OW, kh, kw) view of the 2-D windows of ``x``."""
    span = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True))
    view = np.lib.stride_tricks.sliding_window_view(x, span, axis=(2, 3))
    return view[:, :, ::strides[0], ::strides[1], ::dilations[0], ::dilations[1]]


def _conv2d(x: np.ndarray, w: np.ndarray, groups: int, pads: tuple[int, ...],
            strides: tuple[int, ...], dilations: tuple[int, ...]) -> np.ndarray:
    """Grouped 2-D convolution as one batched matmul per kernel tap, summed in float32."""
    top, left, bottom, right = pads
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, c, h, width = padded.shape
    m, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilations
    oh = (h - (kh - 1) * dh - 1) // sh + 1
    ow = (width - (kw - 1) * dw - 1) // sw + 1
    kernels = w.reshape(groups, m // groups, cg, kh, kw)
    y = np.zeros((groups, n * oh * ow, m // groups), np.float32)
    for i in range(kh):
        for j in range(kw):
            tap = padded[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                         j * dw:j * dw + sw * (ow - 1) + 1:sw]
            rows = tap.reshape(n, groups, cg, oh * ow).transpose(1, 0, 3, 2)
            y += np.matmul(rows.reshape(groups, n * oh * ow, cg),
                           kernels[:, :, :, i, j].transpose(0, 2, 1))
    return y.reshape(groups, n, oh, ow, m // groups).transpose(1, 0, 4, 2, 3).reshape(
        n, m, oh, ow)


def _ops() -> list[type]:
    from onnx.reference.ops import op_conv, op_max_pool

    class Conv(op_conv.Conv):  # type: ignore[misc]  # new_ops replaces by class name
        def _run(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None,
                 auto_pad: str | None = None, dilations: Any = None, group: int | None = None,
                 kernel_shape: Any = None, pads: Any = None, strides: Any = None,
                 ) -> tuple[np.ndarray]:
            if x.ndim != 4 or auto_pad not in (None, "NOTSET"):
                return super()._run(x, w, b, auto_pad, dilations, group,  # type: ignore[no-any-return]
                                    kernel_shape, pads, strides)
            y = _conv2d(x, w, group or 1, tuple(pads or (0, 0, 0, 0)),
                        tuple(strides or (1, 1)), tuple(dilations or (1, 1)))
            if b is not None:
                y = y + b.reshape(1, -1, 1, 1)
            return (y.astype(x.dtype),)

    class MaxPool(op_max_pool.MaxPool):  # type: ignore[misc]
        def _run(self, x: np.ndarray, auto_pad: str | None = None, ceil_mode: int | None = None,
                 dilations: Any = None, kernel_shape: Any = None, pads: Any = None,
                 storage_order: int | None = None, strides: Any = None) -> tuple[np.ndarray]:
            if (x.ndim != 4 or auto_pad not in (None, "NOTSET") or ceil_mode or any(pads or ())
                    or len(self.output) != 1):
                return super()._run(x, auto_pad, ceil_mode, dilations,  # type: ignore[no-any-return]
                                    kernel_shape, pads, storage_order, strides)
            win = _windows(x, tuple(kernel_shape), tuple(strides or (1, 1)),
                           tuple(dilations or (1, 1)))
            return (win.max(axis=(-2, -1)),)

    return [Conv, MaxPool]


def reference_run(model: onnx.ModelProto, output: str, feeds: dict[str, np.ndarray]
                  ) -> np.ndarray:
    """``output`` of ``model`` evaluated by onnx.reference at opset 21, where the standard Q/DQ
    ops take 16-bit types (below 21 the builder uses the ``com.microsoft`` ones)."""
    from onnx.reference import ReferenceEvaluator
    from onnx.version_converter import convert_version

    standard = onnx.ModelProto()
    standard.CopyFrom(model)
    for node in standard.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            node.domain = ""
    del standard.opset_import[:]
    standard.opset_import.extend(o for o in model.opset_import if o.domain != "com.microsoft")
    evaluator = ReferenceEvaluator(convert_version(standard, 21), new_ops=_ops())
    (value,) = evaluator.run([output], feeds)
    return np.asarray(value)
