"""The calibration cache of a run directory under ``recovery: auto``: a fresh run calibrates
the plain graph and each candidate transform without taking them for another model's table,
saves the chosen graph's table, and the next prepare of the same run loads it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from mpsearch.demo import DEMO_DATA, DEMO_MODEL
from mpsearch.pipeline import prepare_inputs

pytestmark = pytest.mark.slow  # two prepares of the demo with recovery decided (~15 s)


def test_a_fresh_run_does_not_recalibrate_for_another_model(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache, decision = tmp_path / "calibration", tmp_path / "recovery.json"
    auto = dict(cle=None, bias_correction=None, gptq=None, smoothquant=None)
    with caplog.at_level(logging.INFO, logger="mpsearch"):
        first = prepare_inputs(DEMO_MODEL, "x86_ort", DEMO_DATA, calibration_samples=64,
                               cache_dir=cache, recovery_cache=decision, **auto)
    assert first.recovery is not None and "cle" in first.recovery.scores  # a CLE graph tried
    assert "holds a table for another model" not in caplog.text
    saved = json.loads((cache / "calibration.json").read_text())
    assert saved["model_fingerprint"] == first.graph.fingerprint  # the chosen graph's table
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mpsearch"):
        again = prepare_inputs(DEMO_MODEL, "x86_ort", DEMO_DATA, calibration_samples=64,
                               cache_dir=cache, recovery_cache=decision, **auto)
    assert "loaded the calibration table from" in caplog.text
    assert "holds a table for another model" not in caplog.text
    assert again.table.tensors.keys() == first.table.tensors.keys()
