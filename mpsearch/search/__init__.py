"""The precision search: groups and seeds, the Optuna study (the only optuna importer)."""

from __future__ import annotations

from mpsearch.search._seeds import (
    MEASURE_ABOVE,
    Group,
    Seed,
    compress,
    group_costs,
    group_nodes,
    knapsack,
    neighbor,
    seed_assignments,
)
from mpsearch.search._study import (
    SAMPLERS,
    SearchResult,
    TrialRecord,
    make_sampler,
    open_study,
    run_search,
    study_progress,
)

__all__ = [
    "Group",
    "MEASURE_ABOVE",
    "SAMPLERS",
    "SearchResult",
    "Seed",
    "TrialRecord",
    "compress",
    "group_costs",
    "group_nodes",
    "knapsack",
    "make_sampler",
    "neighbor",
    "open_study",
    "run_search",
    "seed_assignments",
    "study_progress",
]
