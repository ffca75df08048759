"""The RKNN-Toolkit2 environment: a pinned virtual environment of its own (``rknn_env``'s body).

RKNN-Toolkit2 2.5.0 pins numpy <= 1.26.4, onnx <= 1.18 and protobuf <= 4.25.4 and imports
torch, so it cannot share mpsearch's environment; mpsearch drives it through a subprocess
(:mod:`mpsearch.targets._rknn`). ``python -m mpsearch.targets.rknn_env`` creates it at
``$MPSEARCH_RKNN_VENV`` (default ``~/.cache/mpsearch/rknn-venv``) with a Python 3.11
interpreter (``$MPSEARCH_RKNN_PYTHON``, default ``python3.11``: the toolkit ships wheels for
CPython 3.6-3.12), installs the pins below, checks that the toolkit imports, and only then
moves the finished environment into place. A finished environment with the same pins is kept
(``--force`` rebuilds it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["INSTALL_COMMAND", "PINS", "TOOLKIT", "install", "main", "ready", "venv_dir",
           "venv_python"]

VENV_ENV = "MPSEARCH_RKNN_VENV"
PYTHON_ENV = "MPSEARCH_RKNN_PYTHON"
INSTALL_COMMAND = "python -m mpsearch.targets.rknn_env"
TOOLKIT = "rknn-toolkit2==2.5.0"
# The toolkit's own requirements, each pinned to a version checked with it here. torch: the
# toolkit asks for torch <= 2.4.0, whose Linux wheels on the index pull several GB of CUDA
# libraries; it only imports torch for PyTorch models, and 2.13.0 (a CPU build on this
# machine kind's disk) imports, builds and simulates ONNX models with it, so the toolkit is
# installed with --no-deps beside these pins. setuptools 80 still provides pkg_resources, which
# the toolkit imports. OpenCV: the headless build of the version the toolkit accepts.
PINS = (
    "numpy==1.26.4",
    "onnx==1.18.0",
    "protobuf==4.25.4",
    "onnxruntime==1.19.2",
    "torch==2.13.0",
    "scipy==1.13.1",
    "psutil==6.1.0",
    "ruamel.yaml==0.18.6",
    "tqdm==4.67.1",
    "opencv-python-headless==4.10.0.84",
    "fast-histogram==0.14",
    "setuptools==80.9.0",
)
_MARKER = "mpsearch-rknn.json"


def venv_dir() -> Path:
    """Where the RKNN environment lives: ``$MPSEARCH_RKNN_VENV`` or the user cache."""
    override = os.environ.get(VENV_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "mpsearch" / "rknn-venv"


def venv_python(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def marker() -> dict[str, object]:
    """What a finished environment records: the toolkit and the pins it was built with."""
    return {"toolkit": TOOLKIT, "pins": list(PINS)}


def ready(venv: Path | None = None) -> bool:
    """True when ``venv`` was finished by :func:`install` with today's pins."""
    path = (venv or venv_dir()) / _MARKER
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")) == marker()
                    and venv_python(venv).exists())
    except (OSError, ValueError):
        return False


def _run(*command: str | Path) -> None:
    subprocess.run([str(c) for c in command], check=True)


def install(venv: Path | None = None, python: str | None = None) -> Path:
    """Create the pinned environment at ``venv`` (built beside it, then renamed into place)."""
    target = venv or venv_dir()
    interpreter = python or os.environ.get(PYTHON_ENV) or "python3.11"
    if shutil.which(interpreter) is None and not Path(interpreter).exists():
        raise FileNotFoundError(f"{interpreter}: not found; RKNN-Toolkit2 2.5.0 needs CPython "
                                f"3.6-3.12: set {PYTHON_ENV} to such an interpreter")
    building = target.with_name(target.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    _run(interpreter, "-m", "venv", building)
    py = venv_python(building)
    _run(py, "-m", "pip", "install", "-q", *PINS)
    _run(py, "-m", "pip", "install", "-q", "--no-deps", TOOLKIT)
    _run(py, "-c", "from rknn.api import RKNN")
    (building / _MARKER).write_text(json.dumps(marker()), encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    building.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpsearch.targets.rknn_env",
                                     description="Create the pinned RKNN-Toolkit2 environment.")
    parser.add_argument("--venv", type=Path, default=None, help=f"default: ${VENV_ENV} or "
                        "~/.cache/mpsearch/rknn-venv")
    parser.add_argument("--python", default=None, help=f"default: ${PYTHON_ENV} or python3.11")
    parser.add_argument("--force", action="store_true",
                        help="rebuild even when a finished environment with these pins exists")
    args = parser.parse_args(argv)
    if not args.force and ready(args.venv):
        print(f"RKNN-Toolkit2 environment already there: {args.venv or venv_dir()} "
              "(--force rebuilds it)")
        return 0
    try:
        path = install(args.venv, args.python)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"rknn_env: {e}", file=sys.stderr)
        return 3
    print(f"RKNN-Toolkit2 environment ready: {path}")
    return 0
