"""Hostile requests to a real ``mpsearch serve`` (uvicorn in a child process, real HTTP): each
gets a 4xx with one sentence and the security headers, nothing is left in the work directory,
the image bombs leave the server's own memory within 200 MB of its idle size, and half-sent
requests (slowloris) neither hold their connections nor delay real requests."""

from __future__ import annotations

import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _paths import FIXTURES, HOSTILE

from mpsearch.errors import SpecError
from mpsearch.serve._worker import served_spec

pytestmark = pytest.mark.slow  # whole searches, servers, browsers, toolchains

MODEL = FIXTURES / "resnet.onnx"
DATA = FIXTURES / "digits_eval.npz"
sys.path.insert(0, str(HOSTILE))
import forge  # noqa: E402

RSS_GROWTH_LIMIT_KB = 200_000  # 200 MB


class Server:
    def __init__(self, proc: subprocess.Popen[str], port: int, token: str, workdir: Path
                 ) -> None:
        self.proc, self.port, self.token, self.workdir = proc, port, token, workdir

    def status_kb(self, key: str) -> int:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(line for line in text.splitlines() if line.startswith(key)).split()[1])

    def request(self, method: str, path: str, body: bytes = b"",
                headers: dict[str, str] | None = None, token: bool = True
                ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        sent = {"Host": f"127.0.0.1:{self.port}", "Origin": f"http://127.0.0.1:{self.port}",
                "Accept": "application/json", **(headers or {})}
        if token:
            sent["X-Mpsearch-Token"] = self.token
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data

    def post_form(self, path: str, fields: dict[str, str], file: tuple[str, bytes] | None
                  ) -> tuple[int, dict[str, str], bytes]:
        boundary = uuid.uuid4().hex
        parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
                 .encode() for k, v in fields.items()]
        if file is not None:
            parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                         f'filename="{file[0]}"\r\nContent-Type: application/octet-stream'
                         '\r\n\r\n'.encode() + file[1] + b"\r\n")
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        return self.request("POST", path, body,
                            {"Content-Type": f"multipart/form-data; boundary={boundary}"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("serve")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "mpsearch", "serve", "--port", "0",
                             "--workdir", str(workdir), "--max-upload-mb", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    address = line.split()[2]  # http://127.0.0.1:PORT/?token=...
    port = int(address.split(":")[2].split("/")[0])
    token = address.split("token=")[1]
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain the log
    try:
        yield Server(proc, port, token, workdir)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _one_sentence(body: bytes) -> str:
    message: str = json.loads(body)["error"]
    assert "\n" not in message and message.strip(), message
    return message


def _secure(headers: dict[str, str]) -> None:
    assert headers.get("x-content-type-options") == "nosniff", headers
    assert "default-src 'self'" in headers.get("content-security-policy", ""), headers
    assert headers.get("x-frame-options") == "SAMEORIGIN", headers


def _model(server: Server) -> str:
    status, _, body = server.post_form("/models", {}, ("resnet.onnx", MODEL.read_bytes()))
    assert status == 201, body
    model_id: str = json.loads(body)["id"]
    return model_id


def _zip(files: dict[str, bytes]) -> bytes:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"hostile-{uuid.uuid4().hex}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    data = path.read_bytes()
    path.unlink()
    return data


def test_image_bombs_get_a_4xx_and_leave_the_server_small(server: Server) -> None:
    model = _model(server)
    status, _, _ = server.request("GET", f"/api/models/{model}")
    assert status == 200
    time.sleep(3)  # the warm-up import of onnxruntime ends
    idle = server.status_kb("VmRSS:")
    tiny = _zip({f"img/{i}.png": forge.png(4, 4) for i in range(6)})
    assert len(tiny) < 1100
    big = _zip({f"img/{i}.png": forge.png(6000, 6000) for i in range(8)})
    cases = [("six 4x4 PNGs as 8192x8192", tiny, {"image_size": "8192,8192"},
              "6 images of 8192x8192x3 as float32 takes the data past 5568 MiB decoded"),
             ("eight 6000x6000 PNGs", big, {},
              "8 images of 6000x6000x3 as float32 takes the data past 4086 MiB decoded")]
    for name, archive, fields, message in cases:
        status, headers, body = server.post_form(f"/models/{model}/data", fields,
                                                 ("images.zip", archive))
        text = _one_sentence(body)
        print(f"{name}: {status} {text}")
        assert status == 400 and message in text and "images.zip" in text, (status, text)
        _secure(headers)
    peak = server.status_kb("VmHWM:")
    print(f"server RSS idle {idle / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB")
    assert peak - idle < RSS_GROWTH_LIMIT_KB, (idle, peak)
    assert list((server.workdir / "uploads" / "data").iterdir()) == []  # nothing left behind


def test_bad_fields_and_refusals_get_a_4xx_with_headers(server: Server) -> None:
    model = _model(server)
    tiny = _zip({f"img/{i}.png": forge.png(4, 4) for i in range(6)})
    for field, value in (("image_dtype", "V100000000"), ("image_dtype", "object"),
                         ("image_size", "8,8,8"), ("image_mean", "1,2"),
                         ("image_scale", "1e400"), ("image_size", "0")):
        status, headers, body = server.post_form(f"/models/{model}/data", {field: value},
                                                 ("images.zip", tiny))
        text = _one_sentence(body)
        assert 400 <= status < 500, (field, value, status, text)
        assert text.startswith("image options:"), text
        _secure(headers)
    refusals = [server.request("GET", "/api/jobs", token=False),  # 403: no token
                server.request("GET", "/api/jobs", headers={"Host": "evil.example"}),  # 400
                server.request("POST", f"/models/{model}/data", b"x",
                               {"Content-Length": str(10**9)})]  # 413
    assert [r[0] for r in refusals] == [403, 400, 413]
    for _, headers, body in refusals:
        _one_sentence(body)
        _secure(headers)


def test_concurrent_submissions_get_distinct_numbers(server: Server) -> None:
    model = _model(server)
    status, _, body = server.post_form(f"/models/{model}/data", {},
                                       ("digits.npz", DATA.read_bytes()))
    assert status == 201, body
    data = json.loads(body)["id"]
    fields = {"kind": "analysis", "profile": "shipped:x86_ort", "data": data,
              "metric": "accuracy", "calibration": "8", "analysis": "off"}
    results: list[tuple[int, dict[str, Any]]] = []
    lock = threading.Lock()

    def submit() -> None:
        status, _, body = server.post_form(f"/models/{model}/jobs", fields, None)
        with lock:
            results.append((status, json.loads(body)))

    threads = [threading.Thread(target=submit) for _ in range(150)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [s for s, _ in results] == [201] * 150, results[:3]
    ids = {doc["id"] for _, doc in results}
    numbers = {doc["title"].split()[0] for _, doc in results}
    print(f"150 submissions: {len(ids)} ids, {len(numbers)} numbers")
    assert len(ids) == 150 and len(numbers) == 150
    for doc in json.loads(server.request("GET", "/api/jobs")[2])["jobs"]:
        if doc["state"] in ("queued", "running"):
            server.request("POST", f"/jobs/{doc['id']}/cancel")


def test_half_sent_requests_do_not_hold_the_server(server: Server) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    held = []
    try:
        for _ in range(1100):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends
            held.append(sock)
        start = time.monotonic()
        status, headers, _ = server.request("GET", "/api/jobs")
        waited = time.monotonic() - start
        print(f"a real request behind 1100 half-sent ones: {status} in {waited:.2f} s")
        assert status == 200 and waited < 5.0
        _secure(headers)
        time.sleep(11)  # past the 10 s header timeout every held connection is closed
        closed = 0
        for sock in held:
            sock.settimeout(2)
            try:
                closed += sock.recv(1) == b""
            except (ConnectionResetError, TimeoutError):
                closed += isinstance(sys.exc_info()[1], ConnectionResetError)
        print(f"closed by the server: {closed} of {len(held)}")
        assert closed == len(held)
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("key, value", [("metric", "os:abort"), ("data", "os:abort")])
def test_served_jobs_refuse_code_in_their_spec(tmp_path: Path, key: str, value: str) -> None:
    spec = {"model": str(MODEL), "profile": "x86_ort", "data": {"source": str(DATA)},
            "metric": "accuracy"}
    if key == "metric":
        spec["metric"] = value
    else:
        spec["data"] = {"source": value}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))
    with pytest.raises(SpecError, match="Python code"):
        served_spec(path)


def test_the_decoder_process_stops_at_its_memory_limit(tmp_path: Path) -> None:
    """Data within the budget but over the worker's address-space cap: a MemoryError in the
    worker, reported as one line, never a larger process."""
    import numpy as np

    from mpsearch.serve._worker import worker_command

    path = tmp_path / "data.npz"
    np.savez(path, input=np.zeros((200, 1 << 18), np.float32))  # 200 MiB, stored
    request = {"raw": str(path), "target": str(path), "kind": "npz", "images": {},
               "model": str(MODEL), "memory": 350 << 20}
    done = subprocess.run(worker_command("data", json.dumps(request)), capture_output=True,
                          text=True, check=False)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert lines == [f"mpsearch: error: {path}: decoding it needs more than the 0.3 GiB an "
                     "upload may use; upload less data or smaller images"], done.stderr


def _upload_head(server: Server) -> str:
    return (f"POST /models HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Origin: http://127.0.0.1:{server.port}\r\nX-Mpsearch-Token: {server.token}\r\n"
            "Accept: application/json\r\nContent-Type: multipart/form-data; boundary=x\r\n"
            "Content-Length: 100000\r\n\r\n--x\r\n")


def _trickle(server: Server) -> tuple[bytes, float]:
    """One byte a second: never a 30 s pause, but under the 10 kB/s floor."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall((_upload_head(server) + 'Content-Disposition: form-data; '
                  'name="file"; filename="m.onnx"\r\n\r\n').encode())
    start = time.monotonic()
    sock.settimeout(1.0)
    reply = b""
    while time.monotonic() - start < 60 and not reply:
        try:
            sock.sendall(b"-")
            reply = sock.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    waited = time.monotonic() - start
    sock.settimeout(10.0)
    while reply and not reply.rstrip().endswith(b"}"):  # the rest of the 408's body
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    sock.close()
    return reply, waited


def _stall(server: Server) -> tuple[bytes, float]:
    """The head and the first boundary, then nothing."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    start = time.monotonic()
    sock.sendall(_upload_head(server).encode())
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    sock.close()
    return reply, time.monotonic() - start


def test_a_trickling_or_stalled_body_gets_a_408(server: Server) -> None:
    """A body that trickles and one that stalls, sent at the same time (each waits out the
    server's 30 s): each gets its 408 after about 30 s, with the security headers."""
    replies: dict[str, tuple[bytes, float]] = {}
    clients = [threading.Thread(target=lambda name=name, send=send: replies.__setitem__(
        name, send(server))) for name, send in (("trickle", _trickle), ("stall", _stall))]
    for client in clients:
        client.start()
    for client in clients:
        client.join(timeout=90)
    latest = {"trickle": 40, "stall": 45}  # seconds: each client's bound of the two tests
    for name, (reply, waited) in replies.items():
        status_line, _, rest = reply.partition(b"\r\n")
        print(f"{name}: {status_line.decode()} after {waited:.1f} s")
        assert status_line.startswith(b"HTTP/1.1 408") and 29 < waited < latest[name], (
            name, reply)
        assert b"x-content-type-options: nosniff" in rest.lower(), (name, reply)
        assert b"the request body paused for 30 s or came slower than 10 kB/s" in rest, name
    assert sorted(replies) == ["stall", "trickle"]
