"""Decoder language models: ingest, text windows and scores against the FP32 model.

``load_language_model`` describes a decoder-only ONNX model (inputs, past key/values, the
quantizable weights by layer and projection); ``load_documents`` / ``make_windows`` turn a text
corpus into token windows split by document; ``Scorer`` scores weight assignments against the
FP32 model (KL divergence, perplexity, top-1 agreement, with 95 % intervals) in one session.
"""

from mpsearch.llm._metrics import Estimate, LMScore, Scorer, estimate, token_stats
from mpsearch.llm._model import (
    PROJECTIONS,
    LanguageModel,
    LMWeight,
    initial_weights,
    load_language_model,
    with_weight_inputs,
)
from mpsearch.llm._text import SPLITS, TextWindows, load_documents, load_tokenizer, make_windows

__all__ = ["PROJECTIONS", "SPLITS", "Estimate", "LMScore", "LMWeight", "LanguageModel",
           "Scorer", "TextWindows", "estimate", "initial_weights", "load_documents",
           "load_language_model", "load_tokenizer", "make_windows", "token_stats",
           "with_weight_inputs"]
