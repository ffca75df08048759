"""Fixtures shared by the test modules: the committed fixture zoo, its digits data, a fresh
PostgreSQL schema for the multi-worker tests, and headless Chromium driven by Playwright."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from _paths import FIXTURES
from onnx import TensorProto, helper, numpy_helper

from mpsearch.data import Dataset, load_data

#: Debian's Chromium (``apt-get install chromium``; ``.ci/run`` installs it): Playwright drives
#: it, so the tests download no browser.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--hide-scrollbars")


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """``tests/fixtures``: the ONNX zoo built by ``build_fixtures.py`` and ``digits_eval.npz``."""
    return FIXTURES


@pytest.fixture(scope="session")
def digits() -> Dataset:
    """The 450 held-out scikit-learn digits every fixture model was scored on."""
    return load_data(FIXTURES / "digits_eval.npz")


def _postgres_url() -> str | None:
    """``$MPSEARCH_TEST_POSTGRES``, else the database ``.ci/run`` creates when a server listens
    on 127.0.0.1:5432, else None."""
    url = os.environ.get("MPSEARCH_TEST_POSTGRES")
    if url:
        return url
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=1).close()
    except OSError:
        return None
    return "postgresql://mpsearch:mpsearch@127.0.0.1:5432/mpsearch"


@pytest.fixture
def postgres_study() -> Iterator[tuple[str, str]]:
    """``(storage URL, study name)``: a new empty schema of its own on the test server, so that
    workers create Optuna's tables at once without meeting another test's (optuna#1092)."""
    base = _postgres_url()
    if base is None:
        pytest.skip("no PostgreSQL on 127.0.0.1:5432 (.ci/run starts one)")
    psycopg = pytest.importorskip("psycopg")
    study = f"t{os.getpid()}_{time.time_ns()}"
    with psycopg.connect(base, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {study}")
    yield f"{base}?options=-csearch_path%3D{study}", study
    with psycopg.connect(base, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA {study} CASCADE")


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Any]:
    """A Playwright browser context of headless Chromium with a profile of its own (in
    ``tmp_path``), downloads accepted and a 2-minute default timeout (jobs share the 2 cores
    with the browser); closed after the test."""
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install playwright)")
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True,
            args=list(CHROMIUM_ARGS), accept_downloads=True,
            viewport={"width": 1280, "height": 900})
        context.set_default_timeout(120_000)
        try:
            yield context
        finally:
            context.close()


def _build_tiny(folder: Path, samples: int = 128) -> tuple[Path, Path]:
    """A 7-node CNN on 8x8 grey images and data labelled by its own FP32 predictions."""
    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.normal(0, 0.6, (4, 1, 3, 3)), "b1": rng.normal(0, 0.1, 4),
        "w2": rng.normal(0, 0.4, (8, 4, 3, 3)), "b2": rng.normal(0, 0.1, 8),
        "w3": rng.normal(0, 0.8, (10, 8)), "b3": rng.normal(0, 0.1, 10)}
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1] * 4,
                         strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], name="fc", transB=1)]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                      ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    model_path = folder / "tiny.onnx"
    onnx.save(model, model_path)
    x = rng.normal(0.5, 0.3, (samples, 1, 8, 8)).astype(np.float32)
    from onnx.reference import ReferenceEvaluator

    logits = ReferenceEvaluator(model).run(None, {"input": x})[0]
    data_path = folder / "tiny.npz"
    np.savez(data_path, input=x, labels=np.argmax(logits, axis=1).astype(np.int64))
    return model_path, data_path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(model, data)`` paths of a 7-node CNN on 8x8 grey images, the web UI tests' upload."""
    return _build_tiny(tmp_path_factory.mktemp("tiny"))
