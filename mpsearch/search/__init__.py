"""The precision search: groups, seeds, scores and racing (pure), the Optuna study, its
callbacks and its storage (the only optuna importers)."""

from __future__ import annotations

from mpsearch.search._race import race_stages
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
from mpsearch.search._settings import SearchSettings
from mpsearch.search._storage import (
    SAMPLERS,
    check_inputs,
    check_resume,
    check_storage,
    make_sampler,
    open_study,
    study_progress,
)
from mpsearch.search._study import SearchResult, TrialRecord, run_search

__all__ = [
    "Group",
    "MEASURE_ABOVE",
    "SAMPLERS",
    "SearchResult",
    "SearchSettings",
    "Seed",
    "TrialRecord",
    "check_inputs",
    "check_resume",
    "check_storage",
    "compress",
    "group_costs",
    "group_nodes",
    "knapsack",
    "make_sampler",
    "neighbor",
    "open_study",
    "race_stages",
    "run_search",
    "seed_assignments",
    "study_progress",
]
