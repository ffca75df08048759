"""The bundled demo: a small digits classifier that uniform INT8 hurts, and its labelled data.

``DEMO_MODEL`` is a small residual CNN in ONNX (opset 17, input ``input`` [batch, 1, 16, 16],
output ``logits`` [batch, 10]) whose residual stream carries a dead channel that three layers
read through outlier weights (FP32 unchanged), so a mixed-precision search has a visible
trade-off on every CPU: uniform INT8 loses tens of points to weight quantization error that no
recovery method removes, and float16 or 16-bit weights on those layers win them back for a few
kB, at INT8's speed where only the linear layer needs them.
``DEMO_DATA`` is an ``.npz`` with ``input`` (float32 [N, 1, 16, 16], already normalized) and
``labels`` (int64 [N]): held-out scikit-learn digits never used for training. Both files are
written by ``tests/fixtures/build_demo.py``.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["DEMO_DATA", "DEMO_MODEL"]

_HERE = files(__name__)

DEMO_MODEL: Path = Path(str(_HERE / "demo.onnx"))
"""Path of the bundled demo ONNX model."""

DEMO_DATA: Path = Path(str(_HERE / "demo_data.npz"))
"""Path of the bundled demo data (``input`` and ``labels`` arrays)."""
