"""Text corpora as token windows, split by document.

Consumes a corpus (a UTF-8 text file, whose blank-line separated paragraphs are its documents;
a folder of them, one document a file; JSON or JSONL whose records are strings or objects with
a text field) and the model's tokenizer (``tokenizer.json``, read by ``tokenizers``); produces
:class:`TextWindows`: int64 arrays ``[n, length]`` for calibration, search and held-out.

Documents are shuffled by the seed and dealt to the three splits in proportion to their tokens;
each split's documents are joined (with the end-of-text token between them, when the tokenizer
has one) and cut into non-overlapping windows. No window holds tokens of two splits, so nothing
of the held-out text is ever seen by calibration or the search.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpsearch.errors import DataError

__all__ = ["SPLITS", "TextWindows", "load_documents", "load_tokenizer", "make_windows"]

SPLITS = ("calibration", "search", "heldout")
_SEPARATORS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


@dataclass(frozen=True, slots=True, kw_only=True)
class TextWindows:
    """Token windows ``[n, length]`` (int64) per split, and the documents behind each."""

    calibration: np.ndarray
    search: np.ndarray
    heldout: np.ndarray
    length: int
    documents: tuple[int, int, int]  # documents dealt to each split
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return {"length": self.length, "seed": self.seed,
                "windows": {s: int(len(getattr(self, s))) for s in SPLITS},
                "documents": dict(zip(SPLITS, self.documents, strict=True))}


def load_documents(path: str | Path, *, text_field: str = "text") -> tuple[str, ...]:
    """The documents of a corpus; DataError (exit 2) for a missing path, a file that is not
    UTF-8 or not valid JSON, a record without ``text_field``, or a corpus with no text."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        docs = [_read(f).strip() for f in files]
    elif path.is_file():
        text = _read(path)
        if path.suffix == ".jsonl":
            docs = [_record(_json(line, path, n), text_field, path)
                    for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        elif path.suffix == ".json":
            data = _json(text, path, 1)
            records = list(data.values()) if isinstance(data, dict) else data
            if not isinstance(records, list):
                raise DataError(f"{path}: the JSON is neither a list nor an object of records; "
                                f"give records that are strings or objects with '{text_field}'")
            docs = [_record(r, text_field, path) for r in records]
        else:
            docs = [p.strip() for p in text.replace("\r\n", "\n").split("\n\n")]
    else:
        raise DataError(f"{path}: no such file or folder; give a UTF-8 text file, a folder of "
                        "them, or a JSON/JSONL file of records")
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise DataError(f"{path}: the corpus holds no text; give a corpus with at least one "
                        "non-empty document")
    return tuple(docs)


def load_tokenizer(path: str | Path) -> Any:
    """A ``tokenizers.Tokenizer`` read from ``tokenizer.json``; DataError when it cannot be."""
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise DataError("the tokenizers package is missing; pip install 'mpsearch[llm]'") from e
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        reason = str(e).splitlines()[0][:100]
        raise DataError(f"{path}: not a tokenizer.json the tokenizers library reads "
                        f"({reason}); give the model's tokenizer.json") from e


def make_windows(documents: Sequence[str], tokenizer: Any, *, length: int, seed: int = 0,
                 fractions: tuple[float, float, float] = (0.2, 0.3, 0.5),
                 max_windows: tuple[int | None, int | None, int | None] = (None, None, None),
                 context: int | None = None) -> TextWindows:
    """Tokenize ``documents`` and cut them into windows of ``length`` tokens per split (at most
    ``max_windows`` each, the first ones). DataError for a length beyond the model's
    ``context``, fractions that do not sum to 1, or a split left without a window."""
    if length < 2:
        raise DataError(f"window length {length} is too short; give at least 2 tokens")
    if context is not None and length > context:
        raise DataError(f"windows of {length} tokens are longer than the model's context of "
                        f"{context}; give a window length of at most {context}")
    if min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-9:
        raise DataError(f"split fractions {fractions} must be positive and sum to 1")
    encoded = tokenizer.encode_batch(list(documents), add_special_tokens=False)
    tokens = [np.asarray(e.ids, np.int64) for e in encoded]
    order = np.random.default_rng(seed).permutation(len(tokens))
    sizes = np.array([len(tokens[i]) for i in order], np.float64)
    middle = (np.cumsum(sizes) - sizes / 2) / max(sizes.sum(), 1)
    which = np.searchsorted(np.cumsum(fractions)[:-1], middle, side="right")
    separator = _separator(tokenizer)
    splits = []
    for k, name in enumerate(SPLITS):
        docs = [tokens[i] for i, w in zip(order, which, strict=True) if w == k]
        splits.append(_cut(docs, separator, length, max_windows[k], name))
    counts = tuple(int((which == k).sum()) for k in range(3))
    return TextWindows(calibration=splits[0], search=splits[1], heldout=splits[2],
                       length=length, documents=(counts[0], counts[1], counts[2]), seed=seed)


def _cut(docs: list[np.ndarray], separator: int | None, length: int, limit: int | None,
         name: str) -> np.ndarray:
    parts: list[np.ndarray] = []
    for doc in docs:
        if parts and separator is not None:
            parts.append(np.array([separator], np.int64))
        parts.append(doc)
    stream = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    count = len(stream) // length if limit is None else min(limit, len(stream) // length)
    if count == 0:
        raise DataError(f"the {name} split has {len(stream)} tokens, less than one window of "
                        f"{length}; give more text or shorter windows")
    return np.ascontiguousarray(stream[: count * length].reshape(count, length))


def _separator(tokenizer: Any) -> int | None:
    for text in _SEPARATORS:
        index = tokenizer.token_to_id(text)
        if index is not None:
            return int(index)
    return None


def _read(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}); re-encode it as UTF-8 "
                        "(e.g. iconv -t UTF-8)") from e


def _json(text: str, path: Path, line: int) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        where = f"line {line}" if path.suffix == ".jsonl" else f"line {e.lineno}"
        raise DataError(f"{path}: {where} is not valid JSON ({e.msg}); fix the file") from e


def _record(record: Any, field: str, path: Path) -> str:
    if isinstance(record, str):
        return record
    if isinstance(record, dict) and isinstance(record.get(field), str):
        return str(record[field])
    raise DataError(f"{path}: a record without a string '{field}' field; give records with "
                    f"'{field}' or name the field that holds the text")
