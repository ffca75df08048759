"""What a command writes at ``--out``: checked before any work, removed after a failure.

A command that cannot write its output says so at the start (exit 2), not after the whole run:
``--out`` naming a file where a directory is written (or the reverse), or a place that is
read-only. After a failure, what the command created at ``--out`` is removed, so nothing
half-written is left; a search run directory whose study journal has begun is kept when the
search was interrupted or failed on a bug, since ``--resume`` continues it.
"""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from mpsearch.errors import MpsearchError
from mpsearch.rundir import RunDir

__all__ = ["Output", "search_dir"]

#: Sub-command -> what its ``--out`` names.
_KINDS = {"quantize": "file", "export": "file", "report": "file", "search": "dir",
          "calibrate": "dir", "analyze": "dir"}


def search_dir(args: argparse.Namespace) -> Path:
    """The run directory of ``mpsearch search``: ``--out``, else ``runs/<spec name>``."""
    return Path(args.out) if args.out else Path("runs") / Path(args.spec).stem


@dataclass(slots=True)
class Output:
    """The ``--out`` of one command: ``kind`` file or dir; ``created`` the outermost path the
    command will create (None when ``path`` exists already)."""

    command: str
    path: Path
    kind: str
    created: Path | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> Output | None:
        """The output of the parsed command line, None for commands that write none."""
        kind = _KINDS.get(str(getattr(args, "command", "")))
        if kind is None:
            return None
        if args.command == "search":
            return cls(args.command, search_dir(args), kind)
        out = getattr(args, "out", None)
        return None if out is None else cls(args.command, Path(out), kind)

    def check(self) -> None:
        """MpsearchError when the output cannot be written where ``--out`` says."""
        path, flag = self.path, f"--out {self.path}"
        if path.exists() or path.is_symlink():
            if self.kind == "dir" and not path.is_dir():
                raise MpsearchError(f"{flag}: is a file, not a directory; give a directory "
                                    "for the results")
            if self.kind == "file" and path.is_dir():
                raise MpsearchError(f"{flag}: is a directory; name the file to write, e.g. "
                                    f"{path / 'model.onnx'}")
            folder = path if self.kind == "dir" else path.parent
        else:
            self.created, folder = _outermost_missing(path)
            if not folder.is_dir():
                raise MpsearchError(f"{flag}: {folder} is a file, not a directory; choose "
                                    "another --out")
        if not os.access(folder, os.W_OK | os.X_OK) or (
                self.kind == "file" and path.exists() and not os.access(path, os.W_OK)):
            raise MpsearchError(f"{flag}: cannot write in {folder} (read-only or no "
                                "permission); choose another --out")

    def clean(self, code: int) -> str:
        """Remove what the command created at ``--out`` after it failed with ``code``; the
        text to add to the error line (how to resume a kept run directory)."""
        created = self.created
        if created is None or not (created.exists() or created.is_symlink()):
            return ""
        if self.command == "search" and code in (3, 130) and _journal_begun(self.path):
            return f"; the run in {self.path} is kept: continue it with --resume"
        if created.is_dir() and not created.is_symlink():
            shutil.rmtree(created, ignore_errors=True)
        else:
            created.unlink(missing_ok=True)
        return ""


def _outermost_missing(path: Path) -> tuple[Path, Path]:
    """(the outermost missing component of ``path``, its existing parent)."""
    missing = path
    parent = path.parent
    while not (parent.exists() or parent.is_symlink()) and parent != parent.parent:
        missing, parent = parent, parent.parent
    return missing, parent


def _journal_begun(run_dir: Path) -> bool:
    journal = RunDir(run_dir).journal
    try:
        return journal.is_file() and journal.stat().st_size > 0
    except OSError:
        return False
