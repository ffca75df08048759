"""End-to-end test of ``mpsearch serve`` in a real browser: Playwright drives Debian's headless
Chromium through upload, summary, profile, data, an analysis and a short search, the report's
charts, and the download of an exported model that ONNX Runtime loads."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-quic"]

playwright_api = pytest.importorskip("playwright.sync_api",
                                     reason="playwright is not installed (pip install playwright)")
if not Path(CHROMIUM).is_file() or shutil.which(CHROMIUM) is None:
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)

from test_serve import build_tiny  # noqa: E402  (tests/ is on sys.path under pytest)

from mpsearch.cli._serve import bind  # noqa: E402
from mpsearch.serve import LOOPBACK_HOSTS, ServeConfig, create_app  # noqa: E402

JOB_TIMEOUT_MS = 240_000
TOKEN = "browser-test-token"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """A real uvicorn server on a free loopback port, in a thread."""
    import uvicorn

    app = create_app(ServeConfig(workdir=tmp_path / "work", max_running=2, poll_s=0.2,
                                 allowed_hosts=LOOPBACK_HOSTS, token=TOKEN))
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def _submit(page: playwright_api.Page, button: str, shot: Path) -> str:
    """Submit the job form with ``button``; the job page shows live progress, after a reload
    too."""
    page.fill("#trials", "3")
    page.fill("#calibration", "48")
    page.fill("#sensitivity_samples", "32")
    page.click(button)
    page.wait_for_url("**/jobs/*")
    page.reload()  # the job survives a reload
    page.wait_for_function("document.getElementById('progress-text').textContent !== "
                           "'waiting\u2026'", timeout=10_000)
    page.screenshot(path=str(shot), full_page=True)
    return page.url


def _done(page: playwright_api.Page, url: str) -> playwright_api.FrameLocator:
    """Open job ``url``, wait until it is done (the page reloads itself), return its report."""
    page.goto(url)
    page.wait_for_selector("iframe#report", timeout=JOB_TIMEOUT_MS)
    state = page.text_content("#job-state") or ""
    assert state.startswith("done"), (state, page.text_content("main"))
    return page.frame_locator("iframe#report")


def _drawn(report: playwright_api.FrameLocator, chart: str) -> None:
    """Plotly drew ``chart`` inside the report."""
    report.locator(f"#{chart} .main-svg").first.wait_for(state="attached", timeout=30_000)


def test_upload_analyze_search_export(server: str, tmp_path: Path) -> None:
    import onnxruntime as ort

    from mpsearch.spec import load_spec

    model, data = build_tiny(tmp_path)
    outside: list[str] = []
    errors: list[str] = []
    with playwright_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
            args=ARGS, accept_downloads=True)
        try:
            context.set_default_timeout(120_000)  # two jobs share 2 cores with the browser
            page = context.new_page()
            context.on("request", lambda r: outside.append(r.url)
                       if not r.url.startswith((server, "data:", "blob:", "about:")) else None)
            page.on("pageerror", lambda e: errors.append(str(e)))

            # the model: its summary appears at once
            page.goto(server)  # without the token: refused
            assert "missing or wrong access token" in (page.text_content("main") or "")
            page.goto(f"{server}/?token={TOKEN}")  # the address `mpsearch serve` prints
            assert page.url == f"{server}/"  # the token went to a cookie
            page.set_input_files("form[action='/models'] input[type=file]", model)
            page.click("form[action='/models'] button[type=submit]")
            page.wait_for_url("**/models/*")
            assert "quantizable nodes" in (page.text_content("#summary") or "")
            assert page.locator("table.ops td", has_text="Conv").count() == 1
            model_url = page.url.split("?")[0]

            # the x86 CPU profile: its formats and op rules are shown
            page.select_option("#profile-select", "shipped:qnn_htp")
            page.wait_for_selector(".profile-card[data-profile='qnn_htp']")
            page.select_option("#profile-select", "shipped:x86_ort")
            page.wait_for_selector(".profile-card[data-profile='x86_ort']")
            assert page.locator("table.formats td", has_text="int8").count() >= 1
            page.screenshot(path=str(tmp_path / "model.png"), full_page=True)

            # a bad profile shows its error inline with the line
            bad = tmp_path / "typo.yaml"
            bad.write_text("schema: 1\nname: typo\nextends: x86_ort\nfallback: per_opp\n")
            page.set_input_files("form[action$='/profiles'] input[type=file]", bad)
            page.click("form[action$='/profiles'] button[type=submit]")
            assert "typo.yaml:4:" in (page.text_content("#error-profile") or "")
            assert "fallback: per_opp" in (page.text_content("#error-profile pre") or "")

            # the data
            page.set_input_files("form[action$='/data'] input[type=file]", data)
            page.click("form[action$='/data'] button[type=submit]")
            page.wait_for_url("**data=*")
            assert "128 samples, labels" in (page.text_content("#data option:checked") or "")

            # an analysis and a short search, queued together
            analysis_url = _submit(page, "#run-analysis", tmp_path / "analysis.png")
            page.goto(model_url)
            page.select_option("#method", "percentile")
            search_url = _submit(page, "#run-search", tmp_path / "running.png")
            page.goto(f"{server}/jobs")
            assert page.locator("#jobs tbody tr").count() == 2
            report = _done(page, search_url)
            for chart in ("chart-front", "chart-sensitivity", "chart-curve"):
                _drawn(report, chart)
            assert page.locator("#front tbody tr").count() >= 1
            page.screenshot(path=str(tmp_path / "search.png"), full_page=True)

            # select a front point and download its model and the spec
            last = page.locator("#front tbody tr input[type=radio]").last
            last.check()
            with page.expect_download(timeout=120_000) as download:
                page.click("#export-button")
            exported = tmp_path / "exported.onnx"
            download.value.save_as(exported)
            with page.expect_download() as spec_download:
                page.click("#spec-link")
            spec_path = tmp_path / "downloaded-spec.yaml"
            spec_download.value.save_as(spec_path)
            assert page.url == search_url

            report = _done(page, analysis_url)
            for chart in ("chart-sensitivity", "chart-distribution", "chart-curve"):
                _drawn(report, chart)
            assert report.locator("#chart-front").count() == 0  # no search there: "not run"
        finally:
            context.close()
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    assert session.run(None, {"input": np.zeros((1, 1, 8, 8), np.float32)})[0].shape == (1, 10)
    spec = load_spec(spec_path)
    assert (spec.trials, spec.method, Path(spec.model).is_file()) == (3, "percentile", True)
    assert outside == [], f"requests left the server: {outside[:5]}"
    assert errors == [], errors
