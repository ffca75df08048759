"""Single-operator TFLite probes through Vela: what the Ethos-U profiles claim, checked.

Each probe is one TFLite operator (written with mpsearch's TFLite writer) on a [1, 8, 8, 16]
feature map in a given activation type and zero point; Vela says NPU or CPU and why, and
TFLite's builtin kernels say whether they accept the file at all (the CPU fallback runs
those kernels). A concept of its own (the profile's claims one operator at a time, not models
through the toolchain: that is ``bench_targets.py``). ``python -m benchmarks.vela_probes``
writes benchmarks/results/vela_probes.md (``--no-write`` prints only); ``--chains ethos_u55``
instead writes vela_probes_chains_ethos_u55.md: every probed op between a producer and a
consumer in each pair of the profile's formats, TFLite's outputs against ONNX Runtime's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np

from benchmarks._results import publish
from mpsearch.targets import TargetError, VelaToolchain
from mpsearch.targets._tflite_flat import FlatModel, FlatTensor
from mpsearch.targets._vela import _interpreter, run_vela, vela_flags
from mpsearch.targets._vela_report import read_report

SHAPE = (1, 8, 8, 16)
ACCELERATORS = ("ethos-u55-128", "ethos-u85-256")


def _act(m: FlatModel, name: str, dtype: str, zero: int, shape: tuple[int, ...] = SHAPE,
         scale: float = 0.05) -> int:
    return m.add(FlatTensor(name=name, shape=shape, dtype=dtype, scale=np.array([scale]),
                            zero=np.array([zero])))


def _weights(m: FlatModel, shape: tuple[int, ...], per_axis: bool, bits: int = 8) -> int:
    rng = np.random.default_rng(0)
    dtype = "int8" if bits == 8 else "int16"
    scale = np.full(shape[0] if per_axis else 1, 0.01, np.float32)
    if per_axis:
        scale = scale * np.linspace(0.5, 1.5, shape[0]).astype(np.float32)
    return m.add(FlatTensor(name="w", shape=shape, dtype=dtype,
                            data=rng.integers(-100, 100, shape).astype(dtype), scale=scale,
                            zero=np.zeros(scale.size, np.int64)))


def _bias(m: FlatModel, channels: int, dtype: str) -> int:
    wide = "int64" if dtype == "int16" else "int32"
    return m.add(FlatTensor(name="b", shape=(channels,), dtype=wide,
                            data=np.zeros(channels, wide), scale=np.array([0.0005]),
                            zero=np.array([0])))


def _probe(kind: str, dtype: str, zero: int) -> FlatModel:
    """One operator of ``kind`` with activations of ``dtype`` and zero point ``zero``."""
    m = FlatModel()
    x = _act(m, "x", dtype, zero)
    m.inputs.append(x)
    out_shape = SHAPE
    if kind in ("CONV_2D", "CONV_2D w16", "FULLY_CONNECTED per-axis"):
        if kind == "FULLY_CONNECTED per-axis":
            m.tensors[x].shape = (1, 16)
            out_shape = (1, 16)
            w = _weights(m, (16, 16), per_axis=True)
            y = _act(m, "y", dtype, zero, out_shape)
            m.op("FULLY_CONNECTED", (x, w, _bias(m, 16, dtype)), (y,), "p",
                 "FullyConnectedOptions", fused_activation_function=0)
        else:
            w = _weights(m, (16, 3, 3, 16), per_axis=True, bits=16 if "w16" in kind else 8)
            y = _act(m, "y", dtype, zero)
            m.op("CONV_2D", (x, w, _bias(m, 16, dtype)), (y,), "p", "Conv2DOptions",
                 padding=0, stride_w=1, stride_h=1, fused_activation_function=0)
    elif kind == "BATCH_MATMUL":
        x2 = _act(m, "x2", dtype, zero)
        m.inputs.append(x2)
        y = _act(m, "y", dtype, zero, (1, 8, 8, 8))
        m.tensors[x2].shape = (1, 8, 16, 8)
        m.op("BATCH_MATMUL", (x, x2), (y,), "p", "BatchMatMulOptions", adj_x=False,
             adj_y=False)
    elif kind == "MEAN":
        y = _act(m, "y", dtype, zero, (1, 1, 1, 16))
        axes = m.add(FlatTensor(name="axes", shape=(2,), dtype="int32",
                                data=np.array([1, 2], np.int32)))
        m.op("MEAN", (x, axes), (y,), "p", "ReducerOptions", keep_dims=True)
    else:
        fixed = {"LOGISTIC": (1 / 256, -128), "SOFTMAX": (1 / 256, -128),
                 "TANH": (1 / 128, 0)}
        scale, out_zero = fixed.get(kind, (0.05, zero))
        if dtype == "int16" and kind in fixed:
            scale, out_zero = 1 / 32768, 0
        y = _act(m, "y", dtype, out_zero, scale=scale)
        options = {"SOFTMAX": ("SoftmaxOptions", {"beta": 1.0}),
                   "GELU": ("GeluOptions", {"approximate": False}),
                   "ADD": ("AddOptions", {"fused_activation_function": 0,
                                          "pot_scale_int16": False})}
        opts, fields = options.get(kind, (None, {}))
        inputs = (x, x) if kind == "ADD" else (x,)
        m.op(kind, inputs, (y,), "p", opts, **fields)
    m.outputs.append(m.ops[-1].outputs[0])
    return m


PROBES: tuple[tuple[str, str, int, str], ...] = (
    ("CONV_2D", "int8", -3, "int8 8x8, asymmetric activations"),
    ("CONV_2D", "int16", 0, "16x8, symmetric int16"),
    ("CONV_2D", "int16", 7, "16x8, asymmetric int16"),
    ("CONV_2D w16", "int16", 0, "16-bit weights"),
    ("FULLY_CONNECTED per-axis", "int8", 0, "Gemm/MatMul per-channel weights"),
    ("BATCH_MATMUL", "int8", 0, "MatMul of two activations, int8"),
    ("BATCH_MATMUL", "int16", 0, "MatMul of two activations, int16"),
    ("ADD", "int16", 0, "int16 Add"),
    ("ADD", "int16", 7, "int16 Add, asymmetric"),
    ("HARD_SWISH", "int8", 0, "HardSwish int8"),
    ("HARD_SWISH", "int16", 0, "HardSwish int16"),
    ("LOGISTIC", "int16", 0, "Sigmoid int16"),
    ("TANH", "int16", 0, "Tanh int16"),
    ("SOFTMAX", "int16", 0, "Softmax int16"),
    ("MEAN", "int16", 0, "ReduceMean/GlobalAveragePool int16"),
    ("GELU", "int8", 0, "GELU int8"),
    ("GELU", "int16", 0, "GELU int16"),
    ("EXP", "int16", 0, "Exp int16"),
)


def probe_rows(accelerators: tuple[str, ...], log: Callable[[str], None] = print
               ) -> list[str]:
    """Markdown rows: probe, accelerator, Vela's unit and reason, TFLite's verdict."""
    rows = []
    with TemporaryDirectory() as tmp:
        for i, (kind, dtype, zero, what) in enumerate(PROBES):
            folder = Path(tmp) / f"p{i}"
            folder.mkdir()
            path = folder / "probe.tflite"
            path.write_bytes(_probe(kind, dtype, zero).bytes())
            try:
                _interpreter(path)
                tflite = "accepts"
            except TargetError as e:
                tflite = "refuses: " + str(e).split(": ", 1)[-1][:90]
            for acc in accelerators:
                try:
                    _, stdout = run_vela(path, folder / acc,
                                         vela_flags({"accelerator_config": acc}))
                    report = read_report(folder / acc, "probe", stdout)
                    unit = report.targets.get("y", "?")
                    why = report.reasons.get("y", "")
                except TargetError as e:  # the probe's folder is temporary: not named
                    unit, why = "error", str(e).replace(str(path), "probe.tflite")[:120]
                row = (f"| {what} | {kind.split()[0]} {dtype} zp={zero} | {acc} | {unit} | "
                       f"{why.replace('|', '/')[:160]} | {tflite} |")
                rows.append(row)
                log(row)
    return rows


def chain_rows(profile_name: str, log: Callable[[str], None] = print) -> tuple[list[str], int]:
    """Markdown rows of every probed op in fp32 between a producer and a consumer in each
    pair of the profile's formats (what the writer emits for an input of one format and an
    output of another), through Vela and TFLite against ONNX Runtime; and the failures."""
    from mpsearch.profiles import load_profile
    from mpsearch.targets._probes import PROBES, TOLERANCE, check_chains

    ops = [o for o in PROBES if o not in ("Split", "Where")]  # two outputs / a bool input
    rows, failed = [], 0
    for r in check_chains(load_profile(profile_name), VelaToolchain(), ops, progress=log):
        failed += not r.agrees
        error = "-" if r.error is None else f"{r.error:.4f}"
        verdict = "ok" if r.agrees else f"FAILS (> {TOLERANCE})" if r.error else "FAILS"
        rows.append(f"| {r.op_type} | {r.before} | {r.after} | {r.unit} | {error} | {verdict} | "
                    f"{r.reason.replace('|', '/')[:110] if not r.agrees else ''} |")
    return rows, failed


def _chains(profile_name: str, write: bool) -> int:
    rows, failed = chain_rows(profile_name, log=lambda _: None)
    text = "\n".join([
        f"# {profile_name}: every op between formats, through the TFLite writer, Vela and TFLite",
        "", f"Vela {VelaToolchain().version()}. Each row is `pre -> op -> post`: the op in fp32 "
        "(the profile's float format, which the writer emits as an integer operator when both "
        "neighbours are integer), `pre` and `post` in the formats shown, so the op reads one "
        "format and writes another. `error`: the largest difference between TFLite's outputs "
        "and ONNX Runtime's on the same QDQ model, over the output range (8 samples); `unit`: "
        "where Vela places the op.", "",
        f"{len(rows) - failed} of {len(rows)} agree.", "",
        "| op | input format | output format | unit | error | verdict | reason |",
        "|---|---|---|---|---|---|---|", *rows])
    publish(f"vela_probes_chains_{profile_name}", text, write)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--chains", metavar="PROFILE",
                        help="instead: every op between every pair of PROFILE's formats")
    args = parser.parse_args(argv)
    if args.chains:
        return _chains(args.chains, not args.no_write)
    rows = probe_rows(ACCELERATORS, log=lambda _: None)
    text = "\n".join([
        "# Ethos-U profile claims checked through Vela, one operator per probe", "",
        f"Vela {VelaToolchain().version()}. Each probe is one TFLite operator on a "
        "[1, 8, 8, 16] feature map. `Vela` is its placement and reason; `TFLite` says whether "
        "TFLite's kernels (the CPU fallback's) accept the file.", "",
        "| claim probed | operator | accelerator | Vela | Vela's reason | TFLite |",
        "|---|---|---|---|---|---|", *rows])
    publish("vela_probes", text, not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
