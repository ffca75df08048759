"""Support shared by mpsearch's tests and benchmarks, as ``optuna.testing`` is for optuna's:
the real-model corpus and its check, ONNX Runtime's own quantizer as the baseline, and a small
transformer with outlier channels.

Not part of the public API, and nothing in the engine imports it. The corpus needs the
packages of the ``corpus`` extra (installed with ``--no-deps``), the checks need ``pytest``.
"""
