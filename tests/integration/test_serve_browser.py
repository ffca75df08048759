"""End-to-end test of ``mpsearch serve`` in a real browser: Playwright drives Debian's headless
Chromium through upload, summary, profile, data, an analysis and a short search, the report's
charts, and the download of an exported model that ONNX Runtime loads."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _paths import ROOT

pytestmark = pytest.mark.slow  # whole searches, servers, browsers, toolchains

playwright_api = pytest.importorskip("playwright.sync_api",
                                     reason="playwright is not installed (pip install playwright)")

from mpsearch.cli._serve import bind  # noqa: E402
from mpsearch.serve import LOOPBACK_HOSTS, ServeConfig, create_app  # noqa: E402
from mpsearch.serve._pages import bytes_text  # noqa: E402

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


def test_upload_analyze_search_export(server: str, tmp_path: Path, chromium: Any,
                                      tiny: tuple[Path, Path]) -> None:
    import onnxruntime as ort

    from mpsearch.spec import load_spec

    model, data = tiny
    outside: list[str] = []
    errors: list[str] = []
    page = chromium.new_page()
    chromium.on("request", lambda r: outside.append(r.url)
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
    headline = page.text_content("#headline") or ""  # an analysis' headline numbers
    assert "FP32 accuracy" in headline and "every node int8: accuracy" in headline
    assert "most sensitive: " in (page.text_content("#sensitive") or "")
    page.screenshot(path=str(tmp_path / "analysis-done.png"), full_page=True)
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    assert session.run(None, {"input": np.zeros((1, 1, 8, 8), np.float32)})[0].shape == (1, 10)
    spec = load_spec(spec_path)
    assert (spec.budget.trials, spec.calibration.method, Path(spec.model).is_file()) == (
        3, "percentile", True)
    assert outside == [], f"requests left the server: {outside[:5]}"
    assert errors == [], errors


# -- the whole path as a newcomer walks it ------------------------------------------------------
def _shot(page: playwright_api.Page, folder: Path, name: str, *, full: bool = False) -> None:
    """A screenshot in ``folder`` (the test's tmp_path), copied to $MPSEARCH_TEST_ARTIFACTS
    when set (CI keeps that folder)."""
    import os

    path = folder / "screenshots" / name
    path.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(path), full_page=full)
    artifacts = os.environ.get("MPSEARCH_TEST_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artifacts) / name)


def _expected_selection(front: dict[str, Any]) -> int:
    """The point the results page must preselect: ``recommended`` of front.json, else the
    documented rule (among the shown points, the best held-out metric, then the smallest,
    then the fastest at batch 1, then the lowest index)."""
    if "recommended" in front:
        return int(front["points"][front["recommended"]]["index"])
    shown = [p for p in front["points"]
             if p.get("shown", not p.get("dominated", False))]
    sign = 1.0 if front["higher_is_better"] else -1.0
    best = max(sign * p["metric"] for p in shown)
    top = [p for p in shown if sign * p["metric"] == best]
    return int(min(top, key=lambda p: (p["size"], p.get("latency_ms") or 1e300,
                                       p["index"]))["index"])


def test_newcomer_path_demo_to_exported_model(server: str, tmp_path: Path, chromium: Any
                                                ) -> None:
    """Open the printed token address, take the bundled demo (twice: one entry), keep the
    suggested profile, upload the demo's data, run a small search; the results page shows the
    recommendation, the baselines, the recommended point preselected, latency in words and an
    interactive chart (hover shows a point, a click selects it); the Jobs list compares runs;
    the recommended point downloads and scores its held-out accuracy in ONNX Runtime."""
    import onnxruntime as ort

    from mpsearch.pipeline import prepare
    from mpsearch.rundir import RunDir
    from mpsearch.spec import load_spec

    errors: list[str] = []
    outside: list[str] = []
    page = chromium.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    chromium.on("request", lambda r: outside.append(r.url)
               if not r.url.startswith((server, "data:", "blob:", "about:")) else None)

    # 1: the start page puts the demo first, marked as the demo
    page.goto(f"{server}/?token={TOKEN}")
    assert page.url == f"{server}/"
    demo = page.locator("#open-demo")
    assert demo.text_content() == "Open the demo model (demo.onnx)"
    assert page.locator("#fixtures").get_attribute("open") is None  # folded below
    _shot(page, tmp_path, "01-start.png")
    demo.dblclick()  # an impatient double click opens one copy
    page.wait_for_url("**/models/*")
    assert page.text_content("#next-link") == "Next: 4, run a search"
    model_url = page.url
    page.goto(server)
    assert page.locator("#models tbody tr").count() == 1
    favicon = page.request.get(f"{server}/favicon.ico")
    assert favicon.status == 200 and favicon.headers["content-type"] == "image/x-icon"
    page.goto(model_url)

    # 2: the profile x86_ort is suggested; its formats are shown
    assert page.locator("#profile-select option:checked").text_content() == "x86_ort"
    page.wait_for_selector(".profile-card[data-profile='x86_ort']")
    assert page.get_attribute("#step-job", "class") == "step next"
    assert page.input_value("#sensitivity_samples") == ""  # empty: the spec's auto
    assert page.get_attribute("#sensitivity_samples", "placeholder") == "auto"
    _shot(page, tmp_path, "02-model.png")

    # 3: data: the demo's data is preselected; uploading it anyway is confirmed
    data = ROOT / "mpsearch" / "demo" / "demo_data.npz"
    page.set_input_files("#step-data input[type=file]", data)
    page.click("#step-data button[type=submit]")
    page.wait_for_selector("#uploaded")
    assert page.text_content("#uploaded") == (
        "Uploaded demo_data.npz: 450 samples, with labels, checked against the model; "
        "it is selected in step 4.")
    assert "450 samples, labels" in (page.text_content("#data option:checked") or "")

    # 4: a bad value shows its error where the user is (step 4), not at the top
    page.fill("#trials", "4")
    page.fill("#calibration", "64")
    page.fill("#held_out", "0.95")
    page.select_option("#analysis", "off")
    page.evaluate("document.getElementById('held_out').removeAttribute('max')")
    page.click("#run-search")
    page.wait_for_selector("#error-job[role=alert]")
    assert "held-out fraction must be between 0 and 0.9" in (
        page.text_content("#error-job") or "")
    box = page.locator("#error-job").bounding_box()
    assert box is not None and 0 <= box["y"] <= 900, box  # in the viewport
    _shot(page, tmp_path, "03-error-in-view.png")

    # 4 again: a small search
    page.fill("#held_out", "0.5")
    page.fill("#trials", "10")
    page.check("input[name=latency]")
    page.click("#run-search")
    page.wait_for_url("**/jobs/*")
    job_url = page.url
    assert page.url.split("/jobs/")[0] == server
    title = page.text_content("h1") or ""
    assert title.startswith("#1 search of demo.onnx (uploaded ") and \
        title.endswith(" on x86_ort, 10 trials"), title
    page.wait_for_function("document.getElementById('overall-text').textContent "
                           "!== 'waiting\u2026'", timeout=60_000)
    overall = page.text_content("#overall-text") or ""
    assert overall.startswith("Step ") and " of 4: " in overall, overall
    assert "Stages: " in (page.text_content("#overall-note") or "")
    _shot(page, tmp_path, "04-running.png")

    # the results: the recommendation first, then the chart and the table
    page.wait_for_selector("#front", timeout=JOB_TIMEOUT_MS)
    assert (page.text_content("#job-state") or "").startswith("done")
    run_dir = tmp_path / "work" / "runs" / job_url.rsplit("/", 1)[1]
    front = json.loads((run_dir / "front.json").read_text())
    recommendation = page.text_content("#recommendation") or ""
    assert recommendation.startswith("Recommendation: ") and len(recommendation) > 30
    if front.get("recommendation"):
        assert front["recommendation"] in recommendation
    headers = page.locator("#front thead th").all_text_contents()
    assert headers[2:8] == ["accuracy (held-out split)", "accuracy (search split)",
                            "weights", "file", "latency, batch 1",
                            f"latency, batch {front['latency_batch']}"], headers

    # baselines: FP32 and every uniform format, with front.json's numbers
    rows = page.locator("#baselines tr.baseline")
    labels = [rows.nth(i).locator("td").nth(1).text_content()
              for i in range(rows.count())]
    assert labels[0] == "FP32" and "uniform INT8" in labels and \
        "uniform INT16" in labels, labels
    assert rows.count() == 1 + len(front["uniform"])
    int8 = page.locator("#baselines tr[data-baseline='int8'] td.metric").text_content()
    assert int8 == f"{front['uniform']['int8']['metric']:.4f}"
    fp32_ms = page.locator("#baselines tr[data-baseline='fp32'] td.latency").first
    assert f"{front['fp32']['latency_ms']:.3g} ms" in (fp32_ms.text_content() or "")

    # the front shows only the points front.json keeps; the rest is listed apart
    shown = [q["index"] for q in front["points"]
             if q.get("shown", not q.get("dominated", False))]
    hidden = [q["index"] for q in front["points"] if q["index"] not in shown]
    in_front = [int(v) for v in page.locator("#front-points tr[data-point]")
                .evaluate_all("rs => rs.map(r => r.dataset.point)")]
    assert in_front == shown
    assert page.locator("#hidden tr[data-point]").count() == len(hidden)
    for k in shown:  # each in ms with its words against FP32
        cell = page.text_content(f"#row-{k} td.latency") or ""
        assert " ms" in cell and "FP32" in cell, cell
    # the recommended point's latency in the one wording: the CLI's (front.json's
    # recommendation line), the web page's and the report's alike
    recommended = RunDir(run_dir).read_front()
    if recommended.recommended is not None:
        point = next(q for q in recommended.points if q.index == recommended.recommended)
        said = recommended.latency_words(point)
        assert f"; latency {said}" in front["recommendation"]
        assert page.text_content(f"#row-{point.index} td.latency small.words") == said
        report = chromium.new_page()
        report.goto(f"{job_url}/report")
        cells = report.locator(f"xpath=//tr[td[1]='{point.index}' and "
                               "td[2][contains(., '.')]]/td").all_text_contents()
        assert said in cells, cells
        report.close()

    # the recommended point is preselected
    selected = _expected_selection(front)
    assert page.locator("input[name=point]:checked").get_attribute("value") == \
        str(selected)
    assert "recommended" in (page.text_content(f"#row-{selected}") or "")

    # the chart: plotly.js from this server; hover shows the point, a click selects
    page.wait_for_selector("#results-chart .main-svg")
    assert "held-out split" in (page.text_content("#results-chart .ytitle") or "")
    page.locator("#results").scroll_into_view_if_needed()
    markers = page.locator("#results-chart .scatterlayer .trace").nth(2).locator(
        ".points path")
    assert markers.count() == len(shown)
    by_index = {q["index"]: q for q in front["points"]}
    other = next((i for i, k in enumerate(shown) if k != selected), 0)
    target = by_index[shown[other]]
    # points this close cannot be told apart under the pointer: any of them may answer
    near = {k for k in shown if abs(by_index[k]["size"] - target["size"])
            <= 0.002 * target["size"]
            and abs(by_index[k]["metric"] - target["metric"]) < 1e-3}
    markers.nth(other).hover(force=True)
    page.wait_for_selector("#results-chart .hoverlayer .hovertext")
    tip = page.text_content("#results-chart .hoverlayer .hovertext") or ""
    named = re.search(r"point (\d+)", tip)
    assert named and int(named.group(1)) in near, (tip, near)
    assert f"accuracy {target['metric']:.4f} (held-out)" in tip and "weights" in tip, tip
    _shot(page, tmp_path, "05-chart-hover.png")
    markers.nth(other).click(force=True)
    picked = int(page.locator("input[name=point]:checked").get_attribute("value") or -1)
    assert picked in near, (picked, near)
    assert "selected" in (page.get_attribute(f"#row-{picked}", "class") or "")
    page.check(f"#point-{selected}")
    page.locator("#results").scroll_into_view_if_needed()
    _shot(page, tmp_path, "06-results.png")
    _shot(page, tmp_path, "06-results-full.png", full=True)
    results_y = page.locator("#results").bounding_box()
    report_y = page.locator("iframe#report").bounding_box()
    assert results_y is not None and report_y is not None
    assert results_y["y"] < report_y["y"]  # the front above the report

    # download the recommended point, the page then shows its file size
    with page.expect_download(timeout=120_000) as download:
        page.click("#export-button")
    exported = tmp_path / "recommended.onnx"
    download.value.save_as(exported)
    assert download.value.suggested_filename == f"demo-point{selected}.onnx"
    page.goto(job_url)
    shown_file = page.text_content(f"#row-{selected} td.file") or ""
    metric_text = page.text_content(f"#row-{selected} td.metric") or ""

    # the Jobs list: settings and results side by side
    page.goto(f"{server}/jobs")
    heads = page.locator("#jobs thead th").all_text_contents()
    assert heads == ["job", "model", "profile", "kind", "trials", "status",
                     "best metric (held-out)", "smallest size", "recommendation",
                     "recommended formats", "settings", "duration", "created (UTC)"], heads
    row = page.locator("#jobs tbody tr").first
    cells = row.locator("td").all_text_contents()
    best = max(q["metric"] for q in front["points"] if q["index"] in shown)
    smallest = min((q for q in front["points"] if q["index"] in shown),
                   key=lambda q: q["size"])
    assert cells[1:6] == ["demo.onnx", "x86_ort", "search", "10", "done"], cells
    assert cells[6] == f"accuracy {best:.4f}"
    assert cells[7].startswith(bytes_text(smallest["size"]))
    assert cells[8] != "-", cells
    if front.get("recommended") is not None:  # the recommended point's formats
        chosen = front["points"][front["recommended"]]
        assert cells[9] == f"point {chosen['index']}: " + ", ".join(
            f"{f} {n}" for f, n in sorted(chosen["counts"].items())), cells
    assert cells[10] == ("minmax, metric auto: accuracy, held-out 0.5, 64 calibration "
                         "samples, seed 0, latency objective, no per-node analysis"), cells
    assert re.fullmatch(r"\d+:\d\d", cells[11]), cells
    _shot(page, tmp_path, "07-jobs.png", full=True)
    assert errors == [], errors
    assert outside == [], f"requests left the server: {outside[:5]}"

    # the downloaded model runs in ONNX Runtime and scores the front's held-out accuracy
    spec = load_spec(run_dir / "spec.yaml")
    validation = prepare(spec, RunDir(run_dir)).validation
    held = validation.split(1.0 - spec.data.held_out, spec.data.seed)[1]
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"input": held.inputs["input"]})[0]
    assert held.labels is not None and logits.shape == (len(held), 10)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == held.labels))
    assert f"{accuracy:.4f}" == metric_text
    assert shown_file == bytes_text(exported.stat().st_size)


def test_qnn_target_path_and_one_recommendation_wording(server: str, tmp_path: Path,
                                                        chromium: Any) -> None:
    """The demo's stream-only model searched for qnn_htp with the front verified on the QNN
    HTP emulator (onnxruntime-qnn, the qnn extra): the form offers verify and says the toolchain is
    installed; the results show each point's placement and target metric beside ONNX
    Runtime's, as front.json holds them; the recommendation reads the same on the page and in
    the report."""
    errors: list[str] = []
    page = chromium.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{server}/?token={TOKEN}")
    # the demo without its outlier weights (tests/fixtures/build_demo.py): the shipped demo's
    # cancelled outliers are beyond the HTP's fixed point, so no point of it would verify
    page.set_input_files("form[action='/models'] input[type=file]",
                         ROOT / "tests" / "fixtures" / "demo_stream.onnx")
    page.click("form[action='/models'] button[type=submit]")
    page.wait_for_url("**/models/*")
    page.set_input_files("form[action$='/data'] input[type=file]",
                         ROOT / "mpsearch" / "demo" / "demo_data.npz")
    page.click("form[action$='/data'] button[type=submit]")
    page.wait_for_url("**data=*")
    page.wait_for_selector("#no-toolchain")  # x86_ort, the suggestion, names no toolchain
    page.select_option("#profile-select", "shipped:qnn_htp")
    page.wait_for_selector("#target-verify[data-toolchain='qnn']")
    assert page.text_content("#toolchain-status") == "installed"
    page.select_option("#verify", "front")
    page.fill("#trials", "3")
    page.fill("#calibration", "64")
    page.fill("#sensitivity_samples", "32")
    page.select_option("#analysis", "off")
    page.click("#run-search")
    page.wait_for_url("**/jobs/*")
    job_url = page.url
    assert (page.text_content("h1") or "").endswith(" on qnn_htp, 3 trials")
    page.wait_for_selector("#front", timeout=JOB_TIMEOUT_MS)
    assert (page.text_content("#job-state") or "").startswith("done")
    run_dir = tmp_path / "work" / "runs" / job_url.rsplit("/", 1)[1]
    assert "verify: front" in (run_dir / "spec.yaml").read_text()
    front = json.loads((run_dir / "front.json").read_text())
    verified = [p for p in front["points"] if p.get("target_placement")]
    assert verified, [p.get("target_failure") for p in front["points"]]
    assert page.locator("#cpu-numbers").count() == 0
    rows = page.locator("#target-table tbody tr")
    assert rows.count() == len(verified)
    for p in verified:
        row = page.locator(f"#target-table tr[data-point='{p['index']}']")
        placed = p["target_placement"]
        on, nodes = placed["on_accelerator"], placed["nodes"]
        assert row.locator("td.placement").text_content() == (
            f"{on} of {nodes} on the accelerator, {nodes - on} on the CPU")
        ort = p["metric"] if placed.get("ort_metric") is None else placed["ort_metric"]
        assert row.locator("td.ort").text_content() == f"{ort:.4f}"
        assert row.locator("td.target-metric").text_content() == f"{p['target_metric']:.4f}"
        assert "cycles" in (row.locator("td.cost").text_content() or "")
        # a point the target rejected is marked, with its reason, in both tables
        failed = p.get("target_failure")
        assert row.locator("td.verdict").text_content() == (f"failed: {failed}" if failed
                                                            else "ok")
        if p["shown"]:
            main = page.locator(f"#front-points tr#row-{p['index']}")
            assert ("target-failed" in (main.get_attribute("class") or "")) == bool(failed)
            assert main.locator("small.failure").count() == int(bool(failed))
            if failed:
                assert main.locator(".tag.recommended").count() == 0
    assert any(p["target_placement"]["on_accelerator"] > 0 for p in verified)
    _shot(page, tmp_path, "08-qnn-target.png", full=True)

    # one wording: the page and the report print front.json's recommendation as it is
    wording = front["recommendation"]
    assert wording
    assert page.text_content("#recommendation") == f"Recommendation: {wording}"
    report = page.frame_locator("iframe#report")
    assert report.locator("#recommendation").text_content() == wording
    assert errors == [], errors
