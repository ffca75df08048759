"""The import drawing of the package: layered units, no cycle, shells on top (README,
"Architecture"). Every import counts, lazy ones inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

import mpsearch

PACKAGE = Path(mpsearch.__file__).parent
SHELLS = {"cli", "serve"}
ENTRY = "__main__"  # `python -m mpsearch`: the CLI itself
TESTING = "testing"  # the tests' and benchmarks' support: a user of the public API, like a shell


def _unit(module: str) -> str:
    """``mpsearch.search._study`` -> ``search``; ``mpsearch`` -> ``mpsearch`` (the facade)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "mpsearch"


def _module_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _edges() -> set[tuple[str, str]]:
    edges = set()
    for path in PACKAGE.rglob("*.py"):
        source = _module_of(path)
        if source == "mpsearch":
            continue  # the facade: lazy re-exports of the units below it
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module == "mpsearch" and not node.level:
                for alias in node.names:
                    if alias.name == "__version__":
                        continue
                    sub = PACKAGE / alias.name
                    is_unit = sub.is_dir() or sub.with_suffix(".py").is_file()
                    targets.append(f"mpsearch.{alias.name}" if is_unit else "mpsearch")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mpsearch."):
                targets.append(node.module or "")
            elif isinstance(node, ast.Import):
                targets += [a.name for a in node.names if a.name.startswith("mpsearch.")]
            for target in targets:
                if _unit(target) != _unit(source):
                    edges.add((_unit(source), _unit(target)))
    return edges


def test_units_form_no_cycle() -> None:
    graph = nx.DiGraph(_edges())
    assert nx.is_directed_acyclic_graph(graph), list(nx.simple_cycles(graph))


def test_nothing_imports_the_shells_and_only_shells_use_the_facade() -> None:
    edges = _edges()
    assert not [(a, b) for a, b in edges if b in SHELLS and a not in {*SHELLS, ENTRY}]
    assert not [(a, b) for a, b in edges if b == TESTING]
    assert {a for a, b in edges if b == "mpsearch"} <= {*SHELLS, TESTING}


def test_shells_import_only_the_public_surface() -> None:
    allowed = {"mpsearch", "pipeline", "spec", "rundir", "progress", "errors", "pareto", *SHELLS}
    for source in SHELLS:
        reached = {b for a, b in _edges() if a == source}
        assert reached <= allowed, (source, reached - allowed)


def test_engine_layers_point_down() -> None:
    """Spot checks of the flow graph -> ... -> search -> pipeline: no stage imports the
    composer, the kernels import no other unit, the search only the analysis below it."""
    edges = _edges()
    assert not [a for a, b in edges if b == "pipeline" and a not in SHELLS]
    assert not [b for a, b in edges if a == "kernels"]
    assert ("search", "analysis") in edges and ("analysis", "search") not in edges


def test_every_subpackage_is_installed() -> None:
    """pyproject lists packages explicitly: a subpackage missing there works from a checkout
    (editable install, CI) and breaks `pip install .` (the Quickstart)."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {"mpsearch." + p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert found <= listed, sorted(found - listed)
