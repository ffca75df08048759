"""RKNN-Toolkit2 worker: run by the RKNN environment's own Python, never imported by mpsearch.

``python _rknn_worker.py REQUEST.json`` reads one request (JSON), drives RKNN-Toolkit2 and
writes the result JSON named in it; arrays travel as NPZ files, never pickle. The toolkit's
verbose log goes to this process's stdout, which the caller keeps and parses.

* ``compile``: load the ONNX model with static input shapes, build for ``target_platform``
  (``do_quantization`` false: a QDQ model carries its own scales, float layers become FP16;
  with a ``dataset`` the toolkit quantizes a float model itself, as ``quantized_dtype`` says)
  and export the ``.rknn`` file.
* ``run``: the same load and build, then the simulator (``init_runtime()`` with no target),
  one inference per sample along axis 0 of the inputs NPZ; outputs concatenated to an NPZ.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

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


def _run(request: dict[str, Any], result: dict[str, Any]) -> None:
    rknn = _built(request, result)
    if rknn is None:
        return
    result["stage"] = "init_runtime"
    code = rknn.init_runtime()
    if code != 0:
        result["code"] = code
        return
    result["stage"] = "inference"
    with np.load(request["data"], allow_pickle=False) as data:
        arrays = [data[name] for name in request["inputs"]]
    batch = int(request["batch"])
    count = arrays[0].shape[0] // batch
    outputs: list[list[np.ndarray]] = []
    for i in range(count):
        feeds = [a[i * batch:(i + 1) * batch] for a in arrays]
        got = rknn.inference(inputs=feeds, data_format=["nchw"] * len(feeds))
        if got is None:
            result["code"] = -1
            result["sample"] = i
            return
        outputs.append([np.asarray(o) for o in got])
    tmp = request["outputs"] + ".tmp.npz"
    np.savez(tmp, **{f"output_{k}": np.concatenate([o[k] for o in outputs])
                     for k in range(len(outputs[0]))})  # type: ignore[arg-type]
    os.replace(tmp, request["outputs"])
    result["ok"] = True
    result["code"] = 0
    rknn.release()


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as f:
        request = json.load(f)
    result: dict[str, Any] = {"ok": False, "stage": "import", "code": None}
    try:
        result["version"] = _version()
        {"compile": _compile, "run": _run}[request["command"]](request, result)
    except Exception as e:  # the toolkit raises bare exceptions: report them as data
        lines = str(e).strip().splitlines() or [""]
        said = lines[-1].strip()
        kind = type(e).__name__
        result["error"] = said if said.startswith(kind) else f"{kind}: {said}"
        result["traceback"] = traceback.format_exc()
    _write(request["result"], result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
