"""``mpsearch llm search|front|export|report``: the language-model path, over the pipeline."""

from __future__ import annotations

import argparse
import logging
from typing import Any

__all__ = ["add_llm_parser"]


def add_llm_parser(subparsers: Any) -> None:
    """Register ``llm`` and its four commands."""
    llm = subparsers.add_parser(
        "llm", help="weight-only bits per projection for a decoder language model",
        description="Search per-projection weight-only formats (MatMulNBits blocks) of a "
                    "decoder ONNX language model against held-out text (docs/llm.md).")
    commands = llm.add_subparsers(dest="llm_command", required=True, metavar="COMMAND")
    search = commands.add_parser("search", help="run a language-model search from a spec")
    search.add_argument("spec", help="YAML spec with task: language-model")
    search.add_argument("--out", required=True, help="run directory to create")
    search.set_defaults(func=_search)
    front = commands.add_parser("front", help="print a language-model run's front")
    front.add_argument("run_dir", metavar="RUN_DIR")
    front.set_defaults(func=_front)
    export = commands.add_parser(
        "export", help="write a front point with MatMulNBits weights and check it")
    export.add_argument("run_dir", metavar="RUN_DIR")
    export.add_argument("--point", type=int, required=True, help="front point to export")
    export.add_argument("--out", required=True, help="ONNX file to write")
    export.set_defaults(func=_export)
    report = commands.add_parser("report", help="write a language-model run's HTML report")
    report.add_argument("run_dir", metavar="RUN_DIR")
    report.add_argument("--out", default=None, help="HTML file (default RUN_DIR/report.html)")
    report.set_defaults(func=_report)


def _print_front(front: dict[str, Any]) -> None:
    from mpsearch.rundir import estimate_text

    print(f"{'':<22} {'bits/w':>7} {'held-out perplexity':>22} {'KL to FP32':>24}")
    entries = [("FP32", front["fp32"])] + [(b["name"], b) for b in front["baselines"]] + [
        (f"point {p['index']}", p) for p in front["points"]]
    for name, e in entries:
        print(f"{name:<22} {e['bpw']:>7.3f} {estimate_text(e['perplexity'], 2):>22} "
              f"{estimate_text(e['kl'], 4):>24}")


def _search(args: argparse.Namespace) -> int:
    from mpsearch.pipeline import llm_search_run, load_llm_spec

    spec = load_llm_spec(args.spec)
    front = llm_search_run(spec, args.out, progress=logging.getLogger("mpsearch.llm").info)
    _print_front(front)
    print(f"run dir  {args.out}  ({front['evaluations']} evaluations)")
    return 0


def _front(args: argparse.Namespace) -> int:
    from mpsearch.pipeline import read_llm_front

    _print_front(read_llm_front(args.run_dir))
    return 0


def _export(args: argparse.Namespace) -> int:
    from mpsearch.pipeline import llm_export
    from mpsearch.rundir import estimate_text

    record = llm_export(args.run_dir, args.point, args.out)
    greedy = record["greedy"]
    print(f"wrote {record['file']} ({record['bytes']:,} B, {record['bpw']:.3f} bits per "
          f"weight); held-out perplexity {estimate_text(record['held_out']['perplexity'], 2)} "
          f"(front: {estimate_text(record['front_held_out']['perplexity'], 2)}); greedy "
          f"continuations agree with FP32 on {greedy['agreed']} of {greedy['tokens']} tokens "
          f"({greedy['share']:.0%}), {greedy['identical']} of {greedy['prompts']} identical")
    timed = record["latency"]
    mine, fp32 = timed["exported"], timed["fp32"]
    print(f"prefill of {timed['prompt']} tokens: {mine['prefill_tokens_per_s']:.0f} tokens/s "
          f"(FP32 {fp32['prefill_tokens_per_s']:.0f}); decode {mine['decode_ms_per_token']:.2f}"
          f" ms/token (FP32 {fp32['decode_ms_per_token']:.2f}), batch 1 on this CPU")
    return 0


def _report(args: argparse.Namespace) -> int:
    from mpsearch import write_llm_report  # plotly is imported only when a report is made

    print(write_llm_report(args.run_dir, args.out))
    return 0
