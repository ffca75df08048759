"""Where the tests' inputs live: the repository, the committed fixture zoo and the hostile files
(the test modules sit one folder deeper, in ``unit/`` and ``integration/``)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
HOSTILE = ROOT / "tests" / "hostile"
