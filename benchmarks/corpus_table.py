"""The real-model corpus (:mod:`mpsearch.testing.corpus`) as a table, each model through our
uniform INT8/INT16 and ORT's ``quantize_static`` INT8; or, with ``--search KEY DIR``, a search
spec, model link and data for one corpus model.

    python -m benchmarks.corpus_table                       # prints the table
    python -m benchmarks.corpus_table --search magika /tmp/magika   # then:
    mpsearch search /tmp/magika/search.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mpsearch.testing.corpus import CORPUS, write_search
from mpsearch.testing.corpus_check import check_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--search", nargs=2, metavar=("KEY", "DIR"),
                        help="write a search spec, model link and data for one model and stop")
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    if args.search:
        print(write_search(args.search[0], Path(args.search[1]), args.trials))
        return
    print("| model | exporter | nodes | params | MACs | metric | FP32 | ours INT8 | ORT INT8 |"
          " ours INT16 | size FP32 / ours INT8 / ORT INT8 (MB) | ours / ORT INT8 file |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in CORPUS:
        if model.path() is None:
            print(f"| {model.key} | {model.package} not installed |")
            continue
        r = check_model(model, Path("/tmp/mpsearch-corpus"))
        print(f"| {model.key} | {model.exporter} | {r.nodes} | {r.params:,} | {r.macs:,} | "
              f"{model.metric_name} (n={r.samples}) | {r.fp32} | {r.ours_int8} | {r.ort_int8} | "
              f"{r.ours_int16} | {r.fp32_bytes / 1e6:.2f} / {r.ours_bytes / 1e6:.2f} / "
              f"{r.ort_bytes / 1e6:.2f} | {r.ours_bytes / r.ort_bytes:.4f}x |", flush=True)


if __name__ == "__main__":
    main()
