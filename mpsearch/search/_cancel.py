"""A cancelled search: its own stop reason, and no failed-trial warning for the cancel.

A cancel (Ctrl-C, or the web server's SIGTERM, which its worker turns into KeyboardInterrupt)
interrupts the running trial; Optuna marks that trial failed and logs two "Trial N failed"
warnings, as if the configuration had crashed. :func:`watch_cancel` drops those two records
(known by the objective having seen the interrupt, whatever a log record factory did to
their text or traceback; the trial is retried on resume),
and records in the study how many trials had finished, so that a search later finished with
exactly those trials (the web page's "Finish with these trials") says "cancelled after N
trials" rather than "trial budget used". A search that runs new trials clears the mark.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import optuna

from mpsearch.errors import interrupted
from mpsearch.search._callbacks import finished

__all__ = ["CANCELLED_AFTER", "cancelled_reason", "clear_cancel", "watch_cancel"]

#: Study attribute: the finished trials when the search was cancelled (None once resumed).
CANCELLED_AFTER = "cancelled_after"

#: The logger of Optuna's "Trial N failed" warnings.
_OPTUNA_TRIALS = "optuna.study._optimize"


class _Watch(logging.Filter):
    """Drops Optuna's failed-trial warnings once the running trial was cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.cancelled and record.levelno == logging.WARNING
                    and str(record.msg).startswith("Trial "))


@contextmanager
def watch_cancel(study: optuna.Study, objective: Callable[[optuna.Trial], Any]
                 ) -> Iterator[Callable[[optuna.Trial], Any]]:
    """``objective`` wrapped so that a cancel inside it is known; on a cancel the study
    records the trials finished (:data:`CANCELLED_AFTER`) and Optuna's failed-trial warnings
    for the cancel are dropped."""
    watch = _Watch()
    log = logging.getLogger(_OPTUNA_TRIALS)

    def watched(trial: optuna.Trial) -> Any:
        try:
            return objective(trial)
        except BaseException as e:
            if interrupted(e):
                watch.cancelled = True
            raise

    log.addFilter(watch)
    try:
        yield watched
    except BaseException as e:
        if interrupted(e):
            study.set_user_attr(CANCELLED_AFTER, finished(study))
        raise
    finally:
        log.removeFilter(watch)


def clear_cancel(study: optuna.Study) -> None:
    """Forget an earlier cancel: the search runs trials again."""
    if study.user_attrs.get(CANCELLED_AFTER) is not None:
        study.set_user_attr(CANCELLED_AFTER, None)


def cancelled_reason(study: optuna.Study) -> str | None:
    """"cancelled after N trials" when the study was cancelled and ran nothing since."""
    after = study.user_attrs.get(CANCELLED_AFTER)
    if after is None or finished(study) != after:
        return None
    return f"cancelled after {after} trials"
