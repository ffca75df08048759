"""Strict YAML at the edge: parse once, keep line numbers, check keys and types.

Consumes a YAML file; produces plain Python values in which every mapping is a
:class:`LineDict` and every sequence a :class:`LineList`, both remembering the file and line
where they (and each of their keys or items) were written. :class:`Section` wraps one mapping
with its dotted location (``formats.int8.weight``) and offers key checks ("did you mean") and
typed getters whose errors are one line: ``"{file}:{line}: {where}.{key} must be ..., got ..."``.

Nothing here knows about hardware profiles or search specs: the caller passes the error class
to raise (a :class:`~mpsearch.errors.MpsearchError` subclass).
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import yaml

from mpsearch._io import read_text

__all__ = [
    "UNSET",
    "LineDict",
    "LineList",
    "Mark",
    "Section",
    "load_yaml",
    "merge_maps",
    "suggest",
]

Mark = tuple[str, int]
"""Where a value was written: (file, 1-based line)."""

UNSET: Any = object()
"""Default for getters meaning "the key is required"."""

_NO_MARK: Mark = ("<unknown>", 0)


class LineDict(dict[Any, Any]):
    """A dict that remembers where it and each of its keys were written."""

    __slots__ = ("mark", "marks")

    def __init__(self, *args: Any, mark: Mark = _NO_MARK, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mark: Mark = mark
        self.marks: dict[Any, Mark] = {}

    def mark_of(self, key: Any) -> Mark:
        """Where ``key`` was written (the mapping's own mark if unknown)."""
        return self.marks.get(key, self.mark)


class LineList(list[Any]):
    """A list that remembers where it and each of its items were written."""

    __slots__ = ("mark", "marks")

    def __init__(self, items: Iterable[Any] = (), *, mark: Mark = _NO_MARK) -> None:
        super().__init__(items)
        self.mark: Mark = mark
        self.marks: list[Mark] = []

    def mark_of(self, index: int) -> Mark:
        """Where item ``index`` was written (the list's own mark if unknown)."""
        return self.marks[index] if index < len(self.marks) else self.mark


# YAML 1.1 (PyYAML) reads 1e-5 as a string; accept the YAML 1.2 spelling of floats too.
_FLOAT_12 = re.compile(r"^[-+]?(?:[0-9][0-9_]*)?(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


#: Deepest nesting of mappings and lists accepted: specs and profiles need a handful, and the
#: composer recurses once per level (5,000 levels exhaust Python's stack).
MAX_DEPTH = 64
#: Bytes of one YAML file (PyYAML takes ~100 times a file's size to parse it).
YAML_LIMIT = 1 << 20


class _LineLoader(yaml.SafeLoader):
    """SafeLoader building LineDict/LineList, rejecting duplicate keys and deep nesting."""

    file: str = "<string>"
    error_cls: type[Exception] = ValueError
    depth: int = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]
                raise self.error_cls(f"{self.file}:{line}: mappings and lists nest deeper than "
                                     f"{MAX_DEPTH} levels; flatten the file")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


_LineLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    result = LineDict(mark=(loader.file, node.start_mark.line + 1))
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            hash(key)
        except TypeError:
            raise loader.error_cls(
                f"{loader.file}:{line}: a mapping key must be a plain scalar; write it as text"
            ) from None
        if key in result:
            first = result.marks[key][1]
            raise loader.error_cls(
                f"{loader.file}:{line}: duplicate key '{key}' (first written on line {first});"
                " keep one"
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.marks[key] = (loader.file, line)
    return result


def _construct_seq(loader: _LineLoader, node: yaml.SequenceNode) -> LineList:
    result = LineList(mark=(loader.file, node.start_mark.line + 1))
    for item in node.value:
        result.append(loader.construct_object(item, deep=True))
        result.marks.append((loader.file, item.start_mark.line + 1))
    return result


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


def load_yaml(path: str | os.PathLike[str], error: type[Exception]) -> Any:
    """Parse one YAML file; mappings become LineDict, sequences LineList.

    Raises ``error`` (one line: file, line, problem) when the file cannot be read, is not
    valid YAML, or repeats a key in one mapping.
    """
    file = str(path)
    try:
        text = read_text(path, error, limit=YAML_LIMIT, fix="a spec or profile is a few kB; "
                         "check the path")
    except OSError as e:
        raise error(f"{file}: cannot read the file ({e.strerror}); check the path") from e
    loader = _LineLoader(text)
    loader.file = file
    loader.error_cls = error
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else 0
        problem = " ".join(str(e.problem or e.context or "syntax error").split())
        raise error(f"{file}:{line}: invalid YAML: {problem}; fix the syntax") from e
    except yaml.YAMLError as e:
        raise error(f"{file}: invalid YAML: {' '.join(str(e).split())}") from e
    finally:
        loader.dispose()


def merge_maps(base: Mapping[Any, Any], override: Mapping[Any, Any]) -> LineDict:
    """Deep-merge two mappings: ``override`` wins; nested mappings merge; lists are replaced.

    Marks follow the values, so an error in a key inherited from ``base`` still names the file
    that wrote it.
    """
    mark = override.mark if isinstance(override, LineDict) else _NO_MARK
    merged = LineDict(mark=mark)
    for source in (base, override):
        for key, value in source.items():
            old = merged.get(key)
            if isinstance(old, Mapping) and isinstance(value, Mapping):
                value = merge_maps(old, value)
            merged[key] = value
            if isinstance(source, LineDict):
                merged.marks[key] = source.mark_of(key)
    return merged


def suggest(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest choice, else ``"; expected one of a, b"``."""
    names = sorted(str(c) for c in choices)
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; expected one of {', '.join(names)}" if names else ""


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    return repr(value)


class Section:
    """One YAML mapping with its dotted location, for strict key and type checks."""

    __slots__ = ("data", "error", "where")

    def __init__(self, data: Any, where: str, error: type[Exception], *, mark: Mark) -> None:
        if not isinstance(data, Mapping):
            raise error(f"{mark[0]}:{mark[1]}: {where or 'the file'} must be a mapping, "
                        f"got {_describe(data)}")
        self.data: LineDict = data if isinstance(data, LineDict) else LineDict(data, mark=mark)
        self.error = error
        self.where = where

    @classmethod
    def root(cls, data: Any, file: str, error: type[Exception]) -> Section:
        """The top-level mapping of a file (an empty file is an empty mapping)."""
        if data is None:
            data = LineDict(mark=(file, 1))
        mark = data.mark if isinstance(data, (LineDict, LineList)) else (file, 1)
        return cls(data, "", error, mark=mark)

    # -- locations and errors ------------------------------------------------------------
    def path(self, key: str) -> str:
        """Dotted location of ``key`` in this section."""
        return f"{self.where}.{key}" if self.where else str(key)

    def mark_of(self, key: str) -> Mark:
        """Where ``key`` was written (the mapping's line when absent)."""
        return self.data.mark_of(key)

    def fail_at(self, mark: Mark, message: str) -> NoReturn:
        """Raise the section's error class as ``file:line: message``."""
        raise self.error(f"{mark[0]}:{mark[1]}: {message}")

    def fail(self, key: str, message: str) -> NoReturn:
        """Raise at the line of ``key``."""
        self.fail_at(self.mark_of(key), message)

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def keys(self) -> Iterator[str]:
        """Keys in file order."""
        return iter(self.data)

    # -- key checks ------------------------------------------------------------------------
    def check_keys(self, allowed: Iterable[str], required: Iterable[str] = ()) -> None:
        """Reject unknown keys (with "did you mean") and report the first missing required key."""
        allowed_set = set(allowed) | set(required)
        for key in self.data:
            if key not in allowed_set:
                place = f"in {self.where}" if self.where else "at top level"
                self.fail(key, f"unknown key '{key}' {place}{suggest(str(key), allowed_set)}")
        for key in required:
            if key not in self.data:
                place = f"in {self.where}" if self.where else "at top level"
                self.fail_at(self.data.mark, f"missing key '{key}' {place}; add it")

    # -- typed getters ---------------------------------------------------------------------
    def _raw(self, key: str, default: Any) -> tuple[bool, Any]:
        """(present, value); an explicit null on an optional key counts as absent."""
        if key in self.data and not (self.data[key] is None and default is not UNSET):
            return True, self.data[key]
        if default is UNSET:
            place = f"in {self.where}" if self.where else "at top level"
            self.fail_at(self.data.mark, f"missing key '{key}' {place}; add it")
        return False, default

    def get_str(self, key: str, default: Any = UNSET, *, choices: Sequence[str] = ()) -> Any:
        """A string (one of ``choices`` when given)."""
        present, value = self._raw(key, default)
        if not present:
            return value
        if choices and value not in choices:
            self.fail(key, f"{self.path(key)} must be one of {', '.join(choices)}, "
                      f"got {_describe(value)}")
        if not isinstance(value, str) or not value:
            self.fail(key, f"{self.path(key)} must be a non-empty string, got {_describe(value)}")
        return value

    def get_bool(self, key: str, default: Any = UNSET) -> Any:
        """A YAML boolean (true/false)."""
        present, value = self._raw(key, default)
        if present and not isinstance(value, bool):
            self.fail(key, f"{self.path(key)} must be true or false, got {_describe(value)}")
        return value

    def get_int(
        self, key: str, default: Any = UNSET, *, minimum: int | None = None,
        unknown: Sequence[str] = (),
    ) -> Any:
        """An integer (not a bool); null or a word in ``unknown`` gives None when allowed."""
        present, value = self._raw(key, default)
        if not present or self._is_unknown(value, unknown):
            return None if present else value
        if isinstance(value, bool) or not isinstance(value, int):
            extra = ", null or unknown" if unknown else ""
            self.fail(key, f"{self.path(key)} must be an integer{extra}, got {_describe(value)}")
        self._check_min(key, value, minimum)
        return value

    def get_float(
        self, key: str, default: Any = UNSET, *, minimum: float | None = None,
        positive: bool = False, unknown: Sequence[str] = (),
    ) -> Any:
        """A number as float; null or a word in ``unknown`` gives None when allowed."""
        present, value = self._raw(key, default)
        if not present or self._is_unknown(value, unknown):
            return None if present else value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            extra = ", null or unknown" if unknown else ""
            self.fail(key, f"{self.path(key)} must be a number{extra}, got {_describe(value)}")
        if not math.isfinite(value):
            self.fail(key, f"{self.path(key)} must be a finite number, got {value!r}; write a "
                      "plain number")
        if positive and not value > 0:
            self.fail(key, f"{self.path(key)} must be greater than 0, got {value!r}")
        self._check_min(key, value, minimum)
        return float(value)

    def get_str_list(
        self, key: str, default: Any = UNSET, *, choices: Sequence[str] = (),
        non_empty: bool = False,
    ) -> Any:
        """A list of strings, returned as a tuple."""
        present, value = self._raw(key, default)
        if not present:
            return value
        if not isinstance(value, list):
            self.fail(key, f"{self.path(key)} must be a list, got {_describe(value)}")
        if non_empty and not value:
            self.fail(key, f"{self.path(key)} is an empty list; list at least one entry")
        marks = value.marks if isinstance(value, LineList) else []
        for i, item in enumerate(value):
            mark = marks[i] if i < len(marks) else self.mark_of(key)
            if not isinstance(item, str) or not item:
                self.fail_at(mark, f"{self.path(key)}[{i}] must be a non-empty string, "
                             f"got {_describe(item)}")
            if choices and item not in choices:
                self.fail_at(mark, f"{self.path(key)}[{i}] must be one of "
                             f"{', '.join(choices)}, got {_describe(item)}")
        return tuple(value)

    def section(self, key: str, default: Any = UNSET) -> Section:
        """The mapping under ``key`` as a Section (``default`` -> empty mapping)."""
        present, value = self._raw(key, default)
        if not present:
            return Section(LineDict(mark=self.data.mark), self.path(key), self.error,
                           mark=self.data.mark)
        return Section(value, self.path(key), self.error, mark=self.mark_of(key))

    def _is_unknown(self, value: Any, unknown: Sequence[str]) -> bool:
        return bool(unknown) and (value is None or value in unknown)

    def _check_min(self, key: str, value: float, minimum: float | None) -> None:
        if minimum is not None and value < minimum:
            self.fail(key, f"{self.path(key)} must be >= {minimum}, got {value!r}")
