"""A large upload to a real ``mpsearch serve`` (uvicorn in a child process, real HTTP): a
model of 600k nodes (generated at test time by tests/hostile/uploads.py) is read in a worker
process under the upload memory and time limits, and refused there by its node count, so the
server's own memory grows by less than 300 MB and ``/api/jobs`` keeps answering within 3 s
while it is uploaded."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from _paths import HOSTILE

pytestmark = pytest.mark.slow  # a 600k-node model is generated (20 s) and uploaded

_SPEC = importlib.util.spec_from_file_location("hostile_uploads", HOSTILE / "uploads.py")
assert _SPEC is not None and _SPEC.loader is not None
uploads = sys.modules["hostile_uploads"] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(uploads)

GROWTH_LIMIT_KB = 300_000  # 300 MB
ANSWER_LIMIT_S = 3.0


def _rss_kb(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in text.splitlines() if line.startswith("VmRSS:")).split()[1])


def _request(port: int, token: str, method: str, path: str, body: bytes = b"",
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    conn.request(method, path, body=body, headers={
        "Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}",
        "Accept": "application/json", "X-Mpsearch-Token": token, **(headers or {})})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def _form(name: str, data: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"'
            '\r\nContent-Type: application/octet-stream\r\n\r\n').encode() + data + \
        f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


class _Watch(threading.Thread):
    """Polls ``/api/jobs`` and the server's RSS until stopped: the slowest answer and the
    largest RSS seen."""

    def __init__(self, pid: int, port: int, token: str) -> None:
        super().__init__(daemon=True)
        self.pid, self.port, self.token = pid, port, token
        self.stop, self.slowest, self.peak_kb, self.answers = threading.Event(), 0.0, 0, 0

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak_kb = max(self.peak_kb, _rss_kb(self.pid))
            start = time.perf_counter()
            status, _ = _request(self.port, self.token, "GET", "/api/jobs")
            assert status == 200
            self.slowest = max(self.slowest, time.perf_counter() - start)
            self.answers += 1
            self.stop.wait(0.25)


def test_a_600k_node_model_upload_leaves_the_server_small_and_answering(tmp_path: Path
                                                                        ) -> None:
    model = uploads.many_nodes(tmp_path / "many.onnx")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "mpsearch", "serve", "--port", "0",
                             "--workdir", str(tmp_path / "work"), "--max-upload-mb", "64"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().split()[2]  # http://127.0.0.1:PORT/?token=...
        port, token = int(address.split(":")[2].split("/")[0]), address.split("token=")[1]
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain the log
        assert _request(port, token, "GET", "/api/jobs")[0] == 200
        idle = _rss_kb(proc.pid)
        watch = _Watch(proc.pid, port, token)
        watch.start()
        body, kind = _form("many.onnx", model.read_bytes())
        status, answer = _request(port, token, "POST", "/models", body, {"Content-Type": kind})
        watch.stop.set()
        watch.join()
        growth = max(watch.peak_kb, _rss_kb(proc.pid)) - idle
        print(f"status {status}; server RSS idle {idle} kB, growth {growth} kB; "
              f"/api/jobs answered {watch.answers} times, slowest {watch.slowest:.2f} s")
        message = json.loads(answer)["error"]  # counted in the worker, refused unsummarised
        assert status == 413 and message == (
            "many.onnx: the model has 600000 nodes, more than the 200000 an upload may use; "
            "summarise and search it with the CLI (mpsearch summary, mpsearch search)"), answer
        assert not list((tmp_path / "work" / "uploads" / "models").iterdir())
        assert growth < GROWTH_LIMIT_KB
        assert watch.answers >= 2 and watch.slowest < ANSWER_LIMIT_S
    finally:
        proc.terminate()
        proc.wait(timeout=60)
