"""Data sources, batching, seeded splits, fingerprints and the checks against a model."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper
from PIL import Image

from mpsearch.data import Dataset, ImageOptions, check_finite, check_signature, load_data
from mpsearch.errors import DataError
from mpsearch.graph import ModelGraph, load_model


def _model(shape: list[int | str], elem: int = TensorProto.FLOAT) -> ModelGraph:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["input"], ["out"])], "g",
        [helper.make_tensor_value_info("input", elem, shape)],
        [helper.make_tensor_value_info("out", elem, shape)])
    return load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


@pytest.fixture
def npz(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "data.npz"
    np.savez(path, input=rng.standard_normal((10, 1, 4, 4)).astype(np.float32),
             labels=np.arange(10) % 3)
    return path


def test_npz_with_labels_batches_and_take(npz: Path) -> None:
    data = load_data(npz)
    assert len(data) == 10 and list(data.inputs) == ["input"] and data.source == str(npz)
    assert data.labels is not None and list(data.labels[:4]) == [0, 1, 2, 0]
    sizes = [b["input"].shape[0] for b in data.batches(4)]
    assert sizes == [4, 4, 2]
    assert [len(b) for b in data.label_batches(4)] == [4, 4, 2]
    first = next(data.batches(4))["input"]
    assert np.shares_memory(first, data.inputs["input"])  # views, not copies
    assert len(data.take(3)) == 3 and len(data.take(99)) == 10
    with pytest.raises(DataError, match="batch size 0"):
        next(data.batches(0))


def test_split_is_seeded_disjoint_and_complete(npz: Path) -> None:
    data = load_data(npz)
    a, b = data.split(0.3, seed=1)
    a2, _ = data.split(0.3, seed=1)
    a3, _ = data.split(0.3, seed=2)
    assert len(a) == 3 and len(b) == 7
    np.testing.assert_array_equal(a.inputs["input"], a2.inputs["input"])
    assert not np.array_equal(a.inputs["input"], a3.inputs["input"])
    rows = {x.tobytes() for x in np.concatenate([a.inputs["input"], b.inputs["input"]])}
    assert rows == {x.tobytes() for x in data.inputs["input"]}
    assert sorted(np.concatenate([a.labels, b.labels]).tolist()) == sorted(data.labels.tolist())
    for bad in (0.0, 1.0):
        with pytest.raises(DataError, match="fraction"):
            data.split(bad, seed=0)


def test_fingerprint_is_stable_and_content_sensitive(npz: Path) -> None:
    data = load_data(npz)
    assert data.fingerprint == load_data(npz).fingerprint
    assert len(data.fingerprint) == 16
    changed = dict(data.inputs)
    changed["input"] = changed["input"].copy()
    changed["input"][0, 0, 0, 0] += 1
    assert Dataset(inputs=changed, labels=data.labels).fingerprint != data.fingerprint
    assert Dataset(inputs=data.inputs).fingerprint != data.fingerprint  # labels count too
    assert data.describe()["inputs"]["input"] == {"shape": [10, 1, 4, 4], "dtype": "float32"}


def test_npy_is_named_after_its_stem(tmp_path: Path) -> None:
    np.save(tmp_path / "input.npy", np.zeros((3, 2), np.float32))
    data = load_data(tmp_path / "input.npy")
    assert list(data.inputs) == ["input"] and len(data) == 3 and data.labels is None


def test_one_array_binds_to_a_one_input_model(tmp_path: Path) -> None:
    array = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.save(tmp_path / "photos.npy", array)
    data = load_data(tmp_path / "photos.npy")
    bound = data.for_inputs(["pixel_values"])
    assert list(bound.inputs) == ["pixel_values"] and bound.source == data.source
    np.testing.assert_array_equal(bound.inputs["pixel_values"], array)
    assert data.for_inputs(["photos"]) is data  # already named right
    assert data.for_inputs(["a", "b"]) is data  # two inputs: check_signature names the gap


def test_bad_files_and_arrays_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_data(tmp_path / "missing.npz")
    (tmp_path / "data.csv").write_text("1,2")
    with pytest.raises(DataError, match="unsupported data file '.csv'"):
        load_data(tmp_path / "data.csv")
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="cannot read"):
        load_data(tmp_path / "broken.npz")
    np.savez(tmp_path / "only_labels.npz", labels=np.arange(3))
    with pytest.raises(DataError, match="no input arrays"):
        load_data(tmp_path / "only_labels.npz")
    with pytest.raises(DataError, match="different sample counts"):
        Dataset(inputs={"a": np.zeros((3, 2)), "b": np.zeros((4, 2))})
    with pytest.raises(DataError, match="2 labels for 3 samples"):
        Dataset(inputs={"a": np.zeros((3, 2))}, labels=np.arange(2))


# ------------------------------------------------------------------ python readers
def test_reader_yielding_batches_is_materialized(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_reader.py").write_text(
        "import numpy as np\n"
        "def batches():\n"
        "    for i in range(3):\n"
        "        yield {'input': np.full((2, 4), i, np.float32), 'labels': np.array([i, i])}\n"
        "def whole():\n"
        "    return {'input': np.ones((5, 4), np.float32)}\n"
        "def broken():\n"
        "    raise RuntimeError('disk on fire')\n"
        "def ragged():\n"
        "    yield {'input': np.ones((1, 4))}\n"
        "    yield {'other': np.ones((1, 4))}\n"
        "def nothing():\n"
        "    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = load_data("my_reader:batches")
    assert len(data) == 6 and data.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert data.inputs["input"][4, 0] == 2 and data.source == "my_reader:batches"
    assert len(load_data("my_reader:whole")) == 5
    for spec, message in [("my_reader:broken", "reader failed.*disk on fire"),
                          ("my_reader:ragged", "item 1 has keys"),
                          ("my_reader:nothing", "produced no data"),
                          ("my_reader:absent", "has no function 'absent'"),
                          ("no_such_module_xyz:f", "cannot import module")]:
        with pytest.raises(DataError, match=message):
            load_data(spec)
    sys.modules.pop("my_reader", None)


# ------------------------------------------------------------------ image folders
def _image(path: Path, size: tuple[int, int], color: tuple[int, int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


def test_image_folder_with_classes_and_preprocessing(tmp_path: Path) -> None:
    _image(tmp_path / "cat" / "a.png", (40, 30), (255, 0, 0))
    _image(tmp_path / "cat" / "b.jpg", (30, 40), (255, 0, 0))
    _image(tmp_path / "dog" / "c.png", (50, 50), (0, 0, 255))
    options = ImageOptions(size=24, crop=20, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    data = load_data(tmp_path, images=options)
    x = data.inputs["input"]
    assert x.shape == (3, 3, 20, 20) and x.dtype == np.float32
    assert data.labels.tolist() == [0, 0, 1]
    np.testing.assert_allclose(x[2, :, 10, 10], [-1.0, -1.0, 1.0], atol=1e-6)
    nhwc = load_data(tmp_path, images=ImageOptions(size=(16, 12), layout="NHWC", mode="L",
                                                   dtype="float16", input_name="pixels"))
    assert nhwc.inputs["pixels"].shape == (3, 16, 12, 1)
    assert nhwc.inputs["pixels"].dtype == np.float16


def test_image_folder_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no images"):
        load_data(tmp_path / "empty")
    _image(tmp_path / "mixed" / "a.png", (10, 10), (0, 0, 0))
    _image(tmp_path / "mixed" / "b.png", (12, 10), (0, 0, 0))
    with pytest.raises(DataError, match="different shapes.*'size' and 'crop'"):
        load_data(tmp_path / "mixed")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.png").write_bytes(b"garbage")
    with pytest.raises(DataError, match="cannot decode"):
        load_data(tmp_path / "bad")
    with pytest.raises(DataError, match="crop 20x20 is larger"):
        load_data(tmp_path / "mixed", images=ImageOptions(crop=20))


def test_image_options_from_dict_is_strict_and_round_trips() -> None:
    options = ImageOptions.from_dict({"size": 256, "crop": [224, 224], "mean": [0.4, 0.5, 0.6],
                                      "std": 0.25, "layout": "NHWC"})
    assert options.crop == (224, 224) and options.std == (0.25,)
    assert ImageOptions.from_dict(options.to_dict()) == options
    with pytest.raises(DataError, match="unknown key.*'sizes'"):
        ImageOptions.from_dict({"sizes": 3})
    with pytest.raises(DataError, match="layout 'CHW'"):
        ImageOptions(layout="CHW")


# ------------------------------------------------------------------ checks
def test_check_signature_accepts_matching_data(caplog: pytest.LogCaptureFixture) -> None:
    graph = _model(["batch", 1, 4, 4])
    data = Dataset(inputs={"input": np.zeros((5, 1, 4, 4), np.float32),
                           "extra": np.zeros((5, 2))}, source="d.npz")
    with caplog.at_level(logging.WARNING):
        check_signature(data, graph)
    assert "extra" in caplog.text


@pytest.mark.parametrize(("array", "message"), [
    (np.zeros((10, 3, 32, 32), np.float32),
     r"d.npz: input 'input' has shape \(10, 3, 32, 32\) but the model expects "
     r"\(batch, 1, 4, 4\); fix the data or pick the right model"),
    (np.zeros((10, 16), np.float32), r"shape \(10, 16\) but the model expects \(batch, 1, 4, 4\)"),
    (np.zeros((10, 1, 4, 4), np.float64),
     r"input 'input' has dtype float64 but the model expects float32 \(batch, 1, 4, 4\)"),
])
def test_check_signature_errors_name_input_and_expected_shape(array: np.ndarray,
                                                              message: str) -> None:
    with pytest.raises(DataError, match=message) as info:
        check_signature(Dataset(inputs={"input": array}, source="d.npz"),
                        _model(["batch", 1, 4, 4]))
    assert "\n" not in str(info.value)


def test_check_signature_missing_input_lists_what_the_data_has() -> None:
    data = Dataset(inputs={"x": np.zeros((2, 1, 4, 4), np.float32)}, source="d.npz")
    with pytest.raises(DataError, match=r"no array for model input 'input'.*\['x'\]"):
        check_signature(data, _model(["batch", 1, 4, 4]))


def test_check_finite_names_input_batch_and_sample() -> None:
    x = np.zeros((4, 3), np.float32)
    check_finite({"input": x}, source="d.npz", batch=0, batch_size=4)
    x[2, 1] = np.nan
    with pytest.raises(DataError, match="d.npz: input 'input' holds NaN in batch 3 "
                                        r"\(sample 14\)"):
        check_finite({"input": x}, source="d.npz", batch=3, batch_size=4)
    x[2, 1] = np.inf
    with pytest.raises(DataError, match="holds Inf"):
        check_finite({"input": x}, source="d.npz", batch=0, batch_size=4)
    check_finite({"ids": np.zeros(3, np.int64)}, source="d.npz", batch=0, batch_size=4)
