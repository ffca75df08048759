"""The benchmark scripts, each run from the repository root as ``python -m benchmarks.<name>``
and writing its own ``benchmarks/results/<name>.md`` (:mod:`benchmarks._results`)."""
