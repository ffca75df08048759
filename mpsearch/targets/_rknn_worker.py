"""RKNN-Toolkit2 worker: run by the RKNN environment's own Python, never imported by mpsearch.

``python _rknn_worker.py REQUEST.json`` reads one request (JSON), drives RKNN-Toolkit2 and
writes the result JSON named in it; arrays travel as NPZ files, never pickle. The toolkit's
verbose log goes to this process's stdout, which the caller keeps and parses.

* ``compile``: load the ONNX model with static input shapes, build for ``target_platform``
  (``do_quantization`` false: a QDQ model carries its own scales, float layers become FP16;
  with a ``dataset`` the toolkit quantizes a float model itself, as ``quantized_dtype`` says)
  and export the ``.rknn`` file.
* ``serve``: the same load and build, then the simulator (``init_runtime()`` with no target)
  kept open: each stdin line is a job (inputs NPZ -> outputs NPZ, one inference per sample
  along axis 0), answered by a result file and a ``done`` line on stdout; the toolkit's own
  output goes to the request's ``log`` file.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np


def _write(path: str, result: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, path)


def _version() -> str:
    import rknn  # type: ignore[import-not-found]

    with open(os.path.join(rknn.__path__[0], "VERSION"), encoding="utf-8") as f:
        return f.read().strip().splitlines()[0]


def _built(request: dict[str, Any], result: dict[str, Any]) -> Any:
    from rknn.api import RKNN  # type: ignore[import-not-found]

    rknn = RKNN(verbose=True)
    steps: tuple[tuple[str, Callable[[], Any]], ...] = (
        ("config", lambda: rknn.config(target_platform=request["target_platform"],
                                       **({"quantized_dtype": request["quantized_dtype"]}
                                          if request.get("quantized_dtype") else {}))),
        ("load_onnx", lambda: rknn.load_onnx(model=request["model"], inputs=request["inputs"],
                                             input_size_list=request["shapes"])),
        ("build", lambda: rknn.build(do_quantization=bool(request.get("dataset")),
                                     dataset=request.get("dataset"))),
    )
    for stage, step in steps:
        result["stage"] = stage
        code = step()
        if code != 0:
            result["code"] = code
            return None
    return rknn


def _compile(request: dict[str, Any], result: dict[str, Any]) -> None:
    rknn = _built(request, result)
    if rknn is None:
        return
    result["stage"] = "export_rknn"
    code = rknn.export_rknn(request["artifact"])
    result["code"] = code
    result["ok"] = code == 0
    rknn.release()


def _infer(rknn: Any, job: dict[str, Any], result: dict[str, Any]) -> None:
    """One inference per ``batch`` samples of ``job["data"]``; outputs stacked to an NPZ."""
    result["stage"] = "inference"
    with np.load(job["data"], allow_pickle=False) as data:
        arrays = [data[name] for name in job["inputs"]]
    batch = int(job["batch"])
    outputs: list[list[np.ndarray]] = []
    for i in range(arrays[0].shape[0] // batch):
        feeds = [a[i * batch:(i + 1) * batch] for a in arrays]
        got = rknn.inference(inputs=feeds, data_format=["nchw"] * len(feeds))
        if got is None:
            result["code"] = -1
            result["sample"] = i
            return
        outputs.append([np.asarray(o) for o in got])
    tmp = job["outputs"] + ".tmp.npz"
    np.savez(tmp, **{f"output_{k}": np.concatenate([o[k] for o in outputs])
                     for k in range(len(outputs[0]))})  # type: ignore[arg-type]
    os.replace(tmp, job["outputs"])
    result["ok"] = True
    result["code"] = 0


def _serve(request: dict[str, Any], result: dict[str, Any], channel: TextIO) -> None:
    """Build once, start the simulator, then answer one job a stdin line (a JSON job with
    ``data``, ``outputs``, ``result``, ``inputs``, ``batch``) until stdin closes; each answer
    is a result file and a ``done`` line on ``channel``."""
    rknn = _built(request, result)
    if rknn is None:
        return
    result["stage"] = "init_runtime"
    code = rknn.init_runtime()
    if code != 0:
        result["code"] = code
        return
    result.update(ok=True, code=0, stage="serving")
    _write(request["result"], result)
    channel.write("ready\n")
    channel.flush()
    for line in sys.stdin:
        job = json.loads(line)
        answer: dict[str, Any] = {"ok": False, "stage": "inference", "code": None}
        try:
            _infer(rknn, job, answer)
        except Exception as e:  # the toolkit raises bare exceptions: report them as data
            answer["error"] = _said(e)
        _write(job["result"], answer)
        channel.write("done\n")
        channel.flush()
    rknn.release()


def _said(e: Exception) -> str:
    lines = str(e).strip().splitlines() or [""]
    said, kind = lines[-1].strip(), type(e).__name__
    return said if said.startswith(kind) else f"{kind}: {said}"


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as f:
        request = json.load(f)
    result: dict[str, Any] = {"ok": False, "stage": "import", "code": None}
    channel = sys.stdout
    if request["command"] == "serve":  # the toolkit's chatter to the log, stdout for answers
        channel = os.fdopen(os.dup(1), "w")
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
    try:
        result["version"] = _version()
        if request["command"] == "serve":
            _serve(request, result, channel)
        else:
            _compile(request, result)
    except Exception as e:  # the toolkit raises bare exceptions: report them as data
        result["error"] = _said(e)
        result["traceback"] = traceback.format_exc()
    _write(request["result"], result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
