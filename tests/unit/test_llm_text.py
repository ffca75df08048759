"""Text corpora -> token windows split by document (mpsearch/llm/_text.py), with a word-level
tokenizer built here so every window can be checked by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpsearch.errors import DataError, MpsearchError
from mpsearch.llm import load_documents, load_tokenizer, make_windows

tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed (llm extra)")

WORDS = ["<|endoftext|>", "a", "b", "c", "d", "e", "f", "g", "h"]


@pytest.fixture
def tokenizer(tmp_path: Path) -> Any:
    """Word-level: "a" -> 1 ... "h" -> 8, end of text 0; written and read back as a file."""
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(WORDS)}, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    return load_tokenizer(tmp_path / "tokenizer.json")


def test_text_file_paragraphs_are_documents(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("a b\nc\n\n\n d e \n\nf\n", encoding="utf-8")
    assert load_documents(tmp_path / "c.txt") == ("a b\nc", "d e", "f")


def test_folder_json_and_jsonl(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "2.txt").write_text("c d", encoding="utf-8")
    (folder / "1.txt").write_text("a b\n\nx", encoding="utf-8")
    (folder / ".hidden").write_text("h", encoding="utf-8")
    assert load_documents(folder) == ("a b\n\nx", "c d")
    (tmp_path / "d.json").write_text(json.dumps({"k": {"extract": "a"}, "j": {"extract": "b"}}))
    assert load_documents(tmp_path / "d.json", text_field="extract") == ("a", "b")
    (tmp_path / "e.json").write_text(json.dumps(["a b", "", "c"]))
    assert load_documents(tmp_path / "e.json") == ("a b", "c")
    (tmp_path / "f.jsonl").write_text('{"text": "a"}\n\n{"text": "b c"}\n')
    assert load_documents(tmp_path / "f.jsonl") == ("a", "b c")


def test_windows_by_hand(tokenizer: Any) -> None:
    """Documents of 4, 4 and 8 tokens; seed 0 orders them (2, 0, 1), so their token midpoints
    are 4/16, 10/16 and 14/16 of the stream: with fractions (0.5, 0.25, 0.25) document 2 goes
    to calibration, 0 to search and 1 to held-out; windows of 3 drop each remainder."""
    assert np.random.default_rng(0).permutation(3).tolist() == [2, 0, 1]
    docs = ["a b c d", "e f g h", "a a b b c c d d"]
    w = make_windows(docs, tokenizer, length=3, seed=0, fractions=(0.5, 0.25, 0.25))
    assert w.calibration.tolist() == [[1, 1, 2], [2, 3, 3]]
    assert w.search.tolist() == [[1, 2, 3]]
    assert w.heldout.tolist() == [[5, 6, 7]]
    assert w.documents == (1, 1, 1)
    assert w.to_dict() == {"length": 3, "seed": 0, "documents": {
        "calibration": 1, "search": 1, "heldout": 1}, "windows": {
        "calibration": 2, "search": 1, "heldout": 1}}



def test_documents_of_a_split_are_joined_by_end_of_text(tokenizer: Any) -> None:
    """Seed 0 orders four documents of 2, 2, 4, 4 tokens (2, 0, 1, 3): midpoints 1/6, 5/12,
    7/12, 5/6; fractions (0.25, 0.5, 0.25) give search documents 0 and 1, joined by id 0."""
    assert np.random.default_rng(0).permutation(4).tolist() == [2, 0, 1, 3]
    docs = ["a b", "c d", "e f g h", "a a a a"]
    w = make_windows(docs, tokenizer, length=2, seed=0, fractions=(0.25, 0.5, 0.25))
    assert w.calibration.tolist() == [[5, 6], [7, 8]]
    assert w.search.tolist() == [[1, 2], [0, 3]]
    assert w.heldout.tolist() == [[1, 1], [1, 1]]


def test_splits_hold_disjoint_documents(tokenizer: Any) -> None:
    """Each document is made of one distinct letter pair, so a window's tokens name its
    documents: no document's tokens appear in two splits; the same seed gives the same split."""
    letters = "abcdefgh"
    docs = [" ".join([letters[i % 8], letters[(i * 3 + 1) % 8]] * 6) for i in range(40)]
    first = make_windows(docs, tokenizer, length=4, seed=3)
    again = make_windows(docs, tokenizer, length=4, seed=3)
    other = make_windows(docs, tokenizer, length=4, seed=4)
    assert np.array_equal(first.heldout, again.heldout)
    assert not np.array_equal(first.heldout, other.heldout)
    assert sum(first.documents) == 40 and min(first.documents) > 0
    assert first.calibration.dtype == np.int64 and first.heldout.shape[1] == 4
    capped = make_windows(docs, tokenizer, length=4, seed=3, max_windows=(1, 2, None))
    assert len(capped.calibration) == 1 and len(capped.search) == 2
    assert np.array_equal(capped.search, first.search[:2])


def test_bad_corpora_exit_2(tmp_path: Path, tokenizer: Any) -> None:
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 a b".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt: not UTF-8 text \(byte 3\); re-encode"):
        load_documents(tmp_path / "latin1.txt")
    (tmp_path / "empty.txt").write_text("\n\n  \n", encoding="utf-8")
    with pytest.raises(DataError, match="empty.txt: the corpus holds no text"):
        load_documents(tmp_path / "empty.txt")
    (tmp_path / "x.jsonl").write_text('{"body": "a"}\n')
    with pytest.raises(DataError, match="a record without a string 'text' field"):
        load_documents(tmp_path / "x.jsonl")
    (tmp_path / "y.json").write_text("{oops")
    with pytest.raises(DataError, match=r"y.json: line 1 is not valid JSON"):
        load_documents(tmp_path / "y.json")
    with pytest.raises(DataError, match="no such file or folder"):
        load_documents(tmp_path / "missing.txt")
    with pytest.raises(DataError, match="windows of 64 tokens are longer than the model's "
                                        "context of 32; give a window length of at most 32"):
        make_windows(["a b"], tokenizer, length=64, context=32)
    with pytest.raises(DataError, match="the heldout split has 0 tokens, less than one window "
                                        "of 3; give more text or shorter windows"):
        make_windows(["a b c d", "e f g h", "a a b b c c d d"], tokenizer, length=3,
                     fractions=(0.7, 0.2, 0.1))
    with pytest.raises(DataError, match="not a tokenizer.json"):
        load_tokenizer(tmp_path / "empty.txt")
    try:
        load_documents(tmp_path / "latin1.txt")
    except MpsearchError as e:  # the CLI prints it as one line and exits 2
        assert "\n" not in str(e)
