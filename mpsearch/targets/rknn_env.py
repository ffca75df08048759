"""``python -m mpsearch.targets.rknn_env``: create the pinned RKNN-Toolkit2 environment.

See :mod:`mpsearch.targets._rknn_env` for where it goes and what it pins.
"""

from __future__ import annotations

import sys

from mpsearch.targets._rknn_env import main

if __name__ == "__main__":
    sys.exit(main())
