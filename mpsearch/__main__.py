"""``python -m mpsearch``: the command-line interface."""

from mpsearch.cli import main

raise SystemExit(main())
