"""A one-block pre-LN transformer with outlier channels, written with ``onnx.helper`` from a
seeded RNG (shared by the SmoothQuant and recovery-auto tests).

LayerNormalization -> Q/K/V MatMuls -> attention -> output MatMul -> residual; LayerNormalization
-> FFN MatMuls -> residual; token mean -> a LayerNorm decomposed as Paddle exports it -> Gemm
(transB). Three channels carry outliers, as real transformer activations do: the input's are 3x
wider and every LayerNorm's gamma is 25x larger there (beta +5). The Q and K weights are small
enough that the attention scores stay within a few units, as trained models keep them (scores
in the hundreds make the softmax amplify float32 rounding past 1e-5 by itself)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

C, T, D, F, K = 64, 16, 64, 128, 10
OUTLIERS = [3, 17, 40]


def transformer(seed: int = 0, *, post_ln: bool = False) -> onnx.ModelProto:
    """The test model; ``post_ln``: the second LayerNorm's output also feeds the residual Add
    (post-LN, as BERT), so that LayerNorm cannot be smoothed."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    arrays: dict[str, np.ndarray] = {}
    for i in (1, 2, 3):
        gamma, beta = (1 + 0.1 * rng.standard_normal(C)).astype(np.float32), w(C, scale=0.1)
        gamma[OUTLIERS] *= 25.0
        beta[OUTLIERS] += 5.0
        arrays[f"g{i}"], arrays[f"b{i}"] = gamma, beta
    arrays |= {
        "wq": w(C, D, scale=0.05 * C**-0.5), "wk": w(C, D, scale=0.05 * C**-0.5),
        "wv": w(C, D, scale=C**-0.5),
        "wo": w(D, C, scale=D**-0.5), "inv_sqrt_d": np.array(D**-0.5, np.float32),
        "w1": w(C, F, scale=C**-0.5), "w2": w(F, C, scale=F**-0.5),
        "cls_w": w(K, C, scale=C**-0.5), "cls_b": w(K, scale=0.1),
        "two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32)}
    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", "g1", "b1"], ["h1"], name="ln1", axis=-1),
        n("MatMul", ["h1", "wq"], ["q"], name="q"), n("MatMul", ["h1", "wk"], ["k"], name="k"),
        n("MatMul", ["h1", "wv"], ["v"], name="v"),
        n("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["qk"], name="scores"),
        n("Mul", ["qk", "inv_sqrt_d"], ["qk_s"], name="scale"),
        n("Softmax", ["qk_s"], ["p"], name="softmax", axis=-1),
        n("MatMul", ["p", "v"], ["ctx"], name="context"),
        n("MatMul", ["ctx", "wo"], ["att"], name="o"),
        n("Add", ["x", "att"], ["r1"], name="res1"),
        n("LayerNormalization", ["r1", "g2", "b2"], ["h2"], name="ln2", axis=-1),
        n("MatMul", ["h2", "w1"], ["f1"], name="ffn1"),
        n("Relu", ["f1"], ["f1r"], name="relu"),
        n("MatMul", ["f1r", "w2"], ["f2"], name="ffn2"),
        n("Add", ["h2" if post_ln else "r1", "f2"], ["r2"], name="res2"),
        n("ReduceMean", ["r2"], ["pooled"], name="pool", axes=[1], keepdims=0),
        n("ReduceMean", ["pooled"], ["mu"], name="ln3_mean", axes=[-1], keepdims=1),
        n("Sub", ["pooled", "mu"], ["xc"], name="ln3_sub"),
        n("Pow", ["xc", "two"], ["sq"], name="ln3_pow"),
        n("ReduceMean", ["sq"], ["var"], name="ln3_var", axes=[-1], keepdims=1),
        n("Add", ["var", "eps"], ["var_eps"], name="ln3_eps"),
        n("Sqrt", ["var_eps"], ["std"], name="ln3_sqrt"),
        n("Div", ["xc", "std"], ["normed"], name="ln3_div"),
        n("Mul", ["normed", "g3"], ["scaled"], name="ln3_gamma"),
        n("Add", ["scaled", "b3"], ["h3"], name="ln3_beta"),
        n("Gemm", ["h3", "cls_w", "cls_b"], ["logits"], name="classifier", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_pre_ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             ["batch", T, C])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", K])],
        initializer=[numpy_helper.from_array(v, k) for k, v in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def outlier_inputs(n: int, seed: int = 1) -> np.ndarray:
    """``n`` inputs [n, T, C] with the outlier channels 3x wider."""
    x = np.random.default_rng(seed).standard_normal((n, T, C))
    x[..., OUTLIERS] *= 3.0
    return x.astype(np.float32)
