"""The hand-made weight-only mixes a per-projection search is compared with, as assignments.

* **Uniform** (ONNX Runtime's ``MatMulNBitsQuantizer`` defaults): RTN and GPTQ asymmetric with
  uint8 zero points, HQQ with float zero points (as ORT's HQQ writes them), at 4 bits in blocks
  of 32 and 128, every projection and the ``lm_head``.
* **k_quant_mixed** (onnxruntime-genai's model builder): k-quant, symmetric, blocks of 32; the
  ``lm_head`` and, on the layers ``i < n/8 or i >= 7n/8 or (i - round(n/8)) % 3 == 2``, the
  packed ``qkv_proj`` (q, k and v: the CPU builder packs them), ``v_proj`` and ``down_proj`` at
  8 bits.
* **llama.cpp Q4_K_M / Q3_K_M** (``llama_tensor_get_type_impl`` in ``src/llama-quant.cpp``,
  ``use_more_bits(i, n) = i < n/8 || i >= 7*n/8 || (i - n/8) % 3 == 2`` in integer arithmetic).
  Q4_K_M: base Q4_K; ``attn_v`` and ``ffn_down`` on use_more_bits layers and ``output`` at Q6_K.
  Q3_K_M: base Q3_K; ``attn_v`` Q5_K on layers 0-1, else Q4_K; ``attn_output`` Q4_K;
  ``ffn_down`` Q5_K below ``n/16``, else Q4_K (llama-style models); ``output`` Q6_K.
  ggml types map to our formats (:data:`GGML`): 8-bit and 5/6-bit types to ``w8b32s``, Q4_K
  to ``w4b32a`` (blocks of 32 with a minimum), Q3_K up to ``w4b32a`` or down to ``w2b32a``; all
  by the k-quant search. llama.cpp's own fallback for rows not a multiple of 256 (Q4_K -> Q5_0,
  Q6_K -> Q8_0) is not applied: the rule's layer choice is what is compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mpsearch.errors import SpecError
from mpsearch.llm._choices import Choice

__all__ = ["GGML", "baselines", "genai_int8_layers", "k_quant_mixed", "llama_cpp", "uniform",
           "use_more_bits"]

#: ggml type -> our format; Q3_K has two readings (no 3-bit format here)
GGML = {"Q8_0": "w8b32s", "Q6_K": "w8b32s", "Q5_K": "w8b32s", "Q4_K": "w4b32a",
        "Q3_K_up": "w4b32a", "Q3_K_down": "w2b32a"}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's layer rule, C integer arithmetic (``n/8`` truncates; ``%`` keeps the sign
    of the dividend)."""
    eighth = n // 8
    diff = i - eighth
    rem = diff - int(diff / 3) * 3  # C's remainder
    return i < eighth or i >= 7 * n // 8 or rem == 2


def genai_int8_layers(n: int) -> tuple[int, ...]:
    """Layers onnxruntime-genai's ``k_quant_mixed`` raises to 8 bits (Python arithmetic, as
    its builder.py: ``round`` is Python's, ``%`` Python's)."""
    return tuple(i for i in range(n)
                 if i < n / 8 or i >= 7 * n / 8 or (i - round(n / 8)) % 3 == 2)


def _layers(keys: Sequence[str]) -> int:
    return 1 + max((int(k.split(".")[0]) for k in keys if k[0].isdigit()), default=-1)


def _role(key: str) -> tuple[int | None, str]:
    if key[0].isdigit():
        layer, role = key.split(".", 1)
        return int(layer), role
    return None, key


def uniform(keys: Sequence[str], fmt: str, method: str) -> dict[str, Choice]:
    return dict.fromkeys(keys, Choice(fmt=fmt, method=method))


def k_quant_mixed(keys: Sequence[str]) -> dict[str, Choice]:
    raised = set(genai_int8_layers(_layers(keys)))
    out = {}
    for key in keys:
        layer, role = _role(key)
        high = role == "lm_head" or (layer in raised and role in ("q", "k", "v", "down"))
        out[key] = Choice(fmt="w8b32s" if high else "w4b32s", method="kquant")
    return out


def _q4_k_m(layer: int | None, role: str, n: int) -> str:
    if role == "lm_head":
        return "Q6_K"
    if role in ("v", "down") and layer is not None and use_more_bits(layer, n):
        return "Q6_K"
    return "Q4_K"


def _q3_k_m(layer: int | None, role: str, n: int) -> str:
    if role == "lm_head":
        return "Q6_K"
    if role == "v":
        return "Q5_K" if layer is not None and layer < 2 else "Q4_K"
    if role == "o":
        return "Q4_K"
    if role == "down":
        return "Q5_K" if layer is not None and layer < n // 16 else "Q4_K"
    return "Q3_K"


def llama_cpp(keys: Sequence[str], mix: str, q3: str = "down") -> dict[str, Choice]:
    """The ``mix`` (``Q4_K_M`` or ``Q3_K_M``) rule on these weights; ``q3``: Q3_K read as
    ``w4b32a`` (``up``) or ``w2b32a`` (``down``)."""
    rules = {"Q4_K_M": _q4_k_m, "Q3_K_M": _q3_k_m}
    if mix not in rules:
        raise SpecError(f"llama.cpp mix '{mix}' not implemented; use one of {sorted(rules)}")
    n = _layers(keys)
    out = {}
    for key in keys:
        ggml = rules[mix](*_role(key), n)
        out[key] = Choice(fmt=GGML[f"{ggml}_{q3}" if ggml == "Q3_K" else ggml], method="kquant")
    return out


def baselines(keys: Sequence[str]) -> dict[str, Mapping[str, Choice]]:
    """Every baseline by name, on the searchable weight ``keys``."""
    out: dict[str, Mapping[str, Choice]] = {}
    for block in (32, 128):
        out[f"RTN w4 b{block}"] = uniform(keys, f"w4b{block}a", "rtn")
        out[f"HQQ w4 b{block}"] = uniform(keys, f"w4b{block}f", "hqq")
        out[f"GPTQ w4 b{block}"] = uniform(keys, f"w4b{block}a", "gptq")
    out["k_quant_mixed"] = k_quant_mixed(keys)
    out["llama.cpp Q4_K_M"] = llama_cpp(keys, "Q4_K_M")
    out["llama.cpp Q3_K_M (Q3_K as w4)"] = llama_cpp(keys, "Q3_K_M", "up")
    out["llama.cpp Q3_K_M (Q3_K as w2)"] = llama_cpp(keys, "Q3_K_M", "down")
    return out
