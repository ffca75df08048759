"""Tests for the strict YAML layer (mpsearch._yaml): lines, key checks, typed getters, merge."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpsearch._yaml import LineDict, LineList, Section, load_yaml, merge_maps, suggest


class SpecProblem(Exception):
    """A caller-chosen error class: the layer must raise exactly this."""


def _write(tmp_path: Path, text: str, name: str = "conf.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _root(tmp_path: Path, text: str) -> Section:
    path = _write(tmp_path, text)
    return Section.root(load_yaml(path, SpecProblem), str(path), SpecProblem)


DOC = """\
top: 1
formats:
  int8:
    weight:
      dtype: int8
      granularity: per_channel
    tags: [a, b,
           c]
"""


def test_load_keeps_lines_of_keys_and_items(tmp_path: Path) -> None:
    path = _write(tmp_path, DOC)
    data = load_yaml(path, SpecProblem)
    assert isinstance(data, LineDict)
    assert data.mark_of("top") == (str(path), 1)
    weight = data["formats"]["int8"]["weight"]
    assert weight.mark == (str(path), 5)
    assert weight.mark_of("granularity") == (str(path), 6)
    tags = data["formats"]["int8"]["tags"]
    assert isinstance(tags, LineList) and tags == ["a", "b", "c"]
    assert [m[1] for m in tags.marks] == [7, 7, 8]


def test_yaml12_exponent_floats_are_numbers(tmp_path: Path) -> None:
    data = load_yaml(_write(tmp_path, "a: 1e-5\nb: 3.0517578125e-05\nc: 1.5\nd: '1e-5'\n"),
                     SpecProblem)
    assert data == {"a": 1e-5, "b": 3.0517578125e-05, "c": 1.5, "d": "1e-5"}


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "a: 1\nb: 2\na: 3\n")
    with pytest.raises(SpecProblem) as info:
        load_yaml(path, SpecProblem)
    assert str(info.value) == f"{path}:3: duplicate key 'a' (first written on line 1); keep one"


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "a: 1\nb: [1, 2\nc: 3\n")
    with pytest.raises(SpecProblem, match=r"conf\.yaml:\d+: invalid YAML: .*; fix the syntax$"):
        load_yaml(path, SpecProblem)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(SpecProblem, match=r"missing\.yaml: cannot read the file .*; check"):
        load_yaml(tmp_path / "missing.yaml", SpecProblem)


def test_unknown_key_did_you_mean(tmp_path: Path) -> None:
    root = _root(tmp_path, "formats:\n  int8:\n    weight:\n      granulariy: per_tensor\n")
    weight = root.section("formats").section("int8").section("weight")
    with pytest.raises(SpecProblem) as info:
        weight.check_keys(("dtype", "granularity", "symmetric"))
    assert str(info.value) == (f"{tmp_path / 'conf.yaml'}:4: unknown key 'granulariy' in "
                               "formats.int8.weight; did you mean 'granularity'?")


def test_unknown_key_without_close_match_lists_allowed(tmp_path: Path) -> None:
    root = _root(tmp_path, "zzz: 1\n")
    with pytest.raises(SpecProblem) as info:
        root.check_keys(("alpha", "beta"))
    assert str(info.value).endswith(":1: unknown key 'zzz' at top level; expected one of "
                                    "alpha, beta")


def test_missing_required_key(tmp_path: Path) -> None:
    root = _root(tmp_path, "\n\nalpha: 1\n")
    with pytest.raises(SpecProblem, match=r":3: missing key 'beta' at top level; add it$"):
        root.check_keys(("alpha",), required=("beta",))


def test_choice_getter_message(tmp_path: Path) -> None:
    root = _root(tmp_path, "formats:\n  int8:\n    weight:\n      dtype: int9\n")
    weight = root.section("formats").section("int8").section("weight")
    with pytest.raises(SpecProblem) as info:
        weight.get_str("dtype", choices=("int8", "uint8", "int16", "uint16"))
    assert str(info.value) == (f"{tmp_path / 'conf.yaml'}:4: formats.int8.weight.dtype must be "
                               "one of int8, uint8, int16, uint16, got 'int9'")


@pytest.mark.parametrize(
    ("text", "call", "message"),
    [
        ("a: yes\n", lambda s: s.get_bool("a"), None),
        ("a: 'true'\n", lambda s: s.get_bool("a"), ":1: a must be true or false, got 'true'"),
        ("a: true\n", lambda s: s.get_int("a"), ":1: a must be an integer, got True"),
        ("a: 1.5\n", lambda s: s.get_int("a"), ":1: a must be an integer, got 1.5"),
        ("a: -3\n", lambda s: s.get_int("a", minimum=0), ":1: a must be >= 0, got -3"),
        ("a: x\n", lambda s: s.get_float("a", unknown=("unknown",)),
         ":1: a must be a number, null or unknown, got 'x'"),
        ("a: 0\n", lambda s: s.get_float("a", positive=True),
         ":1: a must be greater than 0, got 0"),
        ("a: 3\n", lambda s: s.get_str("a"), ":1: a must be a non-empty string, got 3"),
        ("a: x\n", lambda s: s.get_str_list("a"), ":1: a must be a list, got 'x'"),
        ("a: []\n", lambda s: s.get_str_list("a", non_empty=True),
         ":1: a is an empty list; list at least one entry"),
        ("a:\n  - x\n  - 5\n", lambda s: s.get_str_list("a"),
         ":3: a[1] must be a non-empty string, got 5"),
        ("a: [x, y]\n", lambda s: s.get_str_list("a", choices=("x",)),
         ":1: a[1] must be one of x, got 'y'"),
        ("a: 3\n", lambda s: s.section("a"), ":1: a must be a mapping, got 3"),
    ],
)
def test_typed_getters(tmp_path: Path, text: str, call, message: str | None) -> None:
    root = _root(tmp_path, text)
    if message is None:
        assert call(root) is True
        return
    with pytest.raises(SpecProblem) as info:
        call(root)
    assert str(info.value) == f"{tmp_path / 'conf.yaml'}{message}"


def test_getters_defaults_and_unknown(tmp_path: Path) -> None:
    root = _root(tmp_path, "a: unknown\nb: null\nc: 2\nd: null\n")
    assert root.get_float("a", unknown=("unknown",)) is None
    assert root.get_float("b", unknown=("unknown",)) is None
    assert root.get_float("c") == 2.0 and isinstance(root.get_float("c"), float)
    assert root.get_int("missing", 7) == 7
    assert root.get_str("d", "fallback") == "fallback"  # explicit null on an optional key
    assert root.get_str_list("missing", ()) == ()
    assert root.section("missing", {}).data == {}


def test_root_must_be_mapping(tmp_path: Path) -> None:
    path = _write(tmp_path, "- a\n- b\n")
    with pytest.raises(SpecProblem, match=r"conf\.yaml:1: the file must be a mapping, got a list"):
        Section.root(load_yaml(path, SpecProblem), str(path), SpecProblem)


def test_empty_file_is_empty_mapping(tmp_path: Path) -> None:
    path = _write(tmp_path, "# nothing\n")
    root = Section.root(load_yaml(path, SpecProblem), str(path), SpecProblem)
    assert list(root.keys()) == []


def test_merge_maps_deep_and_marks_follow_values(tmp_path: Path) -> None:
    base_path = _write(tmp_path, "a:\n  x: 1\n  y: 2\nl: [1, 2]\nkeep: 0\n", "base.yaml")
    child_path = _write(tmp_path, "a:\n  y: 3\nl: [9]\n", "child.yaml")
    merged = merge_maps(load_yaml(base_path, SpecProblem), load_yaml(child_path, SpecProblem))
    assert merged == {"a": {"x": 1, "y": 3}, "l": [9], "keep": 0}
    assert merged["a"].mark_of("x") == (str(base_path), 2)
    assert merged["a"].mark_of("y") == (str(child_path), 2)
    assert merged.mark_of("keep") == (str(base_path), 5)
    assert merged.mark_of("l") == (str(child_path), 3)


def test_suggest() -> None:
    assert suggest("fallbak", ["fallback", "formats"]) == "; did you mean 'fallback'?"
    assert suggest("qqq", ["b", "a"]) == "; expected one of a, b"
    assert suggest("qqq", []) == ""
