"""Benchmark-scale ONNX graphs with deterministic random weights (plain ``onnx.helper`` + NumPy).

``resnet18`` and ``mobilenetv2`` build the exact torchvision architectures (ImageNet heads, 1,000
classes) at opset 17 with input ``input`` float32 [batch, 3, 224, 224] (symbolic batch by
default) and output ``logits`` [batch, 1000]. Weights come from ``np.random.default_rng(seed)``:
He-normal for every conv followed by an activation, a smaller gain for the last conv of each
residual branch (so the residual stream grows slowly through the depth) and for the classifier,
and small random biases. BatchNorm is folded, as a deployed model has it: every Conv carries a
bias and there is no BatchNormalization node.

Parameter accounting: the published counts (ResNet-18 11,689,512; MobileNetV2 3,504,872) count
each BatchNorm's gamma and beta (2 x C) while the folded Conv keeps one bias (C), so the graph's
initializers hold ``published - sum(BN channels)`` elements. Every Conv in both architectures was
followed by a BatchNorm in torchvision, so ``torchvision_parameter_count`` (initializer elements
plus Conv bias elements) reproduces the published number exactly.

"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "MOBILENETV2_PARAMS",
    "RESNET18_PARAMS",
    "mobilenetv2",
    "parameter_count",
    "resnet18",
    "save",
    "torchvision_parameter_count",
]

OPSET = 17
RESNET18_PARAMS = 11_689_512
MOBILENETV2_PARAMS = 3_504_872
NUM_CLASSES = 1000
IMAGE = 224

# MobileNetV2 inverted-residual settings (expand ratio t, channels c, repeats n, stride s).
_MBV2_SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class _Builder:
    """Accumulates nodes and initializers and counts MACs as it goes (mutable, private)."""

    __slots__ = ("_count", "_relu6", "inits", "macs", "nodes", "rng")

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.macs = 0
        self._count = 0
        self._relu6 = False

    def name(self, op: str) -> str:
        self._count += 1
        return f"{op.lower()}_{self._count}"

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def conv(
        self,
        x: str,
        hw: int,
        cin: int,
        cout: int,
        k: int,
        stride: int = 1,
        groups: int = 1,
        gain: float = 2.0,
    ) -> tuple[str, int]:
        """Conv with folded BatchNorm: He-normal weights times ``gain``, small random bias."""
        node = self.name("Conv")
        fan_in = cin // groups * k * k
        std = np.float32(np.sqrt(gain / fan_in))
        w = self.rng.standard_normal((cout, cin // groups, k, k), dtype=np.float32) * std
        b = self.rng.standard_normal(cout, dtype=np.float32) * np.float32(0.05)
        pad = k // 2
        out_hw = (hw + 2 * pad - k) // stride + 1
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, self.const(f"{node}.weight", w), self.const(f"{node}.bias", b)],
                [node],
                name=node,
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad] * 4,
                group=groups,
            )
        )
        self.macs += cout * out_hw * out_hw * fan_in
        return node, out_hw

    def op(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        node = self.name(op_type)
        self.nodes.append(helper.make_node(op_type, inputs, [node], name=node, **attrs))
        return node

    def relu6(self, x: str) -> str:
        """Clip(0, 6), with its two scalar bounds shared by every ReLU6 of the graph."""
        if not self._relu6:
            self.const("relu6.min", np.array(0.0, dtype=np.float32))
            self.const("relu6.max", np.array(6.0, dtype=np.float32))
            self._relu6 = True
        return self.op("Clip", [x, "relu6.min", "relu6.max"])

    def classifier(self, x: str, channels: int) -> str:
        """GlobalAveragePool -> Flatten -> Gemm(channels -> 1000) named ``logits``."""
        pooled = self.op("Flatten", [self.op("GlobalAveragePool", [x])], axis=1)
        std = np.float32(np.sqrt(1.0 / channels))
        w = self.rng.standard_normal((NUM_CLASSES, channels), dtype=np.float32) * std
        b = self.rng.standard_normal(NUM_CLASSES, dtype=np.float32) * np.float32(0.01)
        self.nodes.append(
            helper.make_node(
                "Gemm",
                [pooled, self.const("fc.weight", w), self.const("fc.bias", b)],
                ["logits"],
                name="fc",
                transB=1,
            )
        )
        self.macs += channels * NUM_CLASSES
        return "logits"

    def model(self, graph_name: str, batch: str | int) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            graph_name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, IMAGE, IMAGE])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, NUM_CLASSES])],
            initializer=self.inits,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="mpsearch-benchmarks",
        )
        model.ir_version = 8
        helper.set_model_props(model, {"macs": str(self.macs)})
        return model


def _basic_block(
    b: _Builder, x: str, hw: int, cin: int, cout: int, stride: int
) -> tuple[str, int]:
    out, out_hw = b.conv(x, hw, cin, cout, 3, stride)
    out, _ = b.conv(b.op("Relu", [out]), out_hw, cout, cout, 3, gain=0.5)
    skip = x
    if stride != 1 or cin != cout:
        skip, _ = b.conv(x, hw, cin, cout, 1, stride, gain=1.0)
    return b.op("Relu", [b.op("Add", [out, skip])]), out_hw


def resnet18(batch: str | int = "N", seed: int = 0) -> onnx.ModelProto:
    """torchvision ``resnet18`` (BasicBlock x [2, 2, 2, 2]) with folded BN and random weights."""
    b = _Builder(np.random.default_rng(seed))
    x, hw = b.conv("input", IMAGE, 3, 64, 7, 2)
    x = b.op("Relu", [x])
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    hw = (hw + 2 - 3) // 2 + 1
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for i in range(2):
            x, hw = _basic_block(b, x, hw, cin, cout, stride if i == 0 else 1)
            cin = cout
    b.classifier(x, 512)
    return b.model("resnet18", batch)


def _inverted_residual(
    b: _Builder, x: str, hw: int, cin: int, cout: int, stride: int, expand: int
) -> tuple[str, int]:
    hidden = cin * expand
    out = x
    if expand != 1:
        out, _ = b.conv(out, hw, cin, hidden, 1)
        out = b.relu6(out)
    out, out_hw = b.conv(out, hw, hidden, hidden, 3, stride, groups=hidden)
    out = b.relu6(out)
    residual = stride == 1 and cin == cout
    out, _ = b.conv(out, out_hw, hidden, cout, 1, gain=0.5 if residual else 1.0)
    return (b.op("Add", [x, out]) if residual else out), out_hw


def mobilenetv2(batch: str | int = "N", seed: int = 0) -> onnx.ModelProto:
    """torchvision ``mobilenet_v2`` (width 1.0) with folded BN, ReLU6 as Clip(0, 6)."""
    b = _Builder(np.random.default_rng(seed))
    x, hw = b.conv("input", IMAGE, 3, 32, 3, 2)
    x = b.relu6(x)
    cin = 32
    for t, c, n, s in _MBV2_SETTINGS:
        for i in range(n):
            x, hw = _inverted_residual(b, x, hw, cin, c, s if i == 0 else 1, t)
            cin = c
    x, hw = b.conv(x, hw, cin, 1280, 1)
    b.classifier(b.relu6(x), 1280)
    return b.model("mobilenetv2", batch)


def parameter_count(model: onnx.ModelProto) -> int:
    """Elements in all initializers (the folded graph's parameters)."""
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer if len(t.dims) > 0)


def torchvision_parameter_count(model: onnx.ModelProto) -> int:
    """Parameters as torchvision counts them: each Conv bias is a folded BN (gamma and beta)."""
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    conv_bias = sum(sizes[n.input[2]] for n in model.graph.node if n.op_type == "Conv")
    return parameter_count(model) + conv_bias


def save(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Write ``model`` atomically (temp file in the same folder, then rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        onnx.save(model, tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def _check(model: onnx.ModelProto) -> str:
    """Run in onnxruntime at batch 1 and 2; return a one-line summary or raise."""
    import onnxruntime as ort

    onnx.checker.check_model(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, ["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    stats = []
    for n in (1, 2):
        x = rng.standard_normal((n, 3, IMAGE, IMAGE), dtype=np.float32)
        (logits,) = sess.run(["logits"], {"input": x})
        if logits.shape != (n, NUM_CLASSES) or not np.isfinite(logits).all():
            raise ValueError(f"bad logits at batch {n}: shape {logits.shape}")
        if float(logits.std()) == 0.0:
            raise ValueError(f"constant logits at batch {n}")
        stats.append(f"batch {n}: logits std {logits.std():.3g}, |max| {abs(logits).max():.3g}")
    return "; ".join(stats)
