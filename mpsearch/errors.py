"""Errors that speak to the user.

Every error mpsearch raises for bad input is an :class:`MpsearchError`. Its message is one line
that names the file (or object), the problem and the fix, so the CLI can print it as is and exit
with status 2.
"""

from __future__ import annotations

__all__ = [
    "EXIT_NO_VERIFIED_POINT",
    "CalibrationError",
    "DataError",
    "ModelError",
    "MpsearchError",
    "ProfileError",
    "QuantizationError",
    "SearchError",
    "SpecError",
    "TargetError",
    "interrupted",
]

#: ``mpsearch search``'s exit status when the target's verification rejected every shown point
#: (docs/exit-codes.md): the run directory is written, and nothing is recommended.
EXIT_NO_VERIFIED_POINT = 4


class MpsearchError(Exception):
    """Base class of every user-facing mpsearch error."""


class ModelError(MpsearchError):
    """The ONNX model cannot be read, normalized or run."""


class DataError(MpsearchError):
    """Calibration or validation data is missing, malformed or does not match the model."""


class ProfileError(MpsearchError):
    """A hardware profile is malformed or inconsistent."""


class SpecError(MpsearchError):
    """A search spec (YAML) is malformed or inconsistent."""


class CalibrationError(MpsearchError):
    """Calibration failed or a saved calibration table does not fit the model."""


class QuantizationError(MpsearchError):
    """An assignment cannot be turned into a quantized model (unknown node, forbidden format)."""


class SearchError(MpsearchError):
    """The search cannot run or resume (storage, study, budget)."""


class TargetError(MpsearchError):
    """A target toolchain is missing, refuses the model or fails to compile or run it."""


def interrupted(error: BaseException | None) -> bool:
    """Whether ``error`` is a KeyboardInterrupt or was caused by one: numba's compiled loops
    turn a Ctrl-C arriving inside them into ``SystemError: CPUDispatcher(...) returned a result
    with an exception set``, and one inside a storage write surfaces as the write's own error,
    each with the KeyboardInterrupt as its cause or context."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
