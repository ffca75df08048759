"""Log records of a cancelled job without tracebacks.

A cancel reaches a worker as SIGTERM, which the worker turns into ``KeyboardInterrupt`` so that
the running trial ends cleanly; libraries that log the failed trial with ``exc_info`` (Optuna)
would print a traceback of the interrupt into ``job.log``. :func:`quiet_cancel` installs a log
record factory that drops such tracebacks and names the cancel instead, whatever logger and
handler the record goes through. :func:`interrupt_later` keeps the interrupt out of a storage
write (an interrupt inside the journal's file lock leaves the lock half released, and the
cancel ends as an internal error): the signal is sent again a moment later instead.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["interrupt_later", "quiet_cancel"]

_RETRY_S = 0.05
_CRITICAL = (f"optuna{os.sep}storages", f"mpsearch{os.sep}rundir.py")


def interrupt_later(frame: FrameType | None) -> bool:
    """True, and SIGTERM is sent to this process again in a moment, when ``frame`` (where the
    signal arrived) is inside a storage write; False when an interrupt may be raised now."""
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in _CRITICAL):
            timer = threading.Timer(_RETRY_S, os.kill, (os.getpid(), signal.SIGTERM))
            timer.daemon = True
            timer.start()
            return True
        frame = frame.f_back
    return False


def quiet_cancel() -> None:
    """Make every later log record that carries a ``KeyboardInterrupt`` a one-line message."""
    factory = logging.getLogRecordFactory()

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        exc = record.exc_info
        if exc and exc[0] is not None and issubclass(exc[0], KeyboardInterrupt):
            record.msg = record.getMessage().replace("KeyboardInterrupt()", "the cancel")
            record.args, record.exc_info, record.exc_text = None, None, None
        return record

    logging.setLogRecordFactory(make)
