"""The tests' name for :mod:`mpsearch.testing.peak` (the child process's own peak RSS)."""

from mpsearch.testing.peak import cli, read_peak

__all__ = ["cli", "read_peak"]
