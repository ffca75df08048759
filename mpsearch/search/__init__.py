"""The precision search: groups and seeds (pure), the Optuna study and its storage (the only
optuna importers)."""

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
from mpsearch.search._storage import (
    SAMPLERS,
    check_inputs,
    check_resume,
    make_sampler,
    open_study,
    study_progress,
)
from mpsearch.search._study import (
    SearchResult,
    TrialRecord,
    race_stages,
    run_search,
)

__all__ = [
    "Group",
    "MEASURE_ABOVE",
    "SAMPLERS",
    "SearchResult",
    "Seed",
    "TrialRecord",
    "check_inputs",
    "check_resume",
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
