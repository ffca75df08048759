"""``mpsearch calibrate MODEL --data DATA --method M --out DIR``: one call into the calibrate API.

Loads the model and data, checks the data against the model's inputs, calibrates once (or loads
the table already in ``DIR`` when the model and data fingerprints match) and prints each
activation tensor's min, max and the range of the chosen method.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from mpsearch.cli._progress import BarProgress

__all__ = ["add_calibrate_parser"]


def add_calibrate_parser(subparsers: Any) -> None:
    """Register the ``calibrate`` sub-command on an argparse sub-parser collection."""
    from mpsearch.spec import METHODS

    parser = subparsers.add_parser(
        "calibrate", help="collect activation statistics once (saved, fingerprinted)",
        description="Run the calibration data through the model once and save the statistics "
                    "every range method is derived from.")
    parser.add_argument("model", help="ONNX model file")
    parser.add_argument("--data", required=True,
                        help="calibration data: .npz/.npy, an image folder or module:function")
    parser.add_argument("--method", choices=METHODS, default="minmax",
                        help="default range method recorded in the table (default: minmax)")
    parser.add_argument("--out", required=True, help="directory of the calibration table")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="samples per ORT run (default: as many as fit a 128 MB budget "
                             "of exposed activations, at most 64)")
    parser.add_argument("--bins", type=int, default=2048, help="histogram bins (even)")
    parser.add_argument("--percentile", type=float, default=99.999,
                        help="kept percentage for --method percentile (default: 99.999)")
    parser.add_argument("--samples", type=int, default=None,
                        help="calibrate on the first N samples only")
    parser.add_argument("--bits", type=int, choices=(8, 16), default=8,
                        help="grid the printed ranges are computed for")
    parser.add_argument("--symmetric", action="store_true", help="print symmetric ranges")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads")
    parser.set_defaults(func=_calibrate)


def _calibrate(args: argparse.Namespace) -> int:
    from mpsearch.pipeline import calibrate_model

    start = time.perf_counter()
    progress = BarProgress()
    table = calibrate_model(args.model, args.data, args.out, samples=args.samples,
                            method=args.method, batch_size=args.batch_size, bins=args.bins,
                            percentile=args.percentile, threads=args.threads,
                            progress=progress)
    progress.close()
    elapsed = time.perf_counter() - start
    width = max([len("tensor"), *(len(t) for t in table.tensors)])
    width = min(width, 60)
    print(f"{'tensor':<{width}}  {'min':>11}  {'max':>11}  {args.method + ' range':>25}")
    for name, stats in table.tensors.items():
        lo, hi = table.range(name, bits=args.bits, symmetric=args.symmetric)
        shown = name if len(name) <= width else "..." + name[-(width - 3):]
        print(f"{shown:<{width}}  {stats.min:>11.5g}  {stats.max:>11.5g}  "
              f"[{lo:>11.5g}, {hi:>11.5g}]")
    print(f"{len(table.tensors)} tensors, {table.samples} samples, {elapsed:.2f} s; "
          f"table in {args.out}")
    return 0
