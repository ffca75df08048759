"""The held-out clock times configurations in groups whose sessions fit the memory budget,
every group with FP32, so that each ratio is of runs interleaved with FP32's."""

from __future__ import annotations

from mpsearch._results import timing_groups


def test_groups_fit_the_budget_and_each_leads_with_the_reference() -> None:
    costs = {"fp32": 30, "a": 20, "b": 20, "c": 40, "d": 10, "e": 200}
    groups = timing_groups(costs, "fp32", budget=100)
    assert groups == [["fp32", "a", "b"], ["fp32", "c", "d"], ["fp32", "e"]]
    assert all(g[0] == "fp32" and "fp32" not in g[1:] for g in groups)
    assert all(sum(costs[k] for k in g) <= 100 for g in groups[:-1])  # "e" alone is over
    assert sorted(k for g in groups for k in g[1:]) == ["a", "b", "c", "d", "e"]


def test_a_budget_for_everything_is_one_group_and_fp32_alone_is_timed() -> None:
    costs = {"fp32": 30, "a": 20, "b": 20}
    assert timing_groups(costs, "fp32", budget=10**9) == [["fp32", "a", "b"]]
    assert timing_groups({"fp32": 30}, "fp32", budget=1) == [["fp32"]]
