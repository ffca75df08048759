"""What the search needs to know of a run, as one small frozen value.

The composer (:mod:`mpsearch.pipeline`) makes it from the search spec; the search itself never
sees the spec or the run directory, so it can be driven from Python with only these fields.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SearchSettings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSettings:
    """The search's budget, objectives, constraints, sampler and storage.

    ``objectives``: what trials optimize (``metric``, ``size``, ``latency``); ``trials``,
    ``timeout_s`` and ``patience`` bound the study; ``min_metric``, ``max_metric_drop``,
    ``max_size_bytes`` and ``use_memory_budget`` are the user's constraints; ``chunks`` and
    ``search_score`` set how a trial is raced and scored; ``sensitivity_limit`` how many samples
    the one-group costs are measured on; ``seeding`` and ``explore`` how trials are proposed;
    ``storage``, ``study`` and ``heartbeat_s`` where the study lives (None: the run
    directory's journal)."""

    objectives: tuple[str, ...] = ("metric", "size")
    trials: int = 100
    timeout_s: float | None = None
    patience: int | None = 20
    sampler: str = "auto"
    seed: int = 0
    storage: str | None = None
    study: str | None = None
    heartbeat_s: float = 60.0
    formats: tuple[str, ...] | None = None
    min_metric: float | None = None
    max_metric_drop: float | None = None
    max_size_bytes: int | None = None
    use_memory_budget: bool = True
    sensitivity_limit: int | None = 32
    chunks: int = 4
    search_score: str = "auto"
    seeding: bool = True
    explore: float = 0.5
