"""The bundled demo: a small digits classifier that uniform INT8 hurts, and its labelled data.

``DEMO_MODEL`` is an ONNX CNN (ResNet family, opset 17, input ``input`` [batch, 1, 16, 16],
output ``logits`` [batch, 10]) with one outlier activation channel, so a mixed-precision search
has a visible trade-off: uniform INT8 loses several points of accuracy, 16-bit activations on a
few tensors win them back. ``DEMO_DATA`` is an ``.npz`` with ``input`` (float32 [N, 1, 16, 16],
already normalized) and ``labels`` (int64 [N]): held-out scikit-learn digits never used for
training. Both files are written by ``tests/fixtures/build_fixtures.py``.
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
