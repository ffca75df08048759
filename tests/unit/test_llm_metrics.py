"""The language-model metrics on hand-computed numbers (mpsearch/llm/_metrics.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mpsearch.llm import estimate, token_stats
from mpsearch.llm._metrics import log_softmax


def test_estimate_is_a_t_interval() -> None:
    """[1, 2, 3, 4]: mean 2.5, sample sd sqrt(5/3), t(3) = 3.182, half width 3.182 * sd / 2."""
    e = estimate(np.array([1.0, 2.0, 3.0, 4.0]))
    half = 3.182 * math.sqrt(5 / 3) / 2
    assert (e.mean, e.n) == (2.5, 4)
    assert e.low == pytest.approx(2.5 - half, abs=1e-12)
    assert e.high == pytest.approx(2.5 + half, abs=1e-12)
    big = estimate(np.arange(100, dtype=float))  # beyond the table: the normal 1.96
    assert big.high - big.mean == pytest.approx(1.96 * np.arange(100).std(ddof=1) / 10)
    one = estimate(np.array([0.25]))
    assert (one.mean, one.low, one.high, one.n) == (0.25, 0.25, 0.25, 1)


def test_token_stats_by_hand() -> None:
    """One window, two positions, vocabulary 2. Reference p = (0.5, 0.5) then (0.9, 0.1);
    candidate q = (0.8, 0.2) then (0.9, 0.1). KL at position 0: 0.5 ln(0.5/0.8) + 0.5
    ln(0.5/0.2) = 0.2231436; at position 1: 0 exactly. Targets (1, 0): losses -ln 0.2 and
    -ln 0.9. Top-1: the reference's (1, 0) against the candidate's (0, 0): agreement 1/2.
    The reference is float16 log-probabilities, hence the 1e-3 tolerance on the KL."""
    ref = np.log(np.array([[[0.5, 0.5], [0.9, 0.1]]])).astype(np.float16)
    cand = np.log(np.array([[[0.8, 0.2], [0.9, 0.1]]], np.float32)) + np.float32(3.0)
    kl, nll, agree = token_stats(cand, ref, np.array([[1, 0]]), np.array([[1, 0]]))
    expected_kl = (0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2) + 0.0) / 2
    assert kl[0] == pytest.approx(expected_kl, abs=1e-3)
    assert nll[0] == pytest.approx((-math.log(0.2) - math.log(0.9)) / 2, rel=1e-6)
    assert agree[0] == 0.5


def test_kl_of_a_distribution_with_itself_is_exactly_zero() -> None:
    logits = np.random.default_rng(0).normal(0, 4, (3, 5, 97)).astype(np.float32)
    ref = log_softmax(logits).astype(np.float16)
    kl, _, agree = token_stats(logits, ref, logits.argmax(-1), np.zeros((3, 5), np.int64))
    assert kl.tolist() == [0.0, 0.0, 0.0]
    assert agree.tolist() == [1.0, 1.0, 1.0]
