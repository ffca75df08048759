"""The one capped reader (mpsearch._io): size caps counted while reading, no link and regular
files only inside a run directory, JSON bounded in memory and depth, non-finite numbers named
by their field."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from mpsearch._io import JSON_DEPTH, load_json, parse_json, read_bytes, read_text
from mpsearch.calibration import load_table
from mpsearch.errors import CalibrationError, SearchError
from mpsearch.rundir import MeasurementCache, RunDir


def test_an_endless_device_stops_at_the_cap() -> None:
    with pytest.raises(SearchError, match=r"^/dev/zero: the file is larger than mpsearch reads "
                                          r"\(it reads on past the limit, limit 1 MiB\); x$"):
        read_bytes("/dev/zero", SearchError, limit=1 << 20, fix="x")


def test_a_large_file_is_refused_by_its_size(tmp_path: Path) -> None:
    path = tmp_path / "big"
    with path.open("wb") as f:
        f.truncate(8 << 30)
    with pytest.raises(SearchError, match=r"big: the file is larger than mpsearch reads "
                                          r"\(8.19e\+03 MiB, limit 256 MiB\)"):
        read_bytes(path, SearchError)


def test_run_directory_reads_follow_no_link_and_take_regular_files(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert load_json(link, SearchError) == {}  # a user's own input may be a link
    with pytest.raises(SearchError, match="link.json: is a symbolic link"):
        load_json(link, SearchError, links=False)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(SearchError, match="fifo: is not a regular file"):
        read_bytes(fifo, SearchError, links=False)
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "missing", SearchError)


def test_text_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(b"a: 1\nb: \xff\n")
    with pytest.raises(SearchError, match=r"x.yaml:2: byte 0xff is not UTF-8"):
        read_text(path, SearchError)


@pytest.mark.parametrize(("text", "message"), [
    (b"[" * 100_000 + b"]" * 100_000, f"nest deeper than {JSON_DEPTH} levels"),
    (b"[" * 70 + b"]" * 70, f"nest deeper than {JSON_DEPTH} levels"),
    (b'{"a": {"b": [1, NaN]}}', r"field 'a.b\[1\]' is nan"),
    (b'{"x": -Infinity}', "field 'x' is -inf"),
    (b'{"x": 1e999}', "field 'x' is inf"),
    (b"[" + b"[]," * 2_000_000 + b"[]]",
     r"6 MiB of JSON holding up to 4000003 values would take about 399 MiB to load"),
    (b'{"a": ', "not valid JSON"),
])
def test_hostile_json_is_refused_naming_the_problem(text: bytes, message: str) -> None:
    with pytest.raises(SearchError, match=message):
        parse_json(text, "f.json", SearchError)


def test_json_at_the_depth_limit_loads() -> None:
    text = b"[" * JSON_DEPTH + b"]" * JSON_DEPTH
    assert parse_json(text, "f.json", SearchError) is not None
    assert parse_json(b'{"x": [1.5, null, {"y": 2}]}', "f", SearchError) == {
        "x": [1.5, None, {"y": 2}]}


def _table(tmp_path: Path) -> Path:
    from mpsearch.calibration import CalibrationTable, TensorStats

    hist = np.arange(8, dtype=np.int64)
    stats = TensorStats(name="t", count=8, min=0.0, max=1.0, mean=0.5, std=0.1, hist=hist,
                        hist_lo=0.0, hist_hi=1.0)
    table = CalibrationTable(model_fingerprint="m", data_fingerprint="d", method="minmax",
                             samples=8, bins=8, percentile=99.9, tensors={"t": stats})
    table.save(tmp_path)
    return tmp_path


def test_a_calibration_table_with_nan_ranges_is_refused(tmp_path: Path) -> None:
    folder = _table(tmp_path)
    assert load_table(folder).tensors["t"].max == 1.0
    meta = json.loads((folder / "calibration.json").read_text())
    meta["tensors"]["t"]["max"] = math.nan
    (folder / "calibration.json").write_text(json.dumps(meta))
    with pytest.raises(CalibrationError, match=r"calibration.json: field 'tensors.t.max' is "
                                               r"nan, .*; delete it and recalibrate$"):
        load_table(folder)


def test_a_calibration_npz_link_is_refused(tmp_path: Path) -> None:
    folder = _table(tmp_path)
    npz = folder / "calibration.npz"
    npz.unlink()
    npz.symlink_to("/dev/zero")
    with pytest.raises(CalibrationError, match="calibration.npz: is a link or not a regular"):
        load_table(folder)


def test_a_damaged_measurement_cache_is_empty_and_rewritten(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    run = RunDir(tmp_path).create()
    run.measurements.parent.mkdir()
    run.measurements.write_bytes(b'{"splits": {"search": NaN}}')
    cache = MeasurementCache(run.measurements, "search", {"k": 1})
    assert dict(cache) == {} and "field 'splits.search' is nan" in caplog.text
    cache["a"] = {"seconds": 1.0}
    cache.flush()
    assert json.loads(run.measurements.read_text())["splits"]["search"]["entries"] == {
        "a": {"seconds": 1.0}}
