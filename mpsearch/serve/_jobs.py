"""Background jobs of ``mpsearch serve``: a small queue of worker processes, one per job.

Consumes jobs whose run directory already holds ``spec.yaml`` (see :mod:`mpsearch.serve._spec`);
produces their run directories (``WORKDIR/runs/{id}/``) through the worker
(:func:`worker_command`: ``python -I`` with this installed package's folder first on
``sys.path``, so no ``mpsearch/`` of the current directory can stand in for it), which calls
the same Python API as the CLI, so ``mpsearch report`` and ``mpsearch search --resume`` work
on them. At most ``max_running`` workers run at once (the rest
queue, first in first out); a supervisor thread polls them. ``job.json`` in the run directory is
the job's state, rewritten atomically at each change, so the job list survives a browser reload
and a server restart (a job that was running when the server stopped becomes "interrupted" and
can be resumed). A search whose every shown point the target's verification rejected ends
"unverified" (the CLI's exit 4), its front kept and the reasons in its note. Cancel sends
SIGTERM (then SIGKILL); resume reruns the job on the same run directory, which continues a
search's study and reuses the calibration and analysis caches.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mpsearch.errors import EXIT_NO_VERIFIED_POINT, MpsearchError
from mpsearch.rundir import RunDir, read_json
from mpsearch.serve._frontview import unverified
from mpsearch.serve._spec import JobConfig
from mpsearch.serve._store import Upload, UploadError, new_id, valid_id
from mpsearch.serve._worker import worker_command

__all__ = ["ACTIVE", "FINISHED", "Job", "JobQueue", "job_title", "worker_command"]

logger = logging.getLogger(__name__)

ACTIVE = ("queued", "running")
#: The states of a search that wrote its front: "unverified" when the target rejected every
#: shown point.
FINISHED = ("done", "unverified")
_KILL_AFTER_S = 10.0
_EXPORT_TIMEOUT_S = 900.0


def job_title(number: int, config: JobConfig, model: Upload, profile: str) -> str:
    """A job's name, told apart from the others: number, kind, model, profile, trials."""
    trials = f", {config.trials} trials" if config.kind == "search" else ""
    uploaded = model.created[11:16]
    return (f"#{number} {config.kind} of {model.name} (uploaded {uploaded} UTC) on "
            f"{profile}{trials}")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One job's state (``job.json``)."""

    id: str
    kind: str
    title: str
    model: str
    model_name: str = ""
    profile: str = ""
    state: str = "queued"
    created: str = ""
    started: str | None = None
    finished: str | None = None
    trials: int | None = None
    higher_is_better: bool = True
    resume: bool = False
    exit_code: int | None = None
    error: str | None = None
    note: str | None = None
    commands: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class JobQueue:
    """Runs jobs in worker processes; every method is thread-safe."""

    def __init__(self, workdir: Path, *, max_running: int = 1, poll_s: float = 0.25) -> None:
        self.runs = workdir / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        self.max_running = max(1, max_running)
        self.poll_s = poll_s
        self._lock = threading.RLock()
        self._jobs: dict[str, Job] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._cancel_at: dict[str, float] = {}
        self._exports: dict[tuple[str, int], threading.Lock] = {}
        self._numbers: dict[str, int] = {}
        self._count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Load the jobs of the work directory and start the supervisor thread."""
        with self._lock:
            for run in map(RunDir, sorted(self.runs.iterdir())):
                if not run.job_json.is_file():
                    continue
                try:
                    doc = run.read_job()
                    known = {k: v for k, v in doc.items() if k in Job.__dataclass_fields__}
                    job = Job(**{**known, "commands": tuple(doc.get("commands", ()))})
                except (OSError, ValueError, TypeError) as e:
                    logger.warning("skipping %s: %s", run.job_json, e)
                    continue
                if job.state == "running":  # its worker died with the previous server
                    job = replace(job, state="interrupted", finished=_now(),
                                  note="the server stopped while it ran; resume it")
                    self._save(job)
                self._jobs[job.id] = job
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="mpsearch-jobs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the supervisor; running workers are terminated and marked interrupted."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for job_id, proc in list(self._procs.items()):
                _signal(proc, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=_KILL_AFTER_S)
                if proc.poll() is None:
                    _signal(proc, signal.SIGKILL)
                    proc.wait()
                self._set(job_id, state="interrupted", finished=_now(),
                          note="the server stopped while it ran; resume it")
            self._procs.clear()

    # -- queries -------------------------------------------------------------------------
    def run_dir(self, job_id: str) -> Path:
        return self.runs / job_id

    def get(self, job_id: str) -> Job:
        with self._lock:
            job = self._jobs.get(job_id) if valid_id(job_id) else None
        if job is None:
            raise UploadError(f"no job '{job_id[:40]}' in this work directory", status=404)
        return job

    def list(self) -> tuple[Job, ...]:
        with self._lock:
            return tuple(sorted(self._jobs.values(), key=lambda j: j.created, reverse=True))

    def position(self, job_id: str) -> int | None:
        """1-based place of a queued job in the queue."""
        with self._lock:
            queued = [j for j in sorted(self._jobs.values(), key=lambda j: j.created)
                      if j.state == "queued"]
        ids = [j.id for j in queued]
        return ids.index(job_id) + 1 if job_id in ids else None

    # -- commands ------------------------------------------------------------------------
    def new_run_dir(self) -> tuple[str, Path]:
        """A fresh job id (unique: ``mkdir`` fails on a clash) and its run directory; the
        job's number (:meth:`number`) is taken under the lock, so concurrent submissions
        never share one."""
        job_id = new_id()
        path = self.runs / job_id
        path.mkdir(parents=True)
        with self._lock:
            self._count = max(self._count, len(self._jobs)) + 1
            self._numbers[job_id] = self._count
        return job_id, path

    def number(self, job_id: str) -> int:
        """The 1-based number of a job made by :meth:`new_run_dir` (shown in its title)."""
        with self._lock:
            return self._numbers.get(job_id, len(self._jobs) + 1)

    def submit(self, job: Job) -> Job:
        job = replace(job, state="queued", created=job.created or _now())
        with self._lock:
            self._jobs[job.id] = job
            self._numbers.pop(job.id, None)
            self._save(job)
        return job

    def cancel(self, job_id: str) -> Job:
        with self._lock:
            job = self.get(job_id)
            if job.state == "queued":
                return self._set(job_id, state="cancelled", finished=_now())
            if job.state == "running" and job_id not in self._cancel_at:
                self._cancel_at[job_id] = time.monotonic()
                _signal(self._procs[job_id], signal.SIGTERM)
            return self.get(job_id)

    def resume(self, job_id: str) -> Job:
        with self._lock:
            job = self.get(job_id)
            if job.state in ACTIVE:
                return job
            return self._set(job_id, state="queued", resume=True, exit_code=None, error=None,
                             note=None, started=None, finished=None, created=_now())

    def finish(self, job_id: str, trials_done: int) -> Job:
        """Rerun a stopped search with its budget cut to the ``trials_done`` trials it
        finished: no new trial runs, the study's front is re-measured on the held-out split and
        written to ``front.json``, so its points can be exported (the spec says so too)."""
        from mpsearch.spec import load_spec

        with self._lock:
            job = self.get(job_id)
            if job.kind != "search" or job.state in ACTIVE or job.state in FINISHED:
                raise UploadError("only a stopped search can be finished with the trials it "
                                  "ran", status=409)
            if trials_done < 1:
                raise UploadError("this search finished no trial yet; resume it instead",
                                  status=409)
            run = RunDir(self.run_dir(job_id))
            try:
                spec = load_spec(run.spec_yaml)
            except MpsearchError as e:
                raise UploadError(f"this job's spec.yaml cannot be read: {e}") from e
            run.write_spec(spec.with_overrides(trials=trials_done))
            self._set(job_id, trials=trials_done,
                      title=f"{job.title} (finished at {trials_done} trials)")
            return self.resume(job_id)

    def export(self, job_id: str, point: int) -> Path:
        """The front point ``point`` of a finished search as a QDQ model (built once by a
        worker process, then cached in ``RUN_DIR/exports/``)."""
        job = self.get(job_id)
        run_dir = self.run_dir(job_id)
        if job.kind != "search" or job.state not in FINISHED:
            raise UploadError("only a finished search has a Pareto front to export", status=409)
        try:
            count = len(RunDir(run_dir).read_front().points)
        except MpsearchError as e:
            raise UploadError("this search's front cannot be read; run the search again",
                              status=409) from e
        if not 0 <= point < count:
            raise UploadError(
                f"point {point} is not on this search's front, which has "
                + (f"points 0 to {count - 1}; pick one from the table" if count
                   else "no points (no configuration met the constraints)"), status=404)
        out = run_dir / "exports" / f"point-{point}.onnx"
        with self._lock:
            lock = self._exports.setdefault((job_id, point), threading.Lock())
        with lock:
            if out.is_file():
                return out
            out.parent.mkdir(exist_ok=True)
            tmp = out.with_name(f".{out.name}.tmp.onnx")
            try:
                done = subprocess.run(
                    worker_command("export", str(run_dir), str(point), str(tmp)),
                    capture_output=True, timeout=_EXPORT_TIMEOUT_S,
                    env=_env(), check=False)
            except subprocess.TimeoutExpired as e:
                raise UploadError(f"export of point {point} took over {_EXPORT_TIMEOUT_S:.0f} "
                                  "s; try `mpsearch export` from the command line") from e
            if done.returncode != 0 or not tmp.is_file():
                tmp.unlink(missing_ok=True)
                raise UploadError(_last_error(done.stderr.decode(errors="replace"))
                                  or f"export of point {point} failed")
            os.replace(tmp, out)
        return out

    # -- supervisor ----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._tick()
            except Exception:  # keep supervising whatever one job did
                logger.exception("job supervisor")

    def _tick(self) -> None:
        with self._lock:
            for job_id, proc in list(self._procs.items()):
                code = proc.poll()
                if code is None:
                    asked = self._cancel_at.get(job_id)
                    if asked is not None and time.monotonic() - asked > _KILL_AFTER_S:
                        _signal(proc, signal.SIGKILL)
                    continue
                del self._procs[job_id]
                self._finish(job_id, code, cancelled=self._cancel_at.pop(job_id, None) is not None)
            queued = sorted((j for j in self._jobs.values() if j.state == "queued"),
                            key=lambda j: j.created)
            for job in queued[:max(0, self.max_running - len(self._procs))]:
                self._launch(job)

    def _launch(self, job: Job) -> None:
        run_dir = self.run_dir(job.id)
        self._set(job.id, state="running", started=_now())
        with (run_dir / "job.log").open("ab") as log:
            proc = subprocess.Popen(
                worker_command(str(run_dir)),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=_env(),
                start_new_session=True)
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, proc.pid, 10)  # the web server stays responsive
        self._procs[job.id] = proc
        logger.info("job %s (%s) started, pid %d", job.id, job.kind, proc.pid)

    def _finish(self, job_id: str, code: int, *, cancelled: bool) -> None:
        run_dir = self.run_dir(job_id)
        error = None
        if cancelled or code in (130, -signal.SIGTERM, -signal.SIGKILL):
            state, note = "cancelled", "cancelled; resume continues it"
        elif code == 0:
            state, note = "done", None
        elif code == 1:
            state, note = "done", "no configuration met the constraints"
        elif code == EXIT_NO_VERIFIED_POINT:
            front = read_json(RunDir(run_dir).front_json)
            state, note = "unverified", (unverified(front) if isinstance(front, dict) else None
                                         ) or ("no verified point: the target's verification "
                                               "rejected every shown point")
        else:
            state, note = "failed", None
            error = _read_error(run_dir) or f"the job stopped with status {code}"
        self._set(job_id, state=state, exit_code=code, finished=_now(), error=error, note=note)
        logger.info("job %s %s (status %d)", job_id, state, code)

    def _set(self, job_id: str, **changes: Any) -> Job:
        with self._lock:
            job = replace(self._jobs[job_id], **changes)
            self._jobs[job_id] = job
            self._save(job)
            return job

    def _save(self, job: Job) -> None:
        RunDir(self.run_dir(job.id)).write_job(job.to_dict())


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def _read_error(run_dir: Path) -> str | None:
    try:
        return (run_dir / "error.txt").read_text(encoding="utf-8").strip() or None
    except OSError:
        return _last_error((run_dir / "job.log").read_text(encoding="utf-8", errors="replace")
                           if (run_dir / "job.log").is_file() else "")


def _last_error(text: str) -> str | None:
    lines = [line for line in text.splitlines() if line.startswith("mpsearch: error: ")]
    return lines[-1].removeprefix("mpsearch: error: ") if lines else None
