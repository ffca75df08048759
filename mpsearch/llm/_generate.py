"""Greedy generation with the KV cache, its agreement with FP32, and latency as a model is used.

Consumes a :class:`~mpsearch.llm.LanguageModel` (the names of its inputs, pasts and logits) and
an open session of it or of an exported variant (``MatMulNBits`` runs in the same session
type); produces greedy continuations of prompts, how far a quantized model's continuations
agree with FP32's, and the two latencies a deployment engineer quotes: prefill tokens per
second and decode milliseconds per token.

Decoding feeds each step's ``present.*`` outputs back as the next step's ``past_key_values.*``
inputs, as onnxruntime-genai does; a graph without past inputs reruns the whole sequence per
token. Agreement is counted up to each continuation's first differing token: after it, the two
models continue different texts and a position-by-position match means nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mpsearch.clock import time_runs
from mpsearch.errors import ModelError
from mpsearch.llm._model import LanguageModel
from mpsearch.runtime import Session

__all__ = ["Agreement", "LLMLatency", "agreement", "greedy", "llm_latency"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Agreement:
    """Of ``tokens`` generated tokens over ``prompts`` prompts, ``agreed`` came before the
    first token where the model left FP32's continuation; ``identical`` prompts never left it."""

    prompts: int
    tokens: int
    agreed: int
    identical: int

    @property
    def share(self) -> float:
        """The share of generated tokens that agree with FP32's (up to the first difference)."""
        return self.agreed / self.tokens if self.tokens else float("nan")


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMLatency:
    """Prefill of a ``prompt``-token prompt and one decode step after it, batch 1: median
    seconds and the runs' spread (:mod:`mpsearch.clock`)."""

    prompt: int
    prefill_s: float
    prefill_spread: tuple[float, float]
    decode_s: float
    decode_spread: tuple[float, float]

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt / self.prefill_s

    @property
    def decode_ms_per_token(self) -> float:
        return 1e3 * self.decode_s


def _presents(model: LanguageModel, session: Session) -> list[tuple[str, str]]:
    """(past input, present output) pairs: ``past_key_values.3.key`` <- ``present.3.key``."""
    pairs = []
    for name, _ in model.past:
        wanted = name.replace("past_key_values", "present")
        if wanted not in session.output_names:
            raise ModelError(f"{model.path}: no output '{wanted}' for the past input '{name}'; "
                             "export the model with its present key/value outputs")
        pairs.append((name, wanted))
    return pairs


def _step(model: LanguageModel, ids: np.ndarray, start: int, past: dict[str, np.ndarray]
          ) -> dict[str, np.ndarray]:
    """Feeds of ``ids`` [1, n] at positions ``start``.. after ``past`` (empty: a prefill)."""
    feeds = model.feeds(ids)
    if model.attention_mask:
        feeds[model.attention_mask] = np.ones((1, start + ids.shape[1]), np.int64)
    if model.position_ids:
        feeds[model.position_ids] = np.arange(start, start + ids.shape[1], dtype=np.int64)[None]
    feeds.update(past)
    return feeds


def greedy(session: Session, model: LanguageModel, prompt: Sequence[int], new_tokens: int
           ) -> list[int]:
    """The ``new_tokens`` token ids ``session`` generates greedily after ``prompt``."""
    ids = np.asarray(prompt, np.int64)[None]
    if not model.past:  # no KV cache: the whole sequence each step
        out: list[int] = []
        for _ in range(new_tokens):
            logits = session.run(model.feeds(ids), [model.logits])[model.logits]
            out.append(int(logits[0, -1].argmax()))
            ids = np.concatenate([ids, [[out[-1]]]], axis=1)
        return out
    pairs = _presents(model, session)
    names = [model.logits, *(present for _, present in pairs)]
    past: dict[str, np.ndarray] = {}
    start, out = 0, []
    for _ in range(new_tokens):
        result = session.run(_step(model, ids, start, past), names)
        out.append(int(result[model.logits][0, -1].argmax()))
        start += ids.shape[1]
        past = {name: result[present] for name, present in pairs}
        ids = np.asarray([[out[-1]]], np.int64)
    return out


def agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]
              ) -> Agreement:
    """How far each of ``other``'s continuations follows ``reference``'s (same prompts)."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference continuations but {len(other)} others")
    tokens = agreed = identical = 0
    for ref, mine in zip(reference, other, strict=True):
        tokens += len(ref)
        same = next((i for i, (a, b) in enumerate(zip(ref, mine, strict=False)) if a != b),
                    min(len(ref), len(mine)))
        agreed += same
        identical += int(same == len(ref) == len(mine))
    return Agreement(prompts=len(reference), tokens=tokens, agreed=agreed, identical=identical)


def llm_latency(sessions: Sequence[Session], model: LanguageModel, prompt: Sequence[int], *,
                span: float = 0.0) -> tuple[LLMLatency, ...]:
    """Prefill of ``prompt`` and one decode step after it, for each of ``sessions`` (models
    with ``model``'s inputs: FP32 and an export, say), every run interleaved in one clock."""
    ids = np.asarray(prompt, np.int64)[None]
    prefill = _step(model, ids, 0, {})
    feeds: list[dict[str, np.ndarray]] = []
    for session in sessions:
        if model.past:
            pairs = _presents(model, session)
            result = session.run(prefill, [present for _, present in pairs])
            past = {name: result[present] for name, present in pairs}
            feeds += [prefill, _step(model, ids[:, -1:], ids.shape[1], past)]
        else:
            feeds += [prefill, model.feeds(np.concatenate([ids, ids[:, -1:]], axis=1))]
    outputs = [model.logits]
    runs = [(lambda f, s=s: s.run(f, outputs)) for s in sessions for _ in range(2)]
    timed = time_runs(runs, feeds, span=span)
    return tuple(LLMLatency(prompt=ids.shape[1], prefill_s=first.seconds,
                            prefill_spread=(first.low, first.high), decode_s=second.seconds,
                            decode_spread=(second.low, second.high))
                 for first, second in zip(timed[::2], timed[1::2], strict=True))
