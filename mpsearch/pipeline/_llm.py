"""The language-model path: a spec, a search into a run directory, an export of one point.

Consumes an LLM spec (YAML, :func:`load_llm_spec`): a decoder ONNX model, a text corpus, the
window length and counts per split, the search's formats and trials. Produces, through
:func:`llm_search_run`, a run directory holding ``front.json`` (``"kind": "llm"``: FP32, the
hand-made baselines and the searched front, each scored on held-out windows the search never
saw, with 95 % intervals, and each point's per-weight formats); :func:`llm_export` writes one
point as an ONNX model with ``MatMulNBits`` weights, re-scores it on the held-out windows and
compares its greedy continuations with FP32's.

The stages are those of ``benchmarks/bench_llm.py``: Hessians on the calibration windows, the
sensitivity of each weight alone, the baselines scored as fixed points, the search, held-out
scoring. Quantization is deterministic given the calibration windows, so the export quantizes
the chosen point again rather than storing weights in the run directory.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from mpsearch._yaml import Section, load_yaml
from mpsearch.errors import SpecError
from mpsearch.llm import (
    LanguageModel,
    LMScore,
    Scorer,
    TextWindows,
    baselines,
    default_menu,
    input_hessians,
    load_documents,
    load_language_model,
    load_tokenizer,
    make_windows,
    measure_sensitivity,
    search_bits,
    searchable,
    to_assignment,
)
from mpsearch.llm._choices import Choice, WeightBank
from mpsearch.llm._export import export_weight_only
from mpsearch.llm._formats import parse_format
from mpsearch.llm._generate import LLMLatency, agreement, greedy, llm_latency
from mpsearch.llm._metrics import Estimate
from mpsearch.rundir import read_llm_front
from mpsearch.runtime import create_session

__all__ = ["LLMSpec", "llm_export", "llm_search_run", "load_llm_spec", "read_llm_front"]

logger = logging.getLogger(__name__)

#: The weight formats a spec may offer (smallest first), and the default offer.
MENU = ("w2b64a", "w4b128s", "w4b64s")
#: The format that reproduces a Q4_1-born model's weights; offered as the top level.
EXACT = "w4b32f"
#: Prompts of the export's greedy check (the continuations are compared with FP32's).
PROMPTS = ("The capital of France is", "Water boils at a temperature of",
           "The largest planet in the Solar System is", "In 1969, the first person to walk on",
           "The chemical symbol for gold is", "Photosynthesis is the process by which")


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMSpec:
    """A language-model search: paths resolved against the spec file's folder."""

    path: Path | None
    model: Path
    source: Path
    text_field: str = "text"
    window: int = 128
    windows: tuple[int, int, int] = (8, 8, 16)  # calibration, search, held-out
    data_seed: int = 0
    menu: tuple[str, ...] = MENU
    exact: str | None = EXACT
    trials: int = 16
    max_bpw: float | None = None
    seed: int = 0
    generate: int = 16  # tokens of each greedy continuation at export
    baselines: tuple[str, ...] | None = None  # the hand-made mixes to score (None: all)


def load_llm_spec(path: str | os.PathLike[str]) -> LLMSpec:
    """Read an LLM spec; SpecError (exit 2) naming the file, line and fix for a bad one."""
    path = Path(path)
    root = Section.root(load_yaml(path, SpecError), str(path), SpecError)
    root.check_keys(("search", "seed"), required=("task", "model", "data"))
    root.get_str("task", choices=("language-model",))
    data = root.section("data")
    data.check_keys(("text_field", "window", "windows", "seed"), required=("source",))
    counts = data.section("windows", {})
    counts.check_keys(("calibration", "search", "held_out"))
    search = root.section("search", {})
    search.check_keys(("formats", "exact", "trials", "max_bpw", "baselines"))
    menu = search.get_str_list("formats", MENU, non_empty=True)
    exact = search.get_str("exact", EXACT)
    for name in (*menu, exact):
        parse_format(name)  # SpecError naming the format and how to write one
    base = path.parent
    return LLMSpec(
        path=path, model=base / root.get_str("model"), source=base / data.get_str("source"),
        text_field=data.get_str("text_field", "text"),
        window=data.get_int("window", 128, minimum=8),
        windows=(counts.get_int("calibration", 8, minimum=1),
                 counts.get_int("search", 8, minimum=1),
                 counts.get_int("held_out", 16, minimum=1)),
        data_seed=data.get_int("seed", 0, minimum=0), menu=tuple(menu), exact=exact,
        trials=search.get_int("trials", 16, minimum=1),
        max_bpw=search.get_float("max_bpw", None, minimum=1.0),
        baselines=search.get_str_list("baselines", None),
        seed=root.get_int("seed", 0, minimum=0))


def _windows(spec: LLMSpec, model: LanguageModel) -> TextWindows:
    if model.tokenizer is None:
        raise SpecError(f"{model.path}: no tokenizer.json beside the model; put the model's "
                        "tokenizer.json in the same folder")
    return make_windows(load_documents(spec.source, text_field=spec.text_field),
                        load_tokenizer(model.tokenizer), length=spec.window,
                        seed=spec.data_seed, max_windows=spec.windows, context=model.context)


def _baselines(spec: LLMSpec, bank: WeightBank) -> dict[str, Mapping[str, Choice]]:
    """The hand-made mixes the spec names (all by default), by name."""
    every = baselines(bank.keys)
    wanted = spec.baselines if spec.baselines is not None else tuple(every)
    unknown = [name for name in wanted if name not in every]
    if unknown:
        raise SpecError(f"{spec.path or 'spec'}: search.baselines names {unknown}, which are "
                        f"not baselines; use some of {sorted(every)}")
    return {name: every[name] for name in wanted}


def _score(s: LMScore) -> dict[str, Any]:
    def row(e: Estimate) -> list[float]:
        return [e.mean, e.low, e.high]
    return {"perplexity": row(s.perplexity), "kl": row(s.kl), "top1": row(s.agreement)}


def _spec_record(spec: LLMSpec) -> dict[str, Any]:
    """``spec`` as JSON, its paths absolute: what the export needs to redo the stages."""
    record = {name: getattr(spec, name) for name in LLMSpec.__slots__}
    for name in ("path", "model", "source"):
        record[name] = None if record[name] is None else str(Path(record[name]).resolve())
    return record


def _spec_from(record: Mapping[str, Any]) -> LLMSpec:
    values = dict(record)
    for name in ("model", "source"):
        values[name] = Path(values[name])
    values["path"] = None if values.get("path") is None else Path(values["path"])
    for name in ("windows", "menu", "baselines"):
        if values.get(name) is not None:
            values[name] = tuple(values[name])
    return LLMSpec(**values)


def _latency(timed: LLMLatency) -> dict[str, Any]:
    return {"prefill_tokens_per_s": timed.prefill_tokens_per_s,
            "prefill_ms": [1e3 * timed.prefill_s, *(1e3 * v for v in timed.prefill_spread)],
            "decode_ms_per_token": timed.decode_ms_per_token,
            "decode_ms": [1e3 * timed.decode_s, *(1e3 * v for v in timed.decode_spread)]}


def _formats(assignment: Mapping[str, Choice]) -> dict[str, str]:
    return {key: choice.label for key, choice in assignment.items()}


@dataclass(slots=True)
class _Stage:
    """The model, windows, scorer and weight bank every stage shares."""

    model: LanguageModel
    windows: TextWindows
    scorer: Scorer
    bank: WeightBank

    @classmethod
    def open(cls, spec: LLMSpec) -> _Stage:
        model = load_language_model(spec.model)
        windows = _windows(spec, model)
        hessians = input_hessians(model, windows.calibration,
                                  [w.name for w in searchable(model)])
        scorer = Scorer(model, batch=4)
        return cls(model, windows, scorer, WeightBank(model, scorer.fp32, hessians))


def llm_search_run(spec: LLMSpec, run_dir: str | os.PathLike[str],
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Search ``spec`` into ``run_dir`` (created; it must not hold a run) and return the
    front it wrote as ``front.json``."""
    out = Path(run_dir)
    if (out / "front.json").exists():
        raise SpecError(f"{out}: a language-model search already ran here; choose another "
                        "--out directory")
    say = progress or (lambda _: None)
    stage = _Stage.open(spec)
    bank, scorer, windows = stage.bank, stage.scorer, stage.windows
    say(f"windows: {windows.to_dict()}")
    mixes = _baselines(spec, bank)  # a misspelt name fails before the work
    menu = default_menu(bank, spec.menu, exact=spec.exact)
    sensitivity = measure_sensitivity(scorer, bank, menu, windows.search[:1])
    say(f"sensitivity: {sensitivity.passes} passes")
    rows: list[dict[str, Any]] = []
    fixed: list[tuple[str, float, float]] = []
    for name, assignment in mixes.items():
        bank.group_gptq(assignment)
        feeds = bank.feeds(assignment)
        search_kl = scorer.score(feeds, windows.search).kl.mean
        rows.append({"name": name, "bpw": bank.bits_per_weight(assignment),
                     "bytes": bank.total_bytes(assignment), "search_kl": search_kl,
                     **_score(scorer.score(feeds, windows.heldout))})
        fixed.append((name, search_kl, float(bank.total_bytes(assignment))))
        bank.forget(assignment)
        say(f"baseline {name}: {rows[-1]['bpw']:.3f} bpw")
    result = search_bits(scorer, bank, menu, sensitivity, windows.search, trials=spec.trials,
                         seed=spec.seed, fixed=fixed, max_bpw=spec.max_bpw)
    points: list[dict[str, Any]] = []
    for point in sorted((p for p in result.front if p.choices), key=lambda p: p.size):
        assignment = to_assignment(menu, point.choices)
        points.append({"index": len(points), "source": point.source,
                       "bpw": bank.bits_per_weight(assignment),
                       "bytes": bank.total_bytes(assignment), "search_kl": point.objective,
                       **_score(scorer.score(bank.feeds(assignment), windows.heldout)),
                       "formats": _formats(assignment)})
        say(f"point {points[-1]['index']}: {points[-1]['bpw']:.3f} bpw")
    front = {"kind": "llm", "model": str(spec.model), "spec": _spec_record(spec),
             "windows": windows.to_dict(),
             "evaluations": result.evaluations, "params": bank.params(),
             "fp32": {"bpw": 32.0, "bytes": bank.total_bytes({}),
                      **_score(scorer.score(None, windows.heldout))},
             "baselines": rows, "points": points,
             "sensitivity": [{"weight": key, "kl": kl} for key, kl in sensitivity.table(menu)]}
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "front.json.tmp"
    tmp.write_text(json.dumps(front, indent=1))
    os.replace(tmp, out / "front.json")
    if spec.path is not None:
        (out / "spec.yaml").write_text(spec.path.read_text(encoding="utf-8"))
    return front


def llm_export(run_dir: str | os.PathLike[str], point: int, out: str | os.PathLike[str],
               *, prompts: Sequence[str] = PROMPTS) -> dict[str, Any]:
    """Write point ``point`` of ``run_dir`` as an ONNX model with MatMulNBits weights at
    ``out``, re-score it on the held-out windows, compare its greedy continuations of
    ``prompts`` with FP32's and time both models' prefill of a held-out window and one decode
    step after it; returns what it measured (also in ``out``'s ``.json`` beside)."""
    front = read_llm_front(run_dir)
    chosen = next((p for p in front["points"] if p["index"] == point), None)
    if chosen is None:
        raise SpecError(f"point {point} is not on this run's front, which has points 0 to "
                        f"{len(front['points']) - 1}; give one of those")
    spec = _spec_from(front["spec"])
    stage = _Stage.open(spec)
    assignment = {key: Choice(fmt=label.split(":")[0], method=label.split(":")[1])
                  for key, label in chosen["formats"].items()}
    stage.bank.group_gptq(assignment)
    weights = {stage.bank.weights[key].name: q for key in assignment
               if (q := stage.bank.quantize(key, assignment[key], keep=True)) is not None}
    exported = export_weight_only(onnx.load(str(spec.model)), weights)
    target = Path(out)
    onnx.save(exported, str(target))
    session = create_session(str(target), threads=2, label=str(target))
    model = stage.model
    scores = _score(stage.scorer.score_session(session, stage.windows.heldout))
    fp32 = create_session(str(spec.model), threads=2)
    tokenizer = load_tokenizer(model.tokenizer) if model.tokenizer else None
    ids = [tokenizer.encode(text).ids for text in prompts] if tokenizer else []
    reference = [greedy(fp32, model, p, spec.generate) for p in ids]
    mine = [greedy(session, model, p, spec.generate) for p in ids]
    agreed = agreement(reference, mine)
    prompt = [int(t) for t in stage.windows.heldout[0]]
    ours, theirs = llm_latency([session, fp32], model, prompt, span=2.0)
    record = {"point": point, "file": str(target), "bytes": target.stat().st_size,
              "bpw": chosen["bpw"], "held_out": scores, "front_held_out": {
                  k: chosen[k] for k in ("perplexity", "kl", "top1")},
              "greedy": {"prompts": agreed.prompts, "tokens": agreed.tokens,
                         "agreed": agreed.agreed, "identical": agreed.identical,
                         "share": agreed.share},
              "latency": {"prompt": len(prompt), "exported": _latency(ours),
                          "fp32": _latency(theirs)}}
    target.with_suffix(".json").write_text(json.dumps(record, indent=1))
    return record
