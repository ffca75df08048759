"""One ``mpsearch serve`` job, run in its own process (started by
:func:`mpsearch.serve._jobs.worker_command`).

Consumes a run directory prepared by :mod:`mpsearch.serve._jobs` (``job.json`` with the kind,
``spec.yaml`` with everything else); produces the same run directory the CLI writes, through
the same composer: an analysis is :func:`mpsearch.pipeline.analyze_run`, a search
:func:`mpsearch.pipeline.search_run`, and both end with :func:`mpsearch.write_report`.
``export RUN_DIR POINT OUT`` writes one front point with :func:`mpsearch.pipeline.export_point`.
``data REQUEST_JSON`` decodes one data upload (``.npz``, ``.npy`` or a zip of images) under an
address-space limit (``RLIMIT_AS``), checks it against the model and saves it as ``.npz``;
``model REQUEST_JSON`` loads and summarizes one model upload the same way. A hostile upload
can only exhaust this process, never the server: see :func:`decode_upload`.

Progress goes to ``RUN_DIR/progress.jsonl`` as data (:class:`mpsearch.progress.JsonlProgress`),
logs to stderr (the job log); a user-facing error is written as one line to
``RUN_DIR/error.txt`` and the exit status follows the CLI: 0 ok, 1 nothing feasible, 2 bad
input, 3 internal error, 4 no verified point (the target rejected every shown point), 130
cancelled (SIGTERM).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from mpsearch.errors import EXIT_NO_VERIFIED_POINT, MpsearchError, SpecError
from mpsearch.progress import JsonlProgress
from mpsearch.rundir import RunDir
from mpsearch.serve._frontview import unverified
from mpsearch.serve._quiet import interrupt_later, quiet_cancel
from mpsearch.spec import SearchSpec, load_spec

__all__ = ["decode_upload", "main", "run_job", "served_spec", "summarize_upload",
           "worker_command"]

logger = logging.getLogger("mpsearch.serve.worker")


def served_spec(path: Path) -> SearchSpec:
    """The job's spec, refused if it names Python code: a ``module:function`` metric or data
    reader is code, which a served job never imports (the CLI runs it, as it runs any script
    its user chose)."""
    spec = load_spec(path)
    if spec.metric is not None and ":" in spec.metric:
        raise SpecError(f"{path}: metric '{spec.metric[:60]}' is Python code "
                        "(module:function); the server runs built-in metrics only")
    if not Path(spec.data.source).exists():
        raise SpecError(f"{path}: data '{spec.data.source[:60]}' is not an uploaded file (a "
                        "module:function reader is Python code); the server reads uploads only")
    return spec


def _analyze(run: RunDir, resume: bool) -> int:
    from mpsearch.pipeline import analyze_run

    analyze_run(served_spec(run.spec_yaml), run, progress=JsonlProgress(run.progress_jsonl))
    return 0


def _search(run: RunDir, resume: bool) -> int:
    from mpsearch.pipeline import search_run

    result = search_run(served_spec(run.spec_yaml), run, resume=resume,
                        progress=JsonlProgress(run.progress_jsonl))
    if unverified(result.front.to_dict()) is not None:
        return EXIT_NO_VERIFIED_POINT
    return 0 if result.front.points else 1


_KINDS = {"analysis": _analyze, "search": _search}
_BOOT = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
         "from mpsearch.serve._worker import main; sys.exit(main())")


def worker_command(*args: str) -> list[str]:
    """The command line of a worker process with ``args``: isolated mode (``-I``: neither the
    current directory, nor ``PYTHON*`` variables, nor the user's site-packages reach
    ``sys.path``), then the folder holding this very ``mpsearch`` package put first."""
    root = str(Path(__file__).resolve().parents[2])
    return [sys.executable, "-I", "-u", "-c", _BOOT, root, *args]


def _limit_memory(limit: int) -> None:
    """Cap this process's address space: past it an allocation fails (MemoryError) instead
    of growing the machine's memory use."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def decode_upload(request: dict[str, Any]) -> dict[str, Any]:
    """Decode the upload ``request["raw"]`` (kind ``zip``, ``npy`` or ``npz``) within
    ``request["memory"]`` bytes of address space, check it against ``request["model"]`` and
    save it as the ``.npz`` ``request["target"]``; returns the samples and whether it has
    labels. Every problem is a :class:`MpsearchError` naming the stored file."""
    _limit_memory(int(request["memory"]))
    import numpy as np

    from mpsearch import ImageOptions, check_signature, load_data, load_model
    from mpsearch.errors import DataError

    raw, target, kind = Path(request["raw"]), Path(request["target"]), request["kind"]
    images = ImageOptions.from_dict(request.get("images") or {}) if kind == "zip" else None
    dataset = load_data(raw, images=images)
    graph = load_model(request["model"])
    names = [i.name for i in graph.inputs]
    if kind == "npy":
        if len(names) != 1:
            raise DataError(f"{raw}: a .npy file holds one array and the model has "
                            f"{len(names)} inputs ({', '.join(names)[:80]}); upload an .npz "
                            "with one array per input")
        dataset = dataset.for_inputs(names)
    check_signature(dataset, graph)
    if len(dataset) < 2:
        raise DataError(f"{raw}: {len(dataset)} sample(s); need at least 2 to calibrate and "
                        "validate")
    if raw != target:
        arrays: dict[str, Any] = dict(dataset.inputs)
        if dataset.labels is not None:
            arrays["labels"] = dataset.labels
        partial = target.with_name(f".{target.name}.part")
        with partial.open("wb") as f:
            np.savez(f, **arrays)
        os.replace(partial, target)
    return {"samples": len(dataset), "labels": dataset.labels is not None}


#: Nodes of an uploaded model, at most: summarising one of 600k nodes takes minutes and more
#: memory than an upload may use, so it is refused after counting, before it is summarised.
MAX_UPLOAD_NODES = 200_000


def summarize_upload(request: dict[str, Any]) -> dict[str, Any]:
    """Load the model upload ``request["path"]`` within ``request["memory"]`` bytes of
    address space, write its summary (:func:`mpsearch.summarize`) to ``request["summary"]``
    and return the few figures an upload record shows: the summary of a model of many nodes
    is large, and is never parsed by the server to store an upload."""
    _limit_memory(int(request["memory"]))
    import onnx

    from mpsearch import load_model, summarize
    from mpsearch.errors import ModelError
    from mpsearch.rundir import write_json

    try:
        nodes = len(onnx.load(request["path"], load_external_data=False).graph.node)
    except Exception:  # not a model: load_model says why, in its own words
        nodes = 0
    if nodes > MAX_UPLOAD_NODES:
        raise ModelError(f"{request['path']}: the model has {nodes} nodes, more than the "
                         f"{MAX_UPLOAD_NODES} an upload may use; summarise and search it with "
                         "the CLI (mpsearch summary, mpsearch search)")

    summary: dict[str, Any] = summarize(load_model(request["path"])).to_dict()
    write_json(request["summary"], summary)
    return {"params": summary["params"], "flops": summary["flops"],
            "nodes": len(summary["nodes"]), "graph": summary["model"],
            "weight_bytes": summary["weight_bytes"]}


_UPLOADS = {"data": decode_upload, "model": summarize_upload}


def _upload(mode: str, request_json: str) -> int:
    request = json.loads(request_json)
    try:
        print(json.dumps(_UPLOADS[mode](request)))
    except MemoryError:
        print(f"mpsearch: error: {request.get('raw', request.get('path'))}: decoding it needs "
              f"more than the "
              f"{int(request['memory']) / 2**30:.1f} GiB an upload may use; upload less data "
              "or smaller images", file=sys.stderr)
        return 2
    except MpsearchError as e:
        print(f"mpsearch: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


def run_job(run_dir: Path) -> int:
    """Run the job of ``run_dir`` and write its report; the exit status (see module doc)."""
    run = RunDir(run_dir)
    job = run.read_job()
    run.error_txt.unlink(missing_ok=True)
    logger.info("%s: loading the model and data, calibrating", job["kind"])
    status = _KINDS[job["kind"]](run, bool(job.get("resume")))
    logger.info("%s done; writing the report", job["kind"])
    from mpsearch import write_report

    write_report(run_dir)
    return status


def _export(run_dir: Path, point: int, out: Path) -> int:
    from mpsearch.pipeline import export_point

    result = export_point(run_dir, point, out)
    print(json.dumps({"path": str(result.path), "size": result.size,
                      "metric": result.evaluation.value}))
    return 0


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if interrupt_later(frame):  # inside a journal write: the signal comes again shortly
        return
    raise KeyboardInterrupt  # Optuna marks the running trial failed; the journal stays clean


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["data"], ["model"]):
        return _upload(args[0], args[1])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    quiet_cancel()  # a cancel is not a crash: no traceback of it in job.log
    signal.signal(signal.SIGTERM, _on_sigterm)
    run_dir = Path(args[-1] if args[:1] != ["export"] else args[1])
    try:
        if args[:1] == ["export"]:
            return _export(run_dir, int(args[2]), Path(args[3]))
        return run_job(run_dir)
    except KeyboardInterrupt:
        print("mpsearch: cancelled", file=sys.stderr)
        return 130
    except MpsearchError as e:
        _error(run_dir, args, str(e))
        return 2
    except Exception as e:  # a bug: the traceback goes to the log, a message to the user
        logger.exception("job failed")
        _error(run_dir, args, f"internal error ({type(e).__name__}: {e}); see the job log")
        return 3


def _error(run_dir: Path, args: Sequence[str], message: str) -> None:
    line = " ".join(message.split()) or "failed"
    print(f"mpsearch: error: {line}", file=sys.stderr)
    if args[:1] != ["export"]:
        RunDir(run_dir).error_txt.write_text(line + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
