"""Progress reports rendered as tqdm bars on stderr: one bar per stage, closed when the next
stage starts (a stage's total may grow while it runs) or by :meth:`BarProgress.close`."""

from __future__ import annotations

import logging
import shutil
import sys
import weakref
from typing import Any

from mpsearch.progress import Progress

__all__ = ["BarProgress", "close_bars"]

_OPEN: weakref.WeakSet[BarProgress] = weakref.WeakSet()


def close_bars() -> None:
    """Close every open bar (before an error line, so it does not land on a bar's line), also
    one a Ctrl-C cut off while tqdm was drawing it (tqdm keeps every live bar; one interrupted
    before its first draw finished would not erase itself)."""
    for progress in list(_OPEN):
        progress.close()
    tqdm = sys.modules.get("tqdm")  # imported by the first bar drawn (start-up cost)
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        try:
            if not hasattr(bar, "last_print_t") and getattr(bar, "sp", None) is not None:
                width = shutil.get_terminal_size().columns - 1
                bar.fp.write("\r" + " " * width + "\r")
            bar.close()
        except Exception:  # a bar interrupted half-built: nothing more to erase
            logging.getLogger(__name__).debug("could not close a progress bar", exc_info=True)


class BarProgress:
    """A :data:`mpsearch.progress.Reporter` drawing one tqdm bar for the current stage."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._stage: str | None = None
        self._bar: Any = None

    def __call__(self, progress: Progress) -> None:
        if not self.enabled:
            return
        if progress.stage != self._stage:
            self.close()
            self._stage = progress.stage
            from tqdm import tqdm

            self._bar = tqdm(total=progress.total, desc=progress.stage, unit=progress.unit,
                             leave=False)
            _OPEN.add(self)
        bar = self._bar
        if progress.total is not None and bar.total != progress.total:
            bar.total = progress.total
        bar.update(progress.done - bar.n)
        if progress.info:
            bar.set_postfix({k: f"{v:.4f}" if isinstance(v, float) else v
                             for k, v in progress.info.items()}, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._stage = None, None
