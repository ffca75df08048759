"""The study and where it lives: samplers, storages (a journal file by default, any RDB URL for
several workers), resume safety, and the live progress of a journal.

A study records the inputs it was made from (:func:`check_inputs` refuses to mix results from
other ones); a run directory's own journal is repaired when a kill left a torn last record or a
trial RUNNING (failed and queued again). The other modules that import optuna are
:mod:`._study` and :mod:`._callbacks`.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage, RDBStorage, RetryFailedTrialCallback
from optuna.storages._rdb.models import BaseModel
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.storages.journal._storage import JournalOperation
from sqlalchemy import create_engine, inspect
from sqlalchemy.exc import IntegrityError, ProgrammingError

from mpsearch._io import JSON_MEMORY, parse_json
from mpsearch._wording import formats_text
from mpsearch.errors import SearchError
from mpsearch.search._settings import SearchSettings

__all__ = ["SAMPLERS", "check_inputs", "check_resume", "check_storage", "make_sampler",
           "open_study", "settle_dead_trials", "study_progress"]

logger = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)
_SCHEMA_ATTEMPTS = 5  # first use of an empty database by several workers at once
_RETRIES = 2  # times a dead worker's trial is queued again


def _tpe(seed: int, trials: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                      n_startup_trials=min(10, max(trials // 5, 1)))


def _nsga2(seed: int, trials: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(20, trials // 20))


def _random(seed: int, trials: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


#: Sampler name -> factory(seed, trials). ``auto``: TPE up to 300 trials, NSGA-II beyond.
SAMPLERS: Mapping[str, Callable[[int, int], optuna.samplers.BaseSampler]] = {
    "tpe": _tpe, "nsga2": _nsga2, "random": _random,
}


def make_sampler(name: str, seed: int, trials: int) -> optuna.samplers.BaseSampler:
    if name == "auto":
        name = "tpe" if trials <= 300 else "nsga2"
    if name not in SAMPLERS:
        raise SearchError(f"unknown sampler '{name}'; use one of auto, {', '.join(SAMPLERS)}")
    return SAMPLERS[name](seed, trials)


#: How every Optuna journal record starts (compact JSON of a dict built with ``op_code`` first).
_RECORD_START = b'{"op_code":'
_MAX_RECORD = 16 << 20  # bytes of one journal line, at most
_JOURNAL_LIMIT = 256 << 20  # bytes of a journal (Optuna parses every record into memory)
_JOURNAL_MEMORY = 2 * JSON_MEMORY  # the records as Python objects, estimated as parse_json does
_NOT_JOURNAL = ("not an Optuna journal (its first line is not a journal record), so the "
                "search will not append to it; give a new file or a database URL as storage")


def _check_journal(path: Path, own: bool = False) -> None:
    """SearchError unless the existing file ``path`` is an Optuna journal: a regular file,
    empty, or its first line a whole journal record and every later complete line one too, the
    last one possibly torn (the start of a record, dropped on open); its records parsed within
    mpsearch's JSON budget. ``own``: the run directory's journal, which must not be a link.
    Checked before Optuna opens it for appending, so a spec naming any other file (``storage:
    ~/notes.txt``, or one holding just ``{``) never has journal records appended to it."""
    fix = "remove that line to use the journal (the records around it stay) or start a new one"
    if own and path.is_symlink():
        raise SearchError(f"{path}: is a symbolic link, which mpsearch does not follow inside "
                          "a run directory; replace it with the journal file itself")
    if not path.is_file():
        raise SearchError(f"{path}: the storage is not a regular file; give a journal file "
                          "path or a database URL")
    try:
        size = path.stat().st_size
        if size > _JOURNAL_LIMIT:
            raise SearchError(f"{path}: a {size / 2**20:.0f} MiB journal is larger than "
                              f"mpsearch loads (limit {_JOURNAL_LIMIT >> 20} MiB); start a new "
                              "journal or use a database URL as storage")
        cost = 0
        with path.open("rb") as f:
            for number, line in enumerate(iter(lambda: f.readline(_MAX_RECORD + 1), b""), 1):
                if len(line) > _MAX_RECORD:
                    raise SearchError(f"{path}:{number}: a line over {_MAX_RECORD >> 20} MiB "
                                      f"is not an Optuna journal record; {fix}")
                torn = not line.endswith(b"\n")  # a record cut short by a kill, or not one
                if number == 1 and (torn or not _is_record(line, path)):
                    raise SearchError(f"{path}: {_NOT_JOURNAL}")
                if torn and (line.startswith(_RECORD_START) or _RECORD_START.startswith(line)):
                    break
                if torn or not _is_record(line, path):
                    raise SearchError(f"{path}:{number}: not an Optuna journal record (a torn "
                                      f"or foreign line); {fix}")
                cost += 3 * len(line) + 100 * sum(line.count(c) for c in b",:[{")
                if cost > _JOURNAL_MEMORY:
                    raise SearchError(f"{path}: its records would take over "
                                      f"{_JOURNAL_MEMORY >> 20} MiB to load (at line {number});"
                                      " start a new journal or use a database URL as storage")
    except OSError as e:
        raise SearchError(f"{path}: cannot read the journal ({e.strerror}); check the path "
                          "and its permissions") from e


def _is_record(line: bytes, path: Path) -> bool:
    if not line.startswith(_RECORD_START):
        return False
    try:
        record = parse_json(line, str(path), SearchError, memory=_MAX_RECORD * 8, finite=False)
    except SearchError:
        return False
    return (isinstance(record, dict) and type(record.get("op_code")) is int
            and isinstance(record.get("worker_id"), str))


def _journal_path(url: str, run_dir: Path) -> Path:
    """The journal file a spec's ``storage:`` path names: inside the run directory, a new
    file, or an existing Optuna journal (checked); anything else is refused."""
    path = Path(url).expanduser()
    if path.exists() or path.is_symlink():
        _check_journal(path)
    elif not path.parent.is_dir():
        raise SearchError(f"storage {url}: the folder {path.parent} does not exist; create it "
                          "or give a path inside the run directory")
    return path


def _journal(path: Path, own: bool = False) -> optuna.storages.BaseStorage:
    """A journal file (checked by :func:`_check_journal`), its torn last line (a write cut by
    a kill or a full disk) dropped first, so the next record does not land glued to it."""
    if path.exists() or path.is_symlink():
        _check_journal(path, own)
    if path.is_file() and path.stat().st_size:
        with path.open("rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.seek(0)
                data = f.read()
                keep = data.rfind(b"\n") + 1
                logger.warning("%s: dropping a torn last record (%d bytes)", path,
                               len(data) - keep)
                f.truncate(keep)
    return JournalStorage(_SettledJournal(str(path)))


#: Journal records a running trial writes as it goes, made durable by the record ending it.
_UNSETTLED = frozenset({JournalOperation.SET_TRIAL_PARAM, JournalOperation.SET_TRIAL_USER_ATTR,
                        JournalOperation.SET_TRIAL_SYSTEM_ATTR,
                        JournalOperation.SET_TRIAL_INTERMEDIATE_VALUE})


class _SettledJournal(JournalFileBackend):
    """Optuna's journal file, synced to disk by the records that settle something (a trial's
    end, a study's creation) instead of by every record: a trial writes one record per
    parameter, and their syncs were a tenth of a small model's trial time. The records in
    between are written to the operating system, which a killed process cannot lose, and reach
    the disk with the next synced record (fsync writes the whole file); a machine crash can
    lose only a running trial's parameters, and a resumed search runs that trial again."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._writer_lock = JournalFileSymlinkLock(path)  # Optuna's default lock, held here too
        super().__init__(path, lock_obj=self._writer_lock)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        if any(log.get("op_code") not in _UNSETTLED for log in logs):
            super().append_logs(logs)
            return
        text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs)
        self._writer_lock.acquire()
        try:
            with open(self._path, "ab") as f:
                f.write(text.encode("utf-8"))
        finally:
            self._writer_lock.release()


#: Optuna's own tables (alembic's table records its schema version).
_OPTUNA_TABLES = frozenset(BaseModel.metadata.tables) | {"alembic_version"}
_OPTUNA_CORE = frozenset({"studies", "trials", "version_info"})


def _check_database(url: str) -> None:
    """SearchError unless the database at ``url`` is empty or holds Optuna's schema (its core
    tables; or only Optuna's tables, as while another worker creates them), so a URL naming
    another program's database never gets Optuna's tables added to it."""
    engine = create_engine(url)
    try:
        names = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    if not names or _OPTUNA_CORE <= names or names <= _OPTUNA_TABLES:
        return
    shown = engine.url.render_as_string(hide_password=True)
    others = ", ".join(sorted(names - _OPTUNA_TABLES)[:5])
    raise SearchError(f"{shown}: the database holds another program's tables ({others}) and "
                      "not Optuna's, so the search will not add its tables to it; give an empty "
                      "database or one an Optuna study already uses")


def _rdb(url: str, heartbeat: float) -> RDBStorage:
    """A database storage with heartbeats and the retry of a dead worker's trial."""
    interval, grace = max(1, round(heartbeat)), max(2, round(2 * heartbeat))
    with warnings.catch_warnings():  # Optuna marks heartbeats and their callbacks experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        stale = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
        if stale is not None:  # Optuna >= 4.9 (RetryFailedTrialCallback is deprecated there)
            return RDBStorage(url, heartbeat_interval=interval, grace_period=grace,
                              heartbeat_stale_trial_callback=stale(
                                  max_retry=_RETRIES, inherit_intermediate_values=True))
        return RDBStorage(url, heartbeat_interval=interval, grace_period=grace,
                          failed_trial_callback=RetryFailedTrialCallback(
                              max_retry=_RETRIES, inherit_intermediate_values=True))


def _storage(url: str | None, journal: Path, heartbeat: float = 60.0
             ) -> optuna.storages.BaseStorage:
    if url is None:
        journal.parent.mkdir(parents=True, exist_ok=True)
        return _journal(journal, own=True)
    if "://" not in url:  # a journal file path
        return _journal(_journal_path(url, journal.parent))
    if url.startswith(("postgresql://", "postgres://")):  # the driver mpsearch[postgres] installs
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    try:
        _check_database(url)
    except SearchError:
        raise
    except Exception as e:
        raise SearchError(f"cannot open Optuna storage '{url}' ({e}); check the URL and "
                          "that its driver is installed (pip install 'mpsearch[postgres]')"
                          ) from e
    race: Exception | None = None
    for attempt in range(_SCHEMA_ATTEMPTS):
        try:
            # Each worker beats every `heartbeat` seconds while it runs a trial (Optuna does
            # under optimize()); a trial silent for twice that (its worker killed) is failed by
            # the next worker to start a trial and queued again (up to twice) as it was.
            return _rdb(url, heartbeat)
        except (IntegrityError, ProgrammingError) as e:
            # Workers started together on an empty database all create Optuna's tables; the
            # losers fail (optuna#1092) and find the tables made on the next attempt.
            logger.debug("creating the Optuna schema raced another worker: %s", e)
            race = e
            time.sleep(0.2 * (attempt + 1))
        except Exception as e:
            raise SearchError(f"cannot open Optuna storage '{url}' ({e}); check the URL and "
                              "that its driver is installed (pip install 'mpsearch[postgres]')"
                              ) from e
    detail = str(race).splitlines()[0] if race else ""
    raise SearchError(f"cannot create Optuna's tables in '{url}' ({detail}); check the user may "
                      "create tables there, or create the study once first (optuna create-study)")


def open_study(
    settings: SearchSettings, journal: Path, *, directions: Sequence[str], resume: bool,
    inputs: Mapping[str, str] | None = None,
) -> optuna.Study:
    """Create the study, or load it for ``--resume`` / a shared storage.

    ``inputs`` (what the results depend on: model, data, profile and spec fingerprints) is
    stored with a new study; an existing study made from other inputs is refused, naming what
    changed, so a resumed or shared search never mixes results.
    """
    check_resume(settings, journal, inputs, resume)
    sampler = make_sampler(settings.sampler, settings.seed, settings.trials)
    study = optuna.create_study(study_name=settings.study or "mpsearch",
                                storage=_storage(settings.storage, journal, settings.heartbeat_s),
                                sampler=sampler,
                                directions=[optuna.study.StudyDirection[d.upper()]
                                            for d in directions], load_if_exists=True)
    if inputs is not None and "inputs" not in study.user_attrs:
        study.set_user_attr("inputs", dict(inputs))
    if settings.storage is None:
        _retry_interrupted(study)
    return study


def check_storage(settings: SearchSettings, journal: Path) -> None:
    """SearchError unless the spec's journal storage (the run directory's ``journal``, or the
    file ``storage:`` names) is a new file or an Optuna journal: cheap, so the composer checks
    it before calibration rather than after. Database URLs are checked when opened."""
    if settings.storage is None:
        if journal.exists() or journal.is_symlink():
            _check_journal(journal, own=True)
    elif "://" not in settings.storage:
        _journal_path(settings.storage, journal.parent)


def _existing(settings: SearchSettings, journal: Path) -> optuna.Study | None:
    """The spec's study when it exists already (in the run directory or a shared storage)."""
    if settings.storage is None and not journal.is_file():
        return None
    if settings.storage is not None and "://" not in settings.storage and not (
            Path(settings.storage).expanduser().exists()):
        _journal_path(settings.storage, journal.parent)  # its folder exists; made later
        return None
    try:
        return optuna.load_study(study_name=settings.study or "mpsearch",
                                 storage=_storage(settings.storage, journal, settings.heartbeat_s))
    except KeyError:  # no such study (yet: another worker may be creating it)
        return None


def check_resume(settings: SearchSettings, journal: Path, inputs: Mapping[str, str] | None,
                 resume: bool) -> None:
    """A run directory that holds a study needs ``resume``, and a study (resumed or shared)
    must have been made from the same ``inputs`` (when given). The composer calls it before
    it writes anything; :func:`open_study` again, for callers of the search alone."""
    run_dir = journal.parent
    study = _existing(settings, journal)
    if study is None:
        return
    if not resume and settings.storage is None:
        raise SearchError(f"{run_dir}: a search already ran here; pass --resume to continue it "
                          "or choose another --out directory")
    stored = study.user_attrs.get("inputs")
    if inputs is not None and isinstance(stored, dict):
        check_inputs(stored, inputs, f"{run_dir}: its search")


def check_inputs(stored: Mapping[str, str], inputs: Mapping[str, str], where: str) -> None:
    """SearchError naming what changed when ``inputs`` differ from the ``stored`` ones."""
    changed = sorted(k for k in {*stored, *inputs} if stored.get(k) != inputs.get(k))
    if changed:
        raise SearchError(f"{where} was made from other inputs (changed: {', '.join(changed)});"
                          " resume with the same model, data, profile and spec, or search into"
                          " a new --out directory")


def _retry_interrupted(study: optuna.Study) -> None:
    """A run directory's own journal has one worker: a trial still RUNNING when it opens was
    cut off by a kill. It is failed, and its configuration queued again."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(dict(trial.params), user_attrs={
            "source": f"retry of interrupted trial {trial.number}"})
        logger.info("trial %d was interrupted; queued again", trial.number)


def settle_dead_trials(study: optuna.Study) -> int:
    """After this worker's last trial, on a database with heartbeats: wait (at most twice the
    heartbeat and one more beat) until the trials other workers left RUNNING have finished or
    gone stale; stale ones (their worker died) are failed and queued again. Returns how many
    such retries wait to run, so the last worker standing runs them and no trial stays
    RUNNING forever."""
    storage = study._storage
    interval = storage.get_heartbeat_interval() if isinstance(storage, RDBStorage) else None
    if interval is None:
        return 0
    deadline = time.monotonic() + float(getattr(storage, "grace_period", 2 * interval)) + interval
    running = (optuna.trial.TrialState.RUNNING,)
    while True:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        if not study.get_trials(deepcopy=False, states=running) or time.monotonic() > deadline:
            break
        time.sleep(interval)
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    return sum("failed_trial" in t.system_attrs for t in waiting)


def study_progress(
    journal: Path, study: str = "mpsearch"
) -> tuple[list[tuple[float, float, str]], int]:
    """(metric, size, formats) of every complete trial and the number of finished (complete or
    pruned) trials of a run's journal; ([], 0) while the study does not exist yet. ``formats``
    counts the trial's node formats in words ("a16w16 2, int16 19"; "" when not recorded)."""
    if not journal.is_file():
        return [], 0
    try:
        loaded = optuna.load_study(
            study_name=study, storage=JournalStorage(JournalFileBackend(str(journal))))
    except (KeyError, ValueError):
        return [], 0
    points, finished = [], 0
    for trial in loaded.get_trials(deepcopy=False):
        if trial.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED):
            finished += 1
        if trial.state == optuna.trial.TrialState.COMPLETE and trial.values:
            metric = trial.user_attrs.get("metric", trial.values[0])  # without the tie-break
            points.append((float(metric), float(trial.values[1]),
                           _formats_text(trial.user_attrs.get("assignment"))))
    return points, finished


def _formats_text(assignment: object) -> str:
    """A trial's recorded assignment (node -> format) as counts: "a16w16 2, int16 19"."""
    if not isinstance(assignment, dict):
        return ""
    counts: dict[str, int] = {}
    for fmt in assignment.values():
        counts[str(fmt)] = counts.get(str(fmt), 0) + 1
    return formats_text(counts)
