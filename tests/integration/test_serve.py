"""API tests of ``mpsearch serve`` through Starlette's test client: uploads (good and bad, with
nothing left behind), the job form's checks, the job lifecycle (queue, cancel, resume, run,
report, spec, export) and the CLI entry point."""

from __future__ import annotations

import argparse
import html
import io
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from _paths import HOSTILE
from starlette.testclient import TestClient

from mpsearch.progress import JsonlProgress, Progress
from mpsearch.rundir import latency_words
from mpsearch.serve import ServeConfig, create_app
from mpsearch.serve._access import Access
from mpsearch.serve._pages import bytes_text
from mpsearch.serve._progress import job_progress, pareto, read_journal

pytestmark = pytest.mark.slow  # whole searches, servers, browsers, toolchains

JSON = {"accept": "application/json"}
BAD_PROFILE = ("schema: 1\nname: typo\nextends: x86_ort\nformats:\n  int8:\n"
               "    weight: {granularty: per_tensor}\n")
QUICK = {"profile": "shipped:x86_ort", "calibration": "48", "trials": "3",
         "sensitivity_samples": "32"}


# -- fixtures ----------------------------------------------------------------------------------
TOKEN = "test-token-0123456789"
SAME_ORIGIN = {"origin": "http://testserver"}


def _client(workdir: Path, **options: Any) -> TestClient:
    """A client that opened the server's token address once (the token is in its cookie) and
    sends the same-origin Origin header a browser sends with every POST."""
    client = TestClient(create_app(ServeConfig(workdir=workdir, poll_s=0.1, token=TOKEN,
                                               **options)),
                        raise_server_exceptions=False, headers=SAME_ORIGIN)
    opened = client.get(f"/?token={TOKEN}", follow_redirects=False)
    assert opened.status_code == 303 and opened.headers["location"] == "/", opened.text
    assert "HttpOnly; SameSite=Strict" in opened.headers["set-cookie"]
    return client


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with _client(tmp_path / "work") as c:
        yield c


def _upload(client: TestClient, url: str, name: str, payload: bytes,
            fields: dict[str, str] | None = None) -> Any:
    return client.post(url, files={"file": (name, payload)}, data=fields or {}, headers=JSON)


def _model(client: TestClient, path: Path) -> str:
    response = _upload(client, "/models", path.name, path.read_bytes())
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _data(client: TestClient, model: str, path: Path) -> str:
    response = _upload(client, f"/models/{model}/data", path.name, path.read_bytes())
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _left(work: Path, kind: str) -> list[str]:
    return sorted(p.name for p in (work / "uploads" / kind).iterdir())


def _wait(client: TestClient, job: str, states: tuple[str, ...], timeout: float = 180
          ) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status: dict[str, Any] = client.get(f"/api/jobs/{job}").json()
        if status["job"]["state"] in states:
            return status
        time.sleep(0.2)
    raise AssertionError(f"job {job} not in {states} after {timeout} s: {status}")


# -- pages and good uploads ------------------------------------------------------------------
def test_bundled_model_shows_its_summary_profile_and_form(client: TestClient,
                                                          tmp_path: Path) -> None:
    index = client.get("/")
    assert index.status_code == 200 and "demo.onnx" in index.text
    assert "cdn" not in index.text.lower() and 'src="http' not in index.text
    demo = index.text.index('id="open-demo">Open the demo model (demo.onnx)</button>')
    assert demo < index.text.index('<details id="fixtures"><summary>Test fixtures')
    assert '<span class="n">1</span>Open a model' in index.text
    page = client.post("/models/bundled", data={"name": "demo.onnx"})
    assert page.status_code == 200 and page.url.path.startswith("/models/")
    html = page.text
    steps = [html.index(f'<span class="n">{n}</span>{title}') for n, title in (
        (2, "Hardware profile"), (3, "Data for calibration and validation"),
        (4, "Run a search"))]
    assert steps == sorted(steps) and steps[-1] < html.index("Model summary")
    assert '<section class="step next" id="step-job">' in html  # the demo's data is there
    assert ('<p class="muted" id="data-note">The demo comes with its own data, already '
            "selected in step 4: bundled demo_data.npz (the demo&#x27;s data).") in html
    assert "Optional" not in html
    for name in ("max_metric_drop", "sensitivity_samples", "analysis", "held_out"):
        assert f'<small class="help" id="help-{name}">' in html, name
    # the sensitivity samples field says what the spec does: empty is the spec's auto
    from mpsearch.spec import DataSpec, SearchSpec

    default = SearchSpec(model="m", profile="p",
                         data=DataSpec(source="d")).evaluation.sensitivity_samples
    assert default == "auto"
    assert ('name="sensitivity_samples" id="sensitivity_samples" value="" min="1" '
            'placeholder="auto">') in html
    assert ("(default auto: half the split, 16 to 32, as a spec&#x27;s "
            "evaluation.sensitivity_samples)") in html
    assert 'placeholder="all"' not in html and "64" not in html.split("help-sensitivity")[1][:300]
    again = client.post("/models/bundled", data={"name": "demo.onnx"})  # a second click
    assert again.url.path == page.url.path  # the same entry, not a second one
    assert len(_left(tmp_path / "work", "models")) == 1
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/x-icon"
    assert icon.content[:4] == b"\x00\x00\x01\x00"  # an ICO header
    assert '<link rel="icon" href="/favicon.ico"' in html
    plotly = client.get("/static/plotly.min.js")  # the report's plotly.js, served locally
    assert plotly.status_code == 200 and plotly.headers["content-type"].startswith(
        "text/javascript") and b"plotly.js v" in plotly.content[:400]
    assert '<span class="tag">demo</span>' in client.get("/").text
    for expected in ("34,376", "Conv", "GlobalAveragePool", "Heaviest nodes", "FLOPs",
                     'data-profile="x86_ort"', "uint8 asym per-tensor", "Op rules",
                     'value="bundled:demo_data.npz"', 'id="run-search"', 'value="entropy"'):
        assert expected in html, expected
    assert "content-security-policy" in page.headers
    assert client.get("/static/serve.js").status_code == 200
    jobs = f"{page.url.path}/jobs"
    for _ in range(2):  # bundled data is copied in once per model, and checked
        refused = client.post(jobs, data={**QUICK, "data": "bundled:demo_data.npz",
                                                 "metric": "os:x"},
                              headers=JSON)
        assert refused.status_code == 400 and "CLI-only" in refused.json()["error"]
    assert len(_left(tmp_path / "work", "data")) == 1


def test_uploaded_model_steps_confirmation_and_job_names(client: TestClient,
                                                         tiny: tuple[Path, Path]) -> None:
    model = _model(client, tiny[0])
    page = client.get(f"/models/{model}").text
    assert '<section class="step next" id="step-data">' in page  # no data of its own yet
    assert '<option value="" selected>upload data in step 3 first</option>' in page
    refused = client.post(f"/models/{model}/jobs", data={**QUICK, "data": ""}, headers=JSON)
    assert (refused.status_code, refused.json()["error"]) == (
        400, "choose the data in step 3: upload an .npz, a .npy or a .zip of images the model "
        "reads")
    uploaded = client.post(f"/models/{model}/data",
                           files={"file": ("mine.npz", tiny[1].read_bytes())},
                           data={"profile": "shipped:x86_ort"})
    assert uploaded.status_code == 200 and "uploaded=data" in str(uploaded.url)
    assert ('<p class="ok" id="uploaded" role="status">Uploaded mine.npz: 128 samples, with '
            "labels, checked against the model; it is selected in step 4.</p>") in uploaded.text
    assert '<section class="step next" id="step-job">' in uploaded.text
    data = str(uploaded.url).split("data=")[1].split("&")[0]
    form = {**QUICK, "data": data, "kind": "analysis"}
    created = client.get(f"/api/models/{model}").json()["created"]
    titles = [client.post(f"/models/{model}/jobs", data=form, headers=JSON).json()["title"]
              for _ in range(2)]
    assert titles == [f"#{n} analysis of tiny.onnx (uploaded {created[11:16]} UTC) on x86_ort"
                      for n in (1, 2)]
    search = client.post(f"/models/{model}/jobs", data={**form, "kind": "search"},
                         headers=JSON).json()
    assert search["title"].startswith("#3 search of tiny.onnx") and \
        search["title"].endswith("on x86_ort, 3 trials")
    assert (search["profile"], search["model_name"]) == ("x86_ort", "tiny.onnx")
    jobs = client.get("/").text.split('id="jobs"')[1]
    assert "<th>profile</th><th>kind</th><th>trials</th><th>status</th>" in jobs
    assert "<td>x86_ort</td><td>search</td><td>3</td>" in jobs
    assert ("<th>best metric (held-out)</th><th>smallest size</th><th>recommendation</th>"
            "<th>recommended formats</th><th>settings</th><th>duration</th>") in jobs
    assert ('<td class="settings">minmax, metric auto, held-out 0.5, 48 calibration samples, '
            "seed 0, 32 sensitivity samples</td>") in jobs
    assert '<td class="duration">-</td>' in jobs  # not finished yet
    assert "bundled:" not in page  # no data offered that was not made for this model
    info = client.get(f"/api/models/{model}").json()["info"]
    assert info["file_bytes"] == tiny[0].stat().st_size and info["weight_bytes"] == 4 * 426
    assert (f"<td>{bytes_text(4 * 426)}</td><td>{bytes_text(tiny[0].stat().st_size)}</td>"
            in client.get("/").text)  # both sizes of each model
    for job in client.get("/api/jobs").json()["jobs"]:
        client.post(f"/jobs/{job['id']}/cancel", headers=JSON)


def test_shapes_show_unnamed_dimensions_as_unknown() -> None:
    from mpsearch.serve._pages import shape_text

    assert shape_text(["batch", "unk__7", 10]) == "[batch, ?, 10]"
    assert shape_text(None) == "?" and shape_text([1, 3]) == "[1, 3]"


def test_model_summary_json_and_profile_card(client: TestClient, tiny: tuple[Path, Path]
                                             ) -> None:
    model = _model(client, tiny[0])
    summary = client.get(f"/api/models/{model}").json()["summary"]
    assert summary["op_types"] == {"Conv": 2, "Relu": 2, "GlobalAveragePool": 1, "Flatten": 1,
                                   "Gemm": 1}
    assert summary["params"] == 4 * 9 + 4 + 8 * 36 + 8 + 80 + 10
    card = client.get("/profiles/card", params={"ref": "shipped:qnn_htp"}).text
    assert 'data-profile="qnn_htp"' in card and "int16" in card
    # op rule notes read as words, not Python dicts
    assert "fixed quantization: uint16 scale 1.526e-05, zero point 0; int16 scale 3.052e-05, " \
        "zero point 0" in card
    # no Python dict or list reprs (an apostrophe in the profile's own prose is fine)
    assert "{" not in card and "[&#x27;" not in card and "&#x27;: " not in card
    # qnn_htp names a toolchain: the verify choice, bound to the job form, and its status
    # (onnxruntime-qnn is installed with the qnn extra, so every choice is enabled)
    assert '<div id="target-verify" data-toolchain="qnn">' in card
    assert '<select name="verify" id="verify" form="job-form">' in card
    assert '<span class="ok" id="toolchain-status">installed</span>' in card
    assert [v for v in ("none", "front", "toolchain") if f'<option value="{v}"' in card] == [
        "none", "front", "toolchain"] and " disabled" not in card
    x86 = client.get("/profiles/card", params={"ref": "shipped:x86_ort"}).text
    assert "relative cost: int8 unknown" in x86 and "{" not in x86
    assert 'id="no-toolchain"' in x86 and 'name="verify"' not in x86
    assert "neither a shipped profile" in client.get("/profiles/card",
                                                     params={"ref": "shipped:../x"}).text
    assert "shipped:x86_ort" in client.get("/api/profiles").json()["profiles"]
    named = _upload(client, "/models", "<img src=x onerror=alert(1)>.onnx", tiny[0].read_bytes())
    assert named.status_code == 201
    index = client.get("/").text
    assert "&lt;img src=x onerror=alert(1)&gt;.onnx" in index and "<img" not in index


def test_good_profile_and_zip_of_images(client: TestClient, tiny: tuple[Path, Path],
                                        tmp_path: Path) -> None:
    from PIL import Image

    model = _model(client, tiny[0])
    profile = _upload(client, f"/models/{model}/profiles", "mine.yaml",
                      b"schema: 1\nname: mine\nextends: x86_ort\n")
    assert profile.status_code == 201 and profile.json()["info"]["profile"] == "mine"
    assert f"upload:{profile.json()['id']}" in client.get("/api/profiles").json()["profiles"]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for index in range(6):
            image = io.BytesIO()
            Image.fromarray(np.full((10, 12), index * 40, np.uint8)).save(image, "PNG")
            zf.writestr(f"digits/{'ab'[index % 2]}/{index}.png", image.getvalue())
    fields = {"image_size": "8,8", "image_mode": "L", "image_scale": "1/255",
              "image_mean": "0.5", "image_input_name": "input"}
    data = _upload(client, f"/models/{model}/data", "images.zip", buffer.getvalue(), fields)
    assert data.status_code == 201, data.text
    assert data.json()["info"]["samples"] == 6 and data.json()["info"]["labels"] is True
    folder = tmp_path / "work" / "uploads" / "data" / data.json()["id"]
    assert sorted(p.name for p in folder.iterdir()) == ["data.npz", "meta.json"]


# -- bad uploads: a clear message and nothing left behind ----------------------------------------
def test_not_onnx_is_refused(client: TestClient, tmp_path: Path) -> None:
    response = _upload(client, "/models", "../../evil.onnx", b"this is not a model")
    assert response.status_code == 400
    message = response.json()["error"]
    assert message.startswith("evil.onnx: not a readable ONNX model"), message
    assert "/work/" not in message and "Traceback" not in message
    page = client.post("/models", files={"file": ("x.onnx", b"junk")})
    assert page.status_code == 400 and 'role="alert"' in page.text
    assert "not a readable ONNX model" in page.text
    assert _left(tmp_path / "work", "models") == []
    assert "choose an ONNX model" in client.post("/models", data={"x": "1"},
                                                 headers=JSON).json()["error"]


def test_too_large_uploads_are_refused(tmp_path: Path, tiny: tuple[Path, Path]) -> None:
    work = tmp_path / "work"
    size = tiny[0].stat().st_size
    with _client(work, max_upload_bytes=size - 100) as small:  # past the limit inside the copy
        response = _upload(small, "/models", "tiny.onnx", tiny[0].read_bytes())
        assert response.status_code == 413
        assert "upload too large" in response.json()["error"]
        huge = _upload(small, "/models", "big.onnx", b"\0" * (size + 200_000))  # at the door
        assert huge.status_code == 413 and "--max-upload-mb" in huge.json()["error"]
        page = small.get("/")
        assert f'data-max-bytes="{size - 100}"' in page.text  # the browser checks first
    assert _left(work, "models") == []


def test_malformed_profile_shows_the_line(client: TestClient, tiny: tuple[Path, Path],
                                          tmp_path: Path) -> None:
    model = _model(client, tiny[0])
    response = _upload(client, f"/models/{model}/profiles", "typo.yaml", BAD_PROFILE.encode())
    assert response.status_code == 400
    body = response.json()
    assert body["error"].startswith("typo.yaml:6: unknown key 'granularty'")
    assert "did you mean 'granularity'" in body["error"]
    assert body["line"] == 6 and body["source_line"] == "    weight: {granularty: per_tensor}"
    page = client.post(f"/models/{model}/profiles",
                       files={"file": ("typo.yaml", BAD_PROFILE.encode())})
    assert page.status_code == 400 and '<span class="lineno">6</span>' in page.text
    syntax = _upload(client, f"/models/{model}/profiles", "bad.yaml", b"schema: [1\n")
    assert syntax.status_code == 400 and "invalid YAML" in syntax.json()["error"]
    assert _left(tmp_path / "work", "profiles") == []


def test_data_not_matching_the_model(client: TestClient, tiny: tuple[Path, Path],
                                     tmp_path: Path) -> None:
    model = _model(client, tiny[0])
    cases = {
        "shape.npz": ({"input": np.zeros((4, 1, 9, 9), np.float32)}, "has shape (4, 1, 9, 9)"),
        "name.npz": ({"image": np.zeros((4, 1, 8, 8), np.float32)}, "no array for model input"),
        "dtype.npz": ({"input": np.zeros((4, 1, 8, 8), np.float64)}, "has dtype float64"),
        "one.npz": ({"input": np.zeros((1, 1, 8, 8), np.float32)}, "need at least 2"),
    }
    for name, (arrays, expected) in cases.items():
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        response = _upload(client, f"/models/{model}/data", name, buffer.getvalue())
        assert response.status_code == 400, name
        assert response.json()["error"].startswith(f"{name}: ") and expected in \
            response.json()["error"], response.json()
    garbage = _upload(client, f"/models/{model}/data", "x.npz", b"PK not really")
    assert garbage.status_code == 400 and "cannot read the archive" in garbage.json()["error"]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("../../escape.png", b"x")
    unsafe = _upload(client, f"/models/{model}/data", "evil.zip", buffer.getvalue())
    assert unsafe.status_code == 400 and "unsafe path" in unsafe.json()["error"]
    assert _left(tmp_path / "work", "data") == []
    assert not list(tmp_path.rglob("escape.png"))


def test_damaged_npz_is_a_user_error_and_npy_is_accepted(client: TestClient,
                                                          tiny: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    model = _model(client, tiny[0])
    damaged = _upload(client, f"/models/{model}/data", "broken.npz",
                      b"PK\x03\x04" + bytes(200))  # a zip header, then nothing of a zip
    assert damaged.status_code == 400
    assert damaged.json()["error"] == (
        "broken.npz: cannot read the archive (BadZipFile: File is not a zip file); the file is "
        "truncated or not an .npz, re-save it with numpy.savez")
    good = io.BytesIO()
    np.savez(good, input=np.zeros((4, 1, 8, 8), np.float32))
    truncated = _upload(client, f"/models/{model}/data", "cut.npz", good.getvalue()[:-40])
    assert truncated.status_code == 400
    assert truncated.json()["error"].startswith("cut.npz: cannot read the archive (")
    assert _left(tmp_path / "work", "data") == []
    array = io.BytesIO()
    np.save(array, np.load(tiny[1])["input"][:16])
    npy = _upload(client, f"/models/{model}/data", "inputs.npy", array.getvalue())
    assert npy.status_code == 201, npy.text
    assert (npy.json()["name"], npy.json()["info"]["samples"]) == ("inputs.npy", 16)
    folder = tmp_path / "work" / "uploads" / "data" / npy.json()["id"]
    assert sorted(p.name for p in folder.iterdir()) == ["data.npz", "meta.json"]
    assert list(np.load(folder / "data.npz").files) == ["input"]  # keyed by the model input


def test_unknown_profile_keeps_a_valid_choice(client: TestClient, tiny: tuple[Path, Path]
                                              ) -> None:
    model = _model(client, tiny[0])
    data = _data(client, model, tiny[1])
    page = client.post(f"/models/{model}/jobs",
                       data={**QUICK, "data": data, "profile": "shipped:nope"})
    assert page.status_code == 400
    assert ("profile &#x27;shipped:nope&#x27; is neither a shipped profile nor an upload; "
            "pick one from the list") in page.text
    assert 'name="profile" value="shipped:x86_ort"' in page.text
    assert 'value="shipped:nope"' not in page.text
    assert '<option value="shipped:x86_ort" selected>' in page.text


def test_worker_runs_the_installed_package(tmp_path: Path) -> None:
    """A folder holding another `mpsearch/` package (the server's current directory) cannot
    stand in for the worker."""
    from mpsearch.serve._jobs import worker_command

    foreign = tmp_path / "cwd" / "mpsearch" / "serve"
    foreign.mkdir(parents=True)
    for folder in (foreign.parent, foreign):
        (folder / "__init__.py").write_text("")
    (foreign / "_worker.py").write_text("import sys\nprint('hijacked')\nsys.exit(42)\n")
    hijack = [sys.executable, "-m", "mpsearch.serve._worker", "export", "x", "0", "y"]
    old = subprocess.run(hijack, cwd=tmp_path / "cwd", capture_output=True, text=True,
                         check=False)
    assert (old.returncode, old.stdout.strip()) == (42, "hijacked")  # what -m would run
    done = subprocess.run(worker_command("export", str(tmp_path / "nothing"), "0",
                                         str(tmp_path / "out.onnx")),
                          cwd=tmp_path / "cwd", capture_output=True, text=True, check=False)
    assert "hijacked" not in done.stdout and done.returncode == 2, done.stderr[-2000:]
    assert "mpsearch: error: " in done.stderr and "not a finished search run" in done.stderr


def test_job_form_refuses_code_and_bad_values(client: TestClient, tiny: tuple[Path, Path],
                                              tmp_path: Path) -> None:
    model = _model(client, tiny[0])
    data = _data(client, model, tiny[1])
    url = f"/models/{model}/jobs"
    cases = {"metric": ("os:system", "CLI-only"), "trials": ("many", "whole number"),
             "profile": ("upload:../../etc", "no profile upload"),
             "method": ("magic", "range method 'magic' is not one of"),
             "formats": ("int4", "not in profile 'x86_ort'"),
             "granularity": ("per_row", "weight granularity"),
             "analysis": ("maybe", "per-node analysis 'maybe'"),
             "verify": ("front", "verify 'front' needs a profile that names a target "
                                 "toolchain; profile 'x86_ort' names none")}
    for key, (value, expected) in cases.items():
        response = client.post(url, data={**QUICK, "data": data, key: value}, headers=JSON)
        assert response.status_code in (400, 404), key
        assert expected in response.json()["error"], (key, response.json())
    page = client.post(url, data={**QUICK, "data": data, "metric": "mod:fn"})
    assert page.status_code == 400 and "CLI-only" in page.text and 'id="error-job"' in page.text
    assert list((tmp_path / "work" / "runs").iterdir()) == []


def test_ids_in_addresses_are_checked(client: TestClient) -> None:
    for url in ("/models/..%2F..%2Fetc", "/jobs/0123456789abcdef", "/api/jobs/xyz",
                "/models/0123456789abcdef", "/jobs/0123456789abcdef/spec.yaml"):
        response = client.get(url, headers=JSON)
        assert response.status_code == 404, url
        assert "error" in response.json()
    refused = client.post("/models/bundled", data={"name": "demo.onnx"},
                          headers={"origin": "http://evil.example", **JSON})
    assert refused.status_code == 403 and "cross-site" in refused.json()["error"]


def test_cross_site_and_tokenless_requests_are_refused(tmp_path: Path) -> None:
    work = tmp_path / "work"
    app = create_app(ServeConfig(workdir=work, token=TOKEN,
                                 allowed_hosts=("127.0.0.1", "localhost", "[::1]")))
    post = {"url": "/models/bundled", "data": {"name": "demo.onnx"}}
    with TestClient(app, base_url="http://[::1]:8765", raise_server_exceptions=False) as anon:
        assert anon.get("/static/serve.js").status_code == 200  # no secret there
        for url in ("/", "/jobs", "/api/jobs", "/jobs/0123456789abcdef/export?point=0"):
            refused = anon.get(url, headers=JSON)
            assert refused.status_code == 403, url
            assert refused.json()["error"] == (
                "missing or wrong access token; open the address with ?token=... that "
                "`mpsearch serve` printed when it started")
        wrong = anon.post(**post, headers={"origin": "http://[::1]:8765",
                                           "x-mpsearch-token": "guess", **JSON})
        assert wrong.status_code == 403 and "access token" in wrong.json()["error"]
        anon.cookies.set(Access(TOKEN).cookie, TOKEN)  # a browser that opened the address
        cases = {
            "null": ({"origin": "null"}, "cross-site request from an opaque origin "
                     "(Origin: null) refused; use the mpsearch page itself"),
            "none": ({}, "cross-site check: the request has no Origin header; send it from the "
                     "mpsearch page (API clients: add 'Origin: http://HOST:PORT')"),
            "other": ({"origin": "http://evil.example"},
                      "cross-site request from http://evil.example refused"),
            "fetch": ({"origin": "http://[::1]:8765", "sec-fetch-site": "cross-site"},
                      "cross-site request (Sec-Fetch-Site: cross-site) refused")}
        for name, (headers, message) in cases.items():
            for url in ("/models/bundled", "/jobs/0123456789abcdef/cancel",
                        "/jobs/0123456789abcdef/resume", "/models/0123456789abcdef/jobs"):
                refused = anon.post(url, data={"name": "demo.onnx"}, headers={**headers, **JSON})
                assert refused.status_code == 403, (name, url)
                assert refused.json()["error"] == message, (name, url)
        rebound = anon.get("/", headers={"host": "attacker.example:8765", **JSON})
        assert rebound.status_code == 400 and "unknown Host header" in rebound.json()["error"]
        assert _left(work, "models") == [] and list((work / "runs").iterdir()) == []
        same = {"origin": "http://[::1]:8765", "sec-fetch-site": "same-origin", **JSON}
        assert anon.post(**post, headers=same).status_code == 201  # the page itself
        assert anon.get("/api/jobs").status_code == 200
    with TestClient(app, raise_server_exceptions=False,
                    headers={"x-mpsearch-token": TOKEN, "host": "127.0.0.1:9"}) as api:
        created = api.post(**post, headers={"origin": "http://127.0.0.1:9", **JSON})
        assert created.status_code == 201, created.text  # a script with the token header
    assert len(_left(work, "models")) == 1  # both opened the demo: one entry, reused


def test_internal_errors_are_messages(client: TestClient, monkeypatch: pytest.MonkeyPatch,
                                      tiny: tuple[Path, Path]) -> None:
    from mpsearch.serve import _store as _serve_store

    model = _model(client, tiny[0])

    def broken(self: Any, upload: Any) -> dict[str, Any]:
        raise RuntimeError("boom\n  File x.py, line 1")

    monkeypatch.setattr(_serve_store.Store, "summary", broken)
    response = client.get(f"/models/{model}")
    assert response.status_code == 500
    assert "internal error (RuntimeError)" in response.text and "File x.py" not in response.text


# -- jobs ------------------------------------------------------------------------------------
def test_queue_cancel_resume(tmp_path: Path, tiny: tuple[Path, Path]) -> None:
    with _client(tmp_path / "work", max_running=1) as client:
        model = _model(client, tiny[0])
        data = _data(client, model, tiny[1])
        form = {**QUICK, "data": data, "kind": "search", "trials": "500"}
        first = client.post(f"/models/{model}/jobs", data=form, headers=JSON).json()["id"]
        second = client.post(f"/models/{model}/jobs", data=form, headers=JSON).json()["id"]
        _wait(client, first, ("running",))
        status = client.get(f"/api/jobs/{second}").json()
        assert status["job"]["state"] == "queued" and status["position"] == 1
        client.post(f"/jobs/{second}/cancel", headers=JSON)
        assert client.get(f"/api/jobs/{second}").json()["job"]["state"] == "cancelled"
        deadline = time.monotonic() + 180
        while (progress := client.get(f"/api/jobs/{first}").json()["progress"] or {}).get(
                "trials_done", 0) < 2:  # a few trials finish
            assert time.monotonic() < deadline, progress
            time.sleep(0.2)
        assert progress["stage"] == "search" and progress["message"] == (
            "searching: each trial builds one configuration and measures it on the search "
            "split")
        whole = progress["overall"]
        assert whole["phases"][whole["index"]] == "search" and whole["estimate"] is True
        if whole["left"] is not None:  # known after two search reports
            assert whole["left"] > 0 and whole["upper"] is True and 0 < whole["fraction"] < 1
        client.post(f"/jobs/{first}/cancel", headers=JSON)
        _wait(client, first, ("cancelled",), timeout=30)
        log = (tmp_path / "work" / "runs" / first / "job.log").read_text()
        assert "mpsearch: cancelled" in log
        assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
        points, finished = read_journal(tmp_path / "work" / "runs" / first / "study.journal")
        assert finished >= 2 and points
        page = client.get(f"/jobs/{first}").text  # what the cancelled search found
        assert (f'<p id="partial-summary">{finished} of 500 trials finished before the job '
                f"stopped; {len(pareto(points, True))} point(s) on the front so far.") in page
        assert "metric (search split)" in page and 'id="partial-front"' in page
        assert "<th>formats (nodes)</th>" in page
        rows = page.split('id="partial-front"')[1].split("</tbody>")[0].split("<tr>")[2:]
        assert rows and all(re.search(r"<td>[a-z0-9]+ [0-9]+(, [a-z0-9]+ [0-9]+)*</td></tr>", r)
                            for r in rows), rows
        chart = json.loads(page.split('id="page-data">')[1].split("</script>")[0])["chart"]
        assert chart["front"] == [list(p) for p in pareto(points, True)]
        assert chart["y"] == "metric (search split)"
        commands = page.split('id="commands">')[1].split("</pre>")[0]
        assert "mpsearch search " in commands and "mpsearch export" not in commands
        assert f'id="finish">Finish with these {finished} trials</button>' in page
        resumed = client.post(f"/jobs/{first}/resume", headers=JSON).json()
        assert resumed["state"] == "queued" and resumed["resume"] is True
        _wait(client, first, ("running",))
        page = client.get(f"/jobs/{first}")
        assert 'id="progress"' in page.text and 'id="cancel"' in page.text
    job = json.loads((tmp_path / "work" / "runs" / first / "job.json").read_text())
    assert job["state"] == "interrupted"  # the server stopped while it ran
    with _client(tmp_path / "work") as again:  # a restart keeps the jobs
        assert {j["id"] for j in again.get("/api/jobs").json()["jobs"]} == {first, second}
        # finish the stopped search with the trials it ran: its front becomes exportable
        _, finished = read_journal(tmp_path / "work" / "runs" / first / "study.journal")
        done = again.post(f"/jobs/{first}/finish", headers=JSON).json()
        assert (done["state"], done["trials"]) == ("queued", finished)
        status = _wait(again, first, ("done", "failed"))
        assert status["job"]["state"] == "done", status
        _, after = read_journal(tmp_path / "work" / "runs" / first / "study.journal")
        assert after == finished  # no new trial ran
        front = json.loads((tmp_path / "work" / "runs" / first / "front.json").read_text())
        assert front["points"] and front["evaluations"] >= 0
        page = again.get(f"/jobs/{first}").text
        assert f"{finished} of {finished} trials finished" in page and 'id="front"' in page
        assert "mpsearch export" in page.split('id="commands">')[1]
        exported = again.get(f"/jobs/{first}/export", params={"point": "0"})
        assert exported.status_code == 200
        import onnxruntime as ort

        session = ort.InferenceSession(exported.content, providers=["CPUExecutionProvider"])
        assert session.run(None, {"input": np.zeros((1, 1, 8, 8), np.float32)})[0].shape == (1, 10)
        again_done = again.post(f"/jobs/{first}/finish", headers=JSON)
        assert again_done.status_code == 409  # a finished search has its front already


def test_failed_job_shows_one_line(client: TestClient, tiny: tuple[Path, Path]) -> None:
    model = _model(client, tiny[0])
    data = _data(client, model, tiny[1])
    strict = _upload(client, f"/models/{model}/profiles", "strict.yaml",
                     b"schema: 1\nname: strict\nextends: x86_ort\nfallback: error\n"
                     b"unlisted_ops: []\nop_rules:\n  Flatten: {formats: [int8]}\n"
                     ).json()["id"]
    form = {**QUICK, "data": data, "kind": "analysis", "profile": f"upload:{strict}"}
    job = client.post(f"/models/{model}/jobs", data=form, headers=JSON).json()["id"]
    status = _wait(client, job, ("done", "failed"))
    error = status["job"]["error"]
    assert status["job"]["state"] == "failed" and "\n" not in error
    assert "op Flatten has no allowed format and fallback is 'error'" in error
    page = client.get(f"/jobs/{job}").text
    assert 'id="job-error"' in page and 'id="resume"' in page and "Traceback" not in page
    assert "mpsearch analyze " in page and "--calibration-samples 48 --limit 32" in page


def test_search_job_end_to_end(client: TestClient, tiny: tuple[Path, Path],
                               tmp_path: Path) -> None:
    import onnxruntime as ort

    from mpsearch.pipeline import search_run
    from mpsearch.report import write_report
    from mpsearch.spec import load_spec

    model = _model(client, tiny[0])
    data = _data(client, model, tiny[1])
    form = {**QUICK, "data": data, "kind": "search", "granularity": "per_tensor",
            "method": "percentile", "formats": "int8", "formats_shown": "1", "analysis": "off"}
    job = client.post(f"/models/{model}/jobs", data=form, headers=JSON).json()["id"]
    status = _wait(client, job, ("done", "failed"))
    run_dir = tmp_path / "work" / "runs" / job
    assert status["job"]["state"] == "done", (run_dir / "job.log").read_text()[-2000:]
    for name in ("spec.yaml", "hw_profile.yaml", "front.json", "trials.csv", "study.journal",
                 "report.html"):
        assert (run_dir / name).is_file(), name
    assert not (run_dir / "sensitivity.json").exists()  # per-node analysis was turned off
    downloaded = tmp_path / "downloads" / "spec.yaml"  # the spec runs from anywhere
    downloaded.parent.mkdir()
    downloaded.write_bytes(client.get(f"/jobs/{job}/spec.yaml").content)
    spec = load_spec(downloaded)
    assert (spec.budget.trials, spec.calibration.method, spec.formats) == (
        3, "percentile", ("int8",))
    assert spec.analysis is False
    assert spec.profile.endswith("hw_profile.yaml")
    assert "granularity: per_tensor" in client.get(f"/jobs/{job}/hw_profile.yaml").text
    page = client.get(f"/jobs/{job}").text
    assert 'id="front"' in page and 'iframe id="report"' in page and "--resume" in page
    assert ('<p class="note" id="cpu-numbers">These are ONNX Runtime numbers on this '
            "machine's CPU: no target toolchain verified this search") in page
    assert 'id="on-target"' not in page
    assert page.index('id="results"') < page.index('iframe id="report"')  # the front first
    front = json.loads((run_dir / "front.json").read_text())
    shown = [p for p in front["points"] if p.get("shown", not p.get("dominated", False))]
    hidden = [p for p in front["points"] if p not in shown]
    assert ('<p id="front-summary">3 of 3 trials finished (all runs of this job); '
            f'{len(shown)} point(s) on the front') in page
    assert (f", {len(hidden)} more beaten on the held-out re-measure" in page) == bool(hidden)
    assert '<p id="recommendation" class="recommendation"><b>Recommendation:</b> ' in page
    assert "accuracy (held-out split)</th><th>accuracy (search split)</th><th>weights</th>" \
        "<th>file</th><th>latency, batch 1</th>" in page
    assert f'<td class="weights">{bytes_text(shown[0]["size"])}</td>' in page
    assert '<td class="file"><span class="muted">on export</span></td>' in page
    fp32 = page.split('<tr class="baseline" data-baseline="fp32">')[1].split("</tr>")[0]
    assert f'<td class="metric">{front["fp32"]["metric"]:.4f}</td>' in fp32
    for key in front["uniform"]:  # every uniform baseline has its row
        assert f'<tr class="baseline" data-baseline="{key}">' in page, key
    chart = json.loads(page.split('id="page-data">')[1].split("</script>")[0])["chart"]
    assert chart["y"] == "accuracy (held-out split)" and [
        [p["metric"], p["size"]] for p in chart["points"] if p["shown"]] == [
        [p["metric"], p["size"]] for p in shown]
    assert [m["label"] for m in chart["marks"]][0] == "FP32"
    assert '<script src="/static/plotly.min.js"></script>' in page
    _check_front_fields(client, job, run_dir / "front.json")
    report = client.get(f"/jobs/{job}/report")
    assert report.headers["content-type"].startswith("text/html") and "Plotly" in report.text
    header = report.text[:report.text.index("<nav>")]  # the upload's name, no server folder
    assert f"<title>mpsearch report: {tiny[0].name}</title>" in header
    assert str(tmp_path) not in header
    assert write_report(run_dir).is_file()  # `mpsearch report` works on a served run
    resumed = search_run(spec.with_overrides(trials=4), run_dir, resume=True)  # and `--resume`
    assert len([r for r in resumed.result.trials if r.state == "complete"]) >= 3
    points, finished = read_journal(run_dir / "study.journal")
    assert finished >= 3 and points
    download = client.get(f"/jobs/{job}/export", params={"point": "0"})
    assert download.status_code == 200
    assert "tiny-point0.onnx" in download.headers["content-disposition"]
    session = ort.InferenceSession(download.content, providers=["CPUExecutionProvider"])
    out = session.run(None, {"input": np.zeros((2, 1, 8, 8), np.float32)})[0]
    assert out.shape == (2, 10)
    file_size = len(download.content)
    assert f'<td class="file">{bytes_text(file_size)}</td>' in client.get(f"/jobs/{job}").text
    count = len(json.loads((run_dir / "front.json").read_text())["points"])
    assert json.loads((run_dir / "front.json").read_text())["objectives"] == ["metric", "size"]
    started = time.monotonic()
    for point, status_code, message in (
            ("%C2%B2", 400, "point must be the number of a front point, such as 0; got '²'"),
            ("-1", 400, "point must be the number of a front point, such as 0; got '-1'"),
            ("99", 404, f"point 99 is not on this search's front, which has points 0 to "
                        f"{count - 1}; pick one from the table")):
        bad = client.get(f"/jobs/{job}/export?point={point}", headers=JSON)
        assert (bad.status_code, bad.json()["error"]) == (status_code, message), point
    assert time.monotonic() - started < 1.0  # refused before any worker starts
    assert sorted(p.name for p in (run_dir / "exports").iterdir()) == ["point-0.onnx"]


def test_search_whose_every_point_the_target_rejects_ends_unverified(
        client: TestClient, tiny: tuple[Path, Path], tmp_path: Path) -> None:
    """A real search verified on Vela with a system config Vela refuses: the worker exits 4
    as the CLI does, the job ends "unverified" (neither done nor failed) with each point's
    reason, every shown point's row is marked failed and none is recommended."""
    from mpsearch.profiles import load_profile

    text = Path(load_profile("ethos_u55").path).read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("toolchain:"))
    bad = text.replace(line, "toolchain: {name: vela, accelerator_config: ethos-u55-128, "
                             "system_config: Nope}").encode()
    model = _model(client, tiny[0])
    data = _data(client, model, tiny[1])
    profile = _upload(client, f"/models/{model}/profiles", "u55_nope.yaml", bad)
    assert profile.status_code == 201, profile.text
    form = {**QUICK, "data": data, "kind": "search", "analysis": "off", "verify": "front",
            "profile": f"upload:{profile.json()['id']}"}
    submitted = client.post(f"/models/{model}/jobs", data=form, headers=JSON)
    assert submitted.status_code == 201, submitted.text
    job = submitted.json()["id"]
    status = _wait(client, job, ("done", "failed", "unverified"))["job"]
    run_dir = tmp_path / "work" / "runs" / job
    assert (status["state"], status["exit_code"], status["error"]) == ("unverified", 4, None), (
        run_dir / "job.log").read_text()[-2000:]
    front = json.loads((run_dir / "front.json").read_text())
    shown = [p for p in front["points"] if p["shown"]]
    assert shown and front["recommended"] is None
    reasons = "; ".join(f"point {p['index']}: {p['target_failure']}" for p in shown)
    assert all(p["target_failure"].startswith("vela could not compile it: ") for p in shown)
    assert status["note"] == (f"no verified point: all {len(shown)} shown point(s) failed "
                              f"verification on vela ({reasons})")
    page = client.get(f"/jobs/{job}").text
    assert '<span class="state unverified" id="job-state">unverified</span>' in page
    box = page.split('<div class="unverified" role="status" id="job-unverified">')[1]
    assert box.startswith(f"<b>No verified point:</b> all {len(shown)} shown point(s) failed")
    assert 'id="job-error"' not in page and 'id="resume"' not in page
    assert '<p id="recommendation" class="recommendation none">' in page
    assert 'class="tag recommended"' not in page and " checked>" not in page
    for p in shown:
        row = page.split(f'<tr id="row-{p["index"]}" data-point="{p["index"]}"')[1]
        assert row.startswith(' class="target-failed">'), row[:200]
        assert '<span class="tag target-failed">failed on the target</span>' in row.split(
            "</tr>")[0]
    assert page.count('<td class="verdict failed">failed: vela could not compile it: ') == len(
        shown)
    jobs = client.get("/api/jobs").json()["jobs"]
    assert [j["summary"]["recommendation"] for j in jobs if j["id"] == job] == [
        front["recommendation"]]
    assert client.post(f"/jobs/{job}/finish", headers=JSON).status_code == 409


def _check_front_fields(client: TestClient, job: str, path: Path) -> None:
    """The page follows front.json's recommendation, ``shown`` flags and latency spreads
    (written by the engine; here added to a real front.json, then the file is restored)."""
    original = path.read_text()
    front = json.loads(original)
    assert front["latency_source"] == "measured" and len(front["points"]) >= 2
    points = front["points"]
    last = len(points) - 1
    for p in points:  # the real search's own flags replaced: only point 0 is hidden here
        p.update(shown=True, beaten_by=None)
    points[0].update(shown=False, beaten_by="uniform int8")
    fp32_ms = front["fp32"]["latency_ms"]
    for p in points:  # a point the real search hid was not timed: it gets FP32's figure
        p["latency_ms"] = p["latency_ms"] or fp32_ms
        p["latency_ms_interval"] = [p["latency_ms"] * 0.9, p["latency_ms"] * 1.1]
    front["fp32"]["latency_ms_interval"] = [fp32_ms * 0.95, fp32_ms * 1.05]
    points[last]["latency_ms"] = fp32_ms * 1.02  # the spreads overlap: no speed claimed
    points[last]["latency_ms_interval"] = [fp32_ms * 0.97, fp32_ms * 1.08]
    target = points[last]["metric"] - 0.0125  # as a `verify: front` run writes it
    points[last].update(target_metric=target, target_cost={"cycles": 123456.0},
                        target_placement={"toolchain": "qnn", "version": "onnxruntime-qnn 2.7.0",
                                          "nodes": 7, "on_accelerator": 6,
                                          "fallback": [{"node": "/Flatten",
                                                        "reason": "not supported"}],
                                          "settings": {"htp_arch": 73}})
    front.update(recommended=last, recommendation=f"deploy point {last}: checked text",
                 stopped="the front did not change in the last 20 trials")
    path.write_text(json.dumps(front))
    try:
        page = client.get(f"/jobs/{job}").text
    finally:
        path.write_text(original)
    assert ('<p id="recommendation" class="recommendation"><b>Recommendation:</b> deploy '
            f"point {last}: checked text</p>") in page
    assert ('<p id="stopped" class="note">The search stopped early: the front did not change '
            "in the last 20 trials</p>") in page
    assert f'value="{last}" id="point-{last}" checked>' in page
    assert page.count(" checked>") == 1  # one point preselected
    # the command line exports the recommended point (the script follows the selection)
    assert f'--point <span id="export-point">{last}</span> --out model.onnx' in page
    # the point run on the target: both metrics, its placement and the toolchain's cost
    on_target = page.split('<section id="on-target">')[1].split("</section>")[0]
    assert "<b>qnn</b> (onnxruntime-qnn 2.7.0; htp_arch 73)" in on_target
    assert (f'<tr data-point="{last}"><td>{last}</td><td class="ort">'
            f'{points[last]["metric"]:.4f}</td><td class="target-metric">{target:.4f}</td>'
            '<td>-0.0125</td><td class="placement">6 of 7 on the accelerator, 1 on the CPU'
            '</td><td class="cost">cycles 123,456</td><td class="fallback">/Flatten: not '
            'supported</td><td class="verdict">ok</td></tr>') in on_target
    assert 'id="cpu-numbers"' not in page
    table = page.split('<tbody id="front-points">')[1].split("</tbody>")[0]
    hidden = page.split('<table id="hidden">')[1].split("</table>")[0]
    assert 'id="row-0"' not in table and 'id="row-0"' in hidden
    assert '<td class="beaten-by">uniform int8</td>' in hidden
    # a point's latency in the CLI's and the report's words (one function), both batches
    def words(entry: dict[str, Any]) -> str:
        return latency_words(entry, front["fp32"], batch=front.get("latency_batch"),
                             source=front.get("latency_source"))
    assert f'<small class="words">{html.escape(words(points[0]))}</small>' in hidden
    row = table.split(f'id="row-{last}"')[1].split("</tr>")[0]
    low, high = fp32_ms * 0.97, fp32_ms * 1.08
    assert (f'{fp32_ms * 1.02:.3g} ms <span class="spread">[{low:.3g}–{high:.3g}]</span>'
            f'<small class="words">{html.escape(words(points[last]))}</small>') in row
    assert words(points[last]).startswith("as fast as FP32 (within the spread) at batch 1")
    chart = json.loads(page.split('id="page-data">')[1].split("</script>")[0])["chart"]
    assert chart["selected"] == last
    assert [p["index"] for p in chart["points"] if not p["shown"]] == [0]


# -- progress parsing and the CLI --------------------------------------------------------------
def test_progress_is_read_as_data(tmp_path: Path) -> None:
    """The worker's reports reach the job page through progress.jsonl, a torn line skipped."""
    report = JsonlProgress(tmp_path / "progress.jsonl", interval=0.0)
    report(Progress(stage="calibrate", done=48, total=48, unit="sample"))
    report(Progress(stage="search", done=0, total=3, unit="trial"))
    report(Progress(stage="search", done=1, total=3, unit="trial",
                    info={"best": 0.9, "front": 1, "evals": 1}))
    with (tmp_path / "progress.jsonl").open("a") as f:
        f.write('{"stage": "search", "done": 2, "tot')  # the worker is mid-write
    shown = job_progress(tmp_path, kind="analysis", trials=None)
    bar = shown["bar"]
    assert (shown["stage"], bar["done"], bar["total"], bar["unit"]) == ("search", 1, 3, "trial")
    assert bar["postfix"] == {"best": 0.9, "front": 1, "evals": 1}
    assert bar["elapsed"] >= 0.0 and bar["left"] == pytest.approx(2 * bar["elapsed"])
    journal = tmp_path / "study.journal"
    assert read_journal(journal) == ([], 0)
    study = optuna.create_study(
        study_name="mpsearch", directions=["maximize", "minimize"],
        storage=optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(journal))))
    for values in ([0.9, 100.0], None, [0.8, 50.0], [0.7, 80.0]):
        trial = study.ask()
        if values is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, values)
    study.ask()  # a running trial is not finished
    points, finished = read_journal(journal)
    assert finished == 4 and pareto(points, higher=True) == [(0.8, 50.0, ""), (0.9, 100.0, "")]
    # one metric at sizes within the 0.1 % tie is one row, the smallest, with its formats
    tied = [(0.9876, 43_180.0, "int16 21"), (0.9876, 43_150.0, "a16w16 1, int16 20"),
            (0.9876, 43_170.0, "int16 20, int8 1"), (0.9, 40_000.0, "int8 21")]
    assert pareto(tied, higher=True) == [(0.9, 40_000.0, "int8 21"),
                                         (0.9876, 43_150.0, "a16w16 1, int16 20")]


def test_overall_progress_is_an_honest_estimate() -> None:
    """The whole job's estimate: stages in order, the search's time left from its own trials
    (the trials until the patience stop if the front keeps still, the held-out re-measure
    counted; "about", never "at most"), none before it starts."""
    from mpsearch.serve._progress import overall, since_change

    spec = {"analysis": False, "seeding": True, "data": {"held_out": 0.5},
            "budget": {"patience": 20}}
    t0 = 1_000.0
    records = [
        {"stage": "calibrate", "done": 0, "total": 64, "elapsed": 0.0, "time": t0 + 1},
        {"stage": "calibrate", "done": 64, "total": 64, "elapsed": 2.0, "time": t0 + 3},
        {"stage": "group costs", "done": 5, "total": 20, "elapsed": 1.0, "time": t0 + 5}]
    early = overall(records, kind="search", spec=spec, started="1970-01-01T00:16:40+00:00",
                    trials=100, now=t0 + 6)
    assert early["phases"] == ["loading and calibration", "seeding", "search",
                               "held-out re-measure"]
    assert (early["index"], early["elapsed"], early["left"], early["fraction"]) == (
        1, 6.0, None, None)  # the search has not started: no time left is claimed
    assert early["notes"] == ["the time left shows once the search's first trials finish"]
    records += [{"stage": "search", "done": 10, "total": 100, "elapsed": 0.0, "time": t0 + 10},
                {"stage": "search", "done": 30, "total": 100, "elapsed": 10.0,
                 "time": t0 + 20}]
    mid = overall(records, kind="search", spec=spec, started="1970-01-01T00:16:40+00:00",
                  trials_done=30, trials=100, front_size=4, since_change=5, now=t0 + 20)
    # 0.5 s a trial: the front last changed 5 trials ago, so the patience stop (20) comes in
    # 15 trials if it keeps still; then 4 front points re-measured on as many samples
    assert mid["index"] == 2 and mid["left"] == pytest.approx(0.5 * (15 + 4))
    assert mid["upper"] is False and mid["fraction"] == pytest.approx(20 / (20 + 9.5))
    assert ("about: the patience stop ends the search 20 trials after the front last changed "
            "(now 5 ago); a change starts the count again") in mid["notes"]
    near_end = overall(records, kind="search", spec=spec, started="1970-01-01T00:16:40+00:00",
                       trials_done=95, trials=100, front_size=4, since_change=0, now=t0 + 20)
    assert near_end["left"] == pytest.approx(0.5 * (5 + 4))  # the budget ends it first
    no_patience = overall(records, kind="search", spec={**spec, "budget": {"patience": 0}},
                          started="1970-01-01T00:16:40+00:00", trials_done=30, trials=100,
                          front_size=4, since_change=5, now=t0 + 20)
    assert no_patience["upper"] is False and no_patience["left"] == pytest.approx(0.5 * 74)
    assert since_change([(0.9, 100.0), (0.8, 50.0), (0.7, 80.0), (0.85, 60.0), (0.6, 90.0)],
                        higher=True) == 1  # (0.85, 60) joined the front; (0.6, 90) did not
    assert since_change([], higher=True) == 0
    resumed = overall(records, kind="search", spec=spec,  # an older run's records: ignored
                      started="1970-01-01T00:17:05+00:00", trials=100, now=t0 + 27)
    assert (resumed["index"], resumed["elapsed"], resumed["left"]) == (0, 2.0, None)


def _serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """`mpsearch serve` in a subprocess (as the CLI runs it); its printed address."""
    code = ("import argparse, sys; from mpsearch.cli._serve import add_serve_parser as a\n"
            "p = argparse.ArgumentParser(); a(p.add_subparsers())\n"
            "args = p.parse_args(sys.argv[1:]); sys.exit(args.func(args))")
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--port", "0", "--workdir",
                             str(tmp_path / "w"), *args], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    return proc, line


def _open(opener: urllib.request.OpenerDirector, address: str) -> Any:
    for _ in range(50):
        try:
            return opener.open(address, timeout=5)
        except urllib.error.HTTPError:
            raise
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{address} did not answer")


def test_cli_serve_prints_its_token_address_and_stops_on_sigterm(tmp_path: Path) -> None:
    import http.cookiejar

    from mpsearch.cli._serve import add_serve_parser

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve"])
    assert (args.host, args.port, args.func.__name__) == ("127.0.0.1", 8765, "handler")
    proc, line = _serve(tmp_path)
    try:
        assert line.startswith("mpsearch serve: http://127.0.0.1:"), line
        address = line.split()[2]
        base, _, token = address.partition("/?token=")
        assert len(token) == 32, address
        bare = urllib.request.build_opener()
        with pytest.raises(urllib.error.HTTPError) as refused:
            _open(bare, base + "/")
        assert refused.value.code == 403
        assert "missing or wrong access token" in refused.value.read().decode()
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        with _open(browser, address) as response:  # the token address, then the cookie
            assert response.status == 200 and response.url == base + "/"
        with _open(browser, base + "/jobs") as response:
            assert response.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out.strip().splitlines()[-1] == "mpsearch serve: stopped"
    assert (tmp_path / "w" / "uploads").is_dir()


def test_cli_serve_on_ipv6_loopback(tmp_path: Path) -> None:
    import socket

    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    proc, line = _serve(tmp_path, "--host", "::1")
    try:
        assert line.startswith("mpsearch serve: http://[::1]:"), line
        address = line.split()[2]
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with _open(opener, address.replace("/?", "/jobs?")) as response:
            assert response.status == 200 and response.url.endswith("]:" + address.split(
                "]:")[1].split("/")[0] + "/jobs")
        rebound = urllib.request.Request(address.replace("/?", "/jobs?"),
                                         headers={"Host": "evil.example", **JSON})
        with pytest.raises(urllib.error.HTTPError) as refused:
            _open(urllib.request.build_opener(), rebound)  # type: ignore[arg-type]
        assert refused.value.code == 400
        assert json.loads(refused.value.read())["error"].startswith(
            "unknown Host header 'evil.example'; this server answers 127.0.0.1, localhost, "
            "[::1] only")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0




@pytest.mark.parametrize(("kind", "name"), [
    ("model", "constant_of_shape_bomb.onnx"),
    ("data", "npz_bomb.npz"), ("data", "npz_header_lie.npz"), ("data", "truncated.npz"),
    ("data", "nan.npz"), ("data", "pil_bomb/bomb.png"), ("data", "png_bomb/bomb.png"),
    ("profile", "non_utf8_profile.yaml"),
])
def test_hostile_corpus_uploads_get_a_readable_4xx(client: TestClient, tiny: tuple[Path, Path],
                                                    tmp_path: Path, kind: str, name: str
                                                    ) -> None:
    """Every file of tests/hostile/ that a person can upload: a 4xx with one sentence naming
    no server path, never a 500, and nothing kept."""
    payload = (HOSTILE / name).read_bytes()
    filename = Path(name).name
    if kind == "model":
        response = _upload(client, "/models", filename, payload)
    else:
        model = _model(client, tiny[0])
        url = f"/models/{model}/data" if kind == "data" else f"/models/{model}/profiles"
        response = _upload(client, url, filename, payload)
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    error = response.json()["error"]
    assert "\n" not in error and str(tmp_path) not in error and "Traceback" not in error
    work = tmp_path / "work"
    assert len(_left(work, "models")) == (0 if kind == "model" else 1)  # the tiny model only
    assert _left(work, "data") == [] and _left(work, "profiles") == []


def test_the_same_upload_twice_is_one_entry(client: TestClient, tiny: tuple[Path, Path],
                                            tmp_path: Path) -> None:
    """The same file under the same name is stored once (models, and data for one model);
    another name or another model is another entry."""
    model = _model(client, tiny[0])
    assert _model(client, tiny[0]) == model
    renamed = _upload(client, "/models", "other.onnx", tiny[0].read_bytes())
    assert renamed.status_code == 201 and renamed.json()["id"] != model
    data = _data(client, model, tiny[1])
    assert _data(client, model, tiny[1]) == data
    assert _data(client, str(renamed.json()["id"]), tiny[1]) != data
    uploads = tmp_path / "work" / "uploads"
    assert len(list((uploads / "models").iterdir())) == 2
    assert len(list((uploads / "data").iterdir())) == 2
