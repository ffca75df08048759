"""Benchmark results regenerate without harm: every script writes only its own generated file.

Runs the write path (``benchmarks/_results.publish``) of every script on a copy of the folder,
in a child process, and checks that it leaves every other file byte-identical and writes a
header that names the command, commit, CPU and ONNX Runtime version.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _published_names() -> dict[str, list[str]]:
    """Script stem -> the result names its ``publish(...)`` calls write: string literals, or
    f-strings whose literal start stands for them (written here with ``_part`` after it)."""
    names: dict[str, list[str]] = {}
    for script in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "publish"):
                first = node.args[0]
                if isinstance(first, ast.JoinedStr) and first.values:
                    first = first.values[0]
                    suffix = "_part"
                else:
                    suffix = ""
                assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
                    f"{script.name}:{node.lineno}: publish() must name its file with a literal "
                    "or an f-string that starts with one")
                names.setdefault(script.stem, []).append(first.value + suffix)
    return names


def test_each_script_writes_files_named_after_itself_only() -> None:
    names = _published_names()
    assert {"bench_pipeline", "bench_quantize", "bench_recovery", "bench_sensitivity",
            "bench_startup"} <= set(names)
    written = [n for stems in names.values() for n in stems]
    assert len(written) == len(set(written)), f"two scripts write one file: {names}"
    for stem, files in names.items():
        assert all(f == stem or f.startswith(stem + "_") for f in files), (stem, files)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def test_every_write_path_on_a_copy_deletes_nothing_another_script_wrote(tmp_path: Path
                                                                         ) -> None:
    copy = tmp_path / "benchmarks"
    shutil.copytree(BENCHMARKS, copy, ignore=shutil.ignore_patterns("__pycache__", "_models"))
    (copy / "results").mkdir(exist_ok=True)
    (copy / "results" / "hand_kept_by_nobody.md").write_text("must survive\n")
    for stem, files in _published_names().items():
        for name in files:
            before = _snapshot(copy)
            code = ("import sys; sys.argv = [sys.argv[1], '--flag']; import _results; "
                    "_results.publish(sys.argv_name, '## A title\\n\\nrow 1\\n', True)"
                    ).replace("sys.argv_name", repr(name))
            subprocess.run([sys.executable, "-c", code, str(copy / f"{stem}.py")], cwd=copy,
                           check=True, capture_output=True, text=True)
            after = _snapshot(copy)
            target = f"results/{name}.md"
            assert {k: v for k, v in after.items() if k != target} == {
                k: v for k, v in before.items() if k != target}, f"{stem} changed another file"
            page = after[target].decode()
            assert page.startswith("# A title\n"), page
            assert f"Command: `python benchmarks/{stem}.py --flag`" in page
            for line in ("Commit: ", "CPU: ", "int8 flags: ", "onnxruntime: "):
                assert line in page, (line, page)
            assert page.rstrip().endswith("row 1")
