"""Two real worker processes share one PostgreSQL study; one is killed (SIGKILL) in the middle
of a trial. The other finishes the study: the dead worker's trial is failed once its heartbeat
stops (after the spec's ``heartbeat`` x 2), queued again with the same parameters and run, and
no trial is left RUNNING.

Needs PostgreSQL on 127.0.0.1:5432 (``MPSEARCH_TEST_POSTGRES``; ``.ci/run`` starts one).
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import optuna
import pytest
from _paths import FIXTURES

pytestmark = pytest.mark.slow  # whole searches, servers, browsers, toolchains

MODEL = FIXTURES / "resnet.onnx"
DATA = FIXTURES / "digits_eval.npz"
TRIALS = 12

#: A metric slow enough that both workers are inside a trial at once (accuracy, 0.6 s a call).
SLOW_METRIC = '''
import time
import numpy as np

def accuracy(outputs, reference, labels):
    time.sleep(0.6)
    return float(np.mean(outputs.argmax(-1) == reference.argmax(-1)))

accuracy.proportion = True
'''



def _running(url: str, study: str) -> list[int]:
    """The RUNNING trials that started over 0.3 s ago: their heartbeat is recorded (Optuna
    records the first one as the trial starts; a trial killed before it has none, and
    Optuna's staleness check never sees it)."""
    try:
        loaded = optuna.load_study(study_name=study, storage=url)
    except KeyError:
        return []
    now = datetime.datetime.now()
    return [t.number for t in loaded.get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        if t.datetime_start is not None and (now - t.datetime_start).total_seconds() > 0.3]


def test_killed_postgres_worker_trial_is_failed_and_retried(
        tmp_path: Path, postgres_study: tuple[str, str]) -> None:
    url, study = postgres_study
    (tmp_path / "slow_metric.py").write_text(SLOW_METRIC)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"model: {MODEL}\nprofile: x86_ort_auto\n"
        f"data: {{source: {DATA}, calibration: 32, held_out: 0.5, seed: 0}}\n"
        "metric: slow_metric:accuracy\n"
        f"budget: {{trials: {TRIALS}, patience: 0}}\n"
        "analysis: false\nseeding: false\nexplore: 0\n"
        f"storage: {url}\nstudy: {study}\nheartbeat: 1\n"
        "evaluation: {sensitivity_samples: 16, chunks: 1}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    workers = [subprocess.Popen(
        [sys.executable, "-m", "mpsearch", "-q", "search", str(spec), "--out",
         str(tmp_path / f"w{i}"), "--no-report"], env=env, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
    try:
        deadline = time.time() + 300
        running: list[int] = []
        while time.time() < deadline and all(w.poll() is None for w in workers):
            running = _running(url, study)
            if len(running) == 2:  # one trial each: the worker killed now dies mid-trial
                break
            time.sleep(0.05)
        assert len(running) == 2, [(w.poll(), w.stderr.read().decode()[-2000:] if w.stderr
                                    and w.poll() is not None else "") for w in workers]
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait()
        _, err = workers[1].communicate(timeout=600)
        assert workers[1].returncode == 0, err.decode(errors="replace")[-3000:]
        assert err == b""  # the retry is silent: no warning from the surviving worker
        trials = optuna.load_study(study_name=study, storage=url).get_trials()
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    states = {t.number: t.state for t in trials}
    assert optuna.trial.TrialState.RUNNING not in states.values(), states
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 1 and failed[0].number in running, (running, states)
    dead = failed[0]
    retry_class = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback",
                          optuna.storages.RetryFailedTrialCallback)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retries = [t for t in trials if retry_class.retried_trial_number(t) == dead.number]
    assert len(retries) == 1, states
    retry = retries[0]
    assert retry.state == optuna.trial.TrialState.COMPLETE, states
    # The retry runs the parameters the dead trial had chosen (all of them, unless it was
    # killed before its objective asked for them).
    assert dead.params.items() <= retry.params.items()
    finished = [t for t in trials if t.state in (optuna.trial.TrialState.COMPLETE,
                                                 optuna.trial.TrialState.PRUNED)]
    # The retry runs within the budget, or after it when the survivor had finished the
    # budget before the dead trial went stale.
    assert len(finished) in (TRIALS, TRIALS + 1)
    assert len(trials) == len(finished) + 1  # every trial accounted for: finished or the dead
