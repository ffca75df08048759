"""Scores of a language model's weight assignment against its FP32 weights, on token windows.

Consumes a :class:`~mpsearch.llm.LanguageModel` and windows ``[n, length]``; produces an
:class:`LMScore`: the mean per-token KL divergence of the candidate's next-token distribution
from FP32's (the search objective, in nats), perplexity on the windows' own next tokens, and
top-1 next-token agreement with FP32, each with a 95 % interval over windows (Student's t on
the per-window means; perplexity's interval is exp of the mean log-loss's).

:class:`Scorer` opens one ONNX Runtime session of a variant of the model whose quantizable
weights are graph inputs; ``score(weights, windows)`` feeds the given arrays (dequantized
weights, same shape as the initializer) and the FP32 ones for the rest, so a search evaluates
any number of assignments without building a session per trial. The FP32 reference of a window
set is kept as float16 log-probabilities while they fit in ``reference_bytes``; beyond that it
is recomputed beside the candidate, batch by batch (two passes a window instead of one). Both
round the candidate's log-probabilities to float16 before the KL difference, so the FP32
weights score a KL of exactly 0 and both modes give the same numbers.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpsearch.errors import DataError
from mpsearch.llm._model import LanguageModel, initial_weights, with_weight_inputs
from mpsearch.runtime import Session, create_session

__all__ = ["Estimate", "LMScore", "Scorer", "estimate", "token_stats"]

logger = logging.getLogger(__name__)

# Student's t, two-sided 95 %, degrees of freedom 1..30 (beyond: the normal 1.96).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """A mean over windows with its 95 % interval [low, high] over ``n`` windows."""

    mean: float
    low: float
    high: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}


@dataclass(frozen=True, slots=True, kw_only=True)
class LMScore:
    """A candidate against FP32 on one window set; ``passes``: window forward passes run."""

    kl: Estimate
    perplexity: Estimate
    agreement: Estimate
    tokens: int
    passes: int

    def to_dict(self) -> dict[str, Any]:
        return {"kl": self.kl.to_dict(), "perplexity": self.perplexity.to_dict(),
                "agreement": self.agreement.to_dict(), "tokens": self.tokens,
                "passes": self.passes}


def estimate(values: np.ndarray) -> Estimate:
    """Mean and 95 % t-interval of per-window values (a zero-width interval for one window)."""
    values = np.asarray(values, np.float64)
    n = len(values)
    mean = float(values.mean())
    if n < 2:
        return Estimate(mean=mean, low=mean, high=mean, n=n)
    half = (_T95[n - 2] if n - 1 <= len(_T95) else 1.96) * float(values.std(ddof=1)) / n ** .5
    return Estimate(mean=mean, low=mean - half, high=mean + half, n=n)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities over the last axis, in float32."""
    logits = np.asarray(logits, np.float32)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    out: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


def token_stats(logits: np.ndarray, reference: np.ndarray, top: np.ndarray,
                targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-window mean KL(reference || candidate), log-loss of ``targets`` and top-1 agreement
    with ``top``, for candidate ``logits`` [b, t, vocab] and the reference's float16
    log-probabilities [b, t, vocab]; ``targets`` and ``top`` are [b, t]."""
    candidate = log_softmax(logits)
    rounded = candidate.astype(np.float16).astype(np.float32)
    ref = reference.astype(np.float32)
    kl = (np.exp(ref) * (ref - rounded)).sum(axis=-1)
    nll = -np.take_along_axis(candidate, targets[..., None], axis=-1)[..., 0]
    agree = candidate.argmax(axis=-1) == top
    return kl.mean(axis=1), nll.mean(axis=1), agree.mean(axis=1)


@dataclass(frozen=True, slots=True)
class _Reference:
    logp: np.ndarray  # [n, length - 1, vocab] float16
    top: np.ndarray  # [n, length - 1] int64


class Scorer:
    """One session that scores weight assignments of ``model`` against its FP32 weights.

    ``weights`` names the weights fed per run (default: every quantizable weight of the
    model); ``batch`` windows run at a time; ``reference_bytes`` bounds the memory of the kept
    FP32 references. ``passes`` counts every window forward pass this scorer ran."""

    def __init__(self, model: LanguageModel, *, weights: tuple[str, ...] | None = None,
                 batch: int = 2, reference_bytes: int = 1 << 30, threads: int = 2) -> None:
        import onnx

        self.model = model
        self.names = weights if weights is not None else tuple(w.name for w in model.weights)
        proto = onnx.load(str(model.path))
        self.fp32 = initial_weights(proto, self.names)
        with_weight_inputs(proto, self.names)
        self._session = create_session(proto, threads=threads, label=str(model.path))
        del proto
        self.batch = batch
        self.reference_bytes = reference_bytes
        self.passes = 0
        self._references: dict[str, _Reference] = {}

    def score(self, weights: Mapping[str, np.ndarray] | None, windows: np.ndarray) -> LMScore:
        """Score the candidate (``weights`` replacing those FP32 weights; None: FP32 itself)
        on ``windows`` [n, length] of token ids."""
        feeds = self._weights(weights)
        return self._score(lambda rows: self._run(rows, feeds), windows, fp32=weights is None)

    def score_session(self, session: Session, windows: np.ndarray) -> LMScore:
        """Score another model with this one's inputs and vocabulary (an export of it, its
        weights in other ops) against this scorer's FP32 weights on ``windows``."""
        def run(rows: np.ndarray) -> np.ndarray:
            self.passes += len(rows)
            out = session.run(self.model.feeds(rows), [self.model.logits])[self.model.logits]
            return np.asarray(out[:, :-1], np.float32)
        return self._score(run, windows, fp32=False)

    def _score(self, candidate: Callable[[np.ndarray], np.ndarray], windows: np.ndarray, *,
               fp32: bool) -> LMScore:
        windows = self._check(windows)
        start = self.passes
        reference = self._reference(windows)
        kl: list[np.ndarray] = []
        nll: list[np.ndarray] = []
        agree: list[np.ndarray] = []
        for rows, ref_logp, ref_top in self._batches(windows, reference):
            if ref_logp is None or ref_top is None:  # streamed: FP32 beside the candidate
                ref_logits = self._run(rows, self.fp32)
                ref_logp = log_softmax(ref_logits).astype(np.float16)
                ref_top = ref_logits.argmax(axis=-1)
                logits = ref_logits if fp32 else candidate(rows)
            else:
                logits = candidate(rows)
            stats = token_stats(logits, ref_logp, ref_top, rows[:, 1:])
            for values, out in zip(stats, (kl, nll, agree), strict=True):
                out.append(values)
        loss = estimate(np.concatenate(nll))
        return LMScore(
            kl=estimate(np.concatenate(kl)), agreement=estimate(np.concatenate(agree)),
            perplexity=Estimate(mean=math.exp(loss.mean), low=math.exp(loss.low),
                                high=math.exp(loss.high), n=loss.n),
            tokens=int(windows.shape[0] * (windows.shape[1] - 1)), passes=self.passes - start)

    def logits(self, weights: Mapping[str, np.ndarray] | None, windows: np.ndarray
               ) -> np.ndarray:
        """The candidate's logits [n, length, vocab] (float32) on a few windows."""
        windows = self._check(windows)
        return self._run(windows, self._weights(weights), drop_last=False)

    def _weights(self, weights: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        feeds = dict(self.fp32)
        for name, value in (weights or {}).items():
            if name not in feeds:
                raise DataError(f"{self.model.path}: no fed weight '{name}'; give weights by "
                                f"the names load_language_model lists ({self.names[:2]}...)")
            if value.shape != feeds[name].shape:
                raise DataError(f"{self.model.path}: weight '{name}' has shape "
                                f"{list(value.shape)}, the model's is {list(feeds[name].shape)}")
            feeds[name] = np.ascontiguousarray(value, dtype=np.float32)
        return feeds

    def _check(self, windows: np.ndarray) -> np.ndarray:
        windows = np.ascontiguousarray(windows, dtype=np.int64)
        if windows.ndim != 2 or windows.shape[0] == 0 or windows.shape[1] < 2:
            raise DataError(f"windows of shape {list(windows.shape)}: give token windows "
                            "[n >= 1, length >= 2]")
        if int(windows.max()) >= self.model.vocab or int(windows.min()) < 0:
            raise DataError(f"token ids outside the model's vocabulary of {self.model.vocab}; "
                            "tokenize with the model's own tokenizer")
        return windows

    def _reference(self, windows: np.ndarray) -> _Reference | None:
        """The kept FP32 reference of ``windows`` (computed now if it fits), or None."""
        key = hashlib.sha1(windows.tobytes() + bytes(str(windows.shape), "ascii")).hexdigest()
        if key in self._references:
            return self._references[key]
        size = windows.shape[0] * (windows.shape[1] - 1) * self.model.vocab * 2
        kept = sum(r.logp.nbytes for r in self._references.values())
        if kept + size > self.reference_bytes:
            logger.info("FP32 reference of %d windows (%d MB) does not fit; streaming it",
                        len(windows), size >> 20)
            return None
        logp = np.empty((*windows[:, 1:].shape, self.model.vocab), np.float16)
        top = np.empty(windows[:, 1:].shape, np.int64)
        for start in range(0, len(windows), self.batch):
            logits = self._run(windows[start:start + self.batch], self.fp32)
            logp[start:start + len(logits)] = log_softmax(logits)
            top[start:start + len(logits)] = logits.argmax(axis=-1)
        self._references[key] = _Reference(logp, top)
        return self._references[key]

    def _batches(self, windows: np.ndarray, reference: _Reference | None
                 ) -> Iterator[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]:
        for start in range(0, len(windows), self.batch):
            stop = start + self.batch
            if reference is None:
                yield windows[start:stop], None, None
            else:
                yield windows[start:stop], reference.logp[start:stop], reference.top[start:stop]

    def _run(self, rows: np.ndarray, weights: Mapping[str, np.ndarray], *,
             drop_last: bool = True) -> np.ndarray:
        """Logits of a full-sequence pass with an empty past; the last position (no target)
        dropped unless asked for."""
        feeds = {**self.model.feeds(rows), **weights}
        logits = self._session.run(feeds, [self.model.logits])[self.model.logits]
        self.passes += len(rows)
        return logits[:, :-1] if drop_last else logits
