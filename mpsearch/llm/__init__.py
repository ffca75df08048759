"""Decoder language models: ingest, text windows and scores against the FP32 model.

``load_language_model`` describes a decoder-only ONNX model (inputs, past key/values, the
quantizable weights by layer and projection); ``load_documents`` / ``make_windows`` turn a text
corpus into token windows split by document; ``Scorer`` scores weight assignments against the
FP32 model (KL divergence, perplexity, top-1 agreement, with 95 % intervals) in one session.
``WeightBank`` quantizes per-weight ``Choice``s and sizes them exactly; ``measure_sensitivity``
scores each weight alone at each candidate format; ``baselines`` are the hand-made mixes
(uniform RTN/HQQ/GPTQ, genai's k_quant_mixed, llama.cpp's Q4_K_M/Q3_K_M) and ``search_bits``
the per-projection search between them.
"""

from mpsearch.llm._baselines import baselines
from mpsearch.llm._choices import Choice, WeightBank, input_hessians, searchable
from mpsearch.llm._metrics import Estimate, LMScore, Scorer, estimate, token_stats
from mpsearch.llm._model import (
    PROJECTIONS,
    LanguageModel,
    LMWeight,
    initial_weights,
    load_language_model,
    with_weight_inputs,
)
from mpsearch.llm._search import LLMSearch, allocate, search_bits, to_assignment
from mpsearch.llm._sensitivity import Sensitivity, default_menu, measure_sensitivity
from mpsearch.llm._text import SPLITS, TextWindows, load_documents, load_tokenizer, make_windows

__all__ = ["PROJECTIONS", "SPLITS", "Choice", "Estimate", "LLMSearch", "LMScore", "LMWeight",
           "LanguageModel", "Scorer", "Sensitivity", "TextWindows", "WeightBank", "allocate",
           "baselines", "default_menu", "estimate", "initial_weights", "input_hessians",
           "load_documents", "load_language_model", "load_tokenizer", "make_windows",
           "measure_sensitivity", "search_bits", "searchable", "to_assignment", "token_stats",
           "with_weight_inputs"]
