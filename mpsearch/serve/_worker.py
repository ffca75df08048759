"""One ``mpsearch serve`` job, run in its own process (started by
:func:`mpsearch.serve._jobs.worker_command`).

Consumes a run directory prepared by :mod:`mpsearch.serve._jobs` (``job.json`` with the kind,
``spec.yaml`` with everything else); produces the same run directory the CLI writes, through
the same composer: an analysis is :func:`mpsearch.pipeline.analyze_run`, a search
:func:`mpsearch.pipeline.search_run`, and both end with :func:`mpsearch.write_report`.
``export RUN_DIR POINT OUT`` writes one front point with :func:`mpsearch.pipeline.export_point`.

Progress goes to ``RUN_DIR/progress.jsonl`` as data (:class:`mpsearch.progress.JsonlProgress`),
logs to stderr (the job log); a user-facing error is written as one line to
``RUN_DIR/error.txt`` and the exit status follows the CLI: 0 ok, 1 nothing feasible, 2 bad
input, 3 internal error, 130 cancelled (SIGTERM).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from mpsearch.errors import MpsearchError
from mpsearch.progress import JsonlProgress
from mpsearch.rundir import RunDir
from mpsearch.serve._quiet import interrupt_later, quiet_cancel
from mpsearch.spec import load_spec

__all__ = ["main", "run_job"]

logger = logging.getLogger("mpsearch.serve.worker")


def _analyze(run: RunDir, resume: bool) -> int:
    from mpsearch.pipeline import analyze_run

    analyze_run(load_spec(run.spec_yaml), run, progress=JsonlProgress(run.progress_jsonl))
    return 0


def _search(run: RunDir, resume: bool) -> int:
    from mpsearch.pipeline import search_run

    result = search_run(load_spec(run.spec_yaml), run, resume=resume,
                        progress=JsonlProgress(run.progress_jsonl))
    return 0 if result.front.points else 1


_KINDS = {"analysis": _analyze, "search": _search}


def run_job(run_dir: Path) -> int:
    """Run the job of ``run_dir`` and write its report; the exit status (see module doc)."""
    run = RunDir(run_dir)
    job = json.loads(run.job_json.read_text(encoding="utf-8"))
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
