"""Fixtures shared by the test modules: the committed fixture zoo and its digits data."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpsearch.data import Dataset, load_data

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """``tests/fixtures``: the ONNX zoo built by ``build_fixtures.py`` and ``digits_eval.npz``."""
    return FIXTURES


@pytest.fixture(scope="session")
def digits() -> Dataset:
    """The 450 held-out scikit-learn digits every fixture model was scored on."""
    return load_data(FIXTURES / "digits_eval.npz")
