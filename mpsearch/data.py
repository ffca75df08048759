"""Calibration and validation data: files, image folders or Python readers -> :class:`Dataset`.

Consumes a data source: an ``.npz`` archive (arrays named after the model's inputs, optional
``labels``), an ``.npy`` file (one input, named after the file's stem until
:meth:`Dataset.for_inputs` binds it to a one-input model), a folder of images
or a ``.zip`` of images (decoded with Pillow as :class:`ImageOptions` says; sub-folders are
classes and give labels) or
a Python reader ``"package.module:function"`` returning a dict of arrays or yielding one dict per
batch. Produces a frozen :class:`Dataset` that batches, splits (seeded) and fingerprints itself;
:func:`check_signature` checks it against a model's inputs before any work is done.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from mpsearch._data_images import IMAGE_SUFFIXES, ImageOptions, read_image_zip, read_images
from mpsearch._data_limits import CORRUPT, LIMITS, Budget, Limits, first_line, npy_bytes, read_npz
from mpsearch.errors import DataError, ModelError

if TYPE_CHECKING:
    from mpsearch.graph import ModelGraph

__all__ = ["IMAGE_SUFFIXES", "LIMITS", "Dataset", "ImageOptions", "Limits", "check_finite",
           "check_signature", "load_data"]

logger = logging.getLogger(__name__)

_READER = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
LABELS = "labels"




@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Dataset:
    """Named input arrays sharing their first (sample) axis, optional labels, and the source.

    ``batches(n)`` yields input dicts of ``n`` samples (the last one may be shorter) and
    ``label_batches(n)`` the matching label slices. Equality is identity; compare
    :attr:`fingerprint` to compare contents.
    """

    inputs: Mapping[str, np.ndarray]
    labels: np.ndarray | None = None
    source: str = "<arrays>"
    _cache: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.inputs:
            raise DataError(f"{self.source}: no input arrays; provide one array per model input")
        arrays = {}
        for name, value in self.inputs.items():
            array = np.asarray(value)
            if array.ndim == 0:
                raise DataError(f"{self.source}: input '{name}' is a scalar; give an array "
                                "whose first axis is the sample axis")
            arrays[str(name)] = array
        counts = {name: a.shape[0] for name, a in arrays.items()}
        if len(set(counts.values())) > 1:
            raise DataError(f"{self.source}: inputs have different sample counts {counts}; "
                            "every array needs the same first dimension")
        n = next(iter(counts.values()))
        if self.labels is not None and len(self.labels) != n:
            raise DataError(f"{self.source}: {len(self.labels)} labels for {n} samples; "
                            "give one label per sample")
        object.__setattr__(self, "inputs", MappingProxyType(arrays))

    def __len__(self) -> int:
        return int(next(iter(self.inputs.values())).shape[0])

    @property
    def fingerprint(self) -> str:
        """sha256 over the names, dtypes, shapes and bytes of the inputs and labels."""
        if "sha" not in self._cache:
            digest = hashlib.sha256()
            named = sorted(self.inputs.items())
            if self.labels is not None:
                named.append((LABELS, np.asarray(self.labels)))
            for name, array in named:
                digest.update(f"{name}|{array.dtype.str}|{array.shape};".encode())
                digest.update(np.ascontiguousarray(array).data)
            self._cache["sha"] = digest.hexdigest()[:16]
        return self._cache["sha"]

    def batches(self, batch_size: int, *, start: int = 0, stop: int | None = None
                ) -> Iterator[dict[str, np.ndarray]]:
        """Input dicts of ``batch_size`` samples each (views, not copies), of the samples
        ``start`` to ``stop`` (all by default)."""
        size = _positive(batch_size, "batch size")
        end = len(self) if stop is None else min(stop, len(self))
        for first in range(start, end, size):
            yield {name: a[first:min(first + size, end)] for name, a in self.inputs.items()}

    def label_batches(self, batch_size: int) -> Iterator[np.ndarray]:
        """Label slices matching :meth:`batches`."""
        if self.labels is None:
            raise DataError(f"{self.source}: the data has no labels; add a 'labels' array")
        size = _positive(batch_size, "batch size")
        for start in range(0, len(self), size):
            yield self.labels[start:start + size]

    def for_inputs(self, names: Sequence[str]) -> Dataset:
        """This data with its one array named after the model's one input (an ``.npy`` file is
        named after its stem); unchanged otherwise, for :func:`check_signature` to judge."""
        if len(names) != 1 or len(self.inputs) != 1 or names[0] in self.inputs:
            return self
        (array,) = self.inputs.values()
        return Dataset(inputs={names[0]: array}, labels=self.labels, source=self.source)

    def take(self, n: int) -> Dataset:
        """The first ``n`` samples."""
        return self._select(slice(0, max(0, int(n))), f"{self.source}[:{n}]")

    def split(self, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
        """Seeded random split: (``fraction`` of the samples, the rest), each in file order."""
        if not 0.0 < fraction < 1.0:
            raise DataError(f"{self.source}: split fraction {fraction} is not in (0, 1)")
        n = len(self)
        count = min(n - 1, max(1, int(round(fraction * n))))
        if n < 2:
            raise DataError(f"{self.source}: {n} sample(s) cannot be split; need at least 2")
        order = np.random.default_rng(seed).permutation(n)
        first, second = np.sort(order[:count]), np.sort(order[count:])
        return (self._select(first, f"{self.source}[split {fraction:g} seed {seed}]"),
                self._select(second, f"{self.source}[rest of split {fraction:g} seed {seed}]"))

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary: source, samples, input shapes and dtypes, fingerprint."""
        return {"source": self.source, "samples": len(self),
                "inputs": {n: {"shape": list(a.shape), "dtype": a.dtype.name}
                           for n, a in self.inputs.items()},
                "labels": self.labels is not None, "fingerprint": self.fingerprint}

    def _select(self, index: slice | np.ndarray, source: str) -> Dataset:
        labels = None if self.labels is None else self.labels[index]
        return Dataset(inputs={n: a[index] for n, a in self.inputs.items()}, labels=labels,
                       source=source)


def _positive(value: int, what: str) -> int:
    if int(value) < 1:
        raise DataError(f"{what} {value} must be at least 1")
    return int(value)


# ------------------------------------------------------------------ loading
def load_data(source: str | os.PathLike[str], *, images: ImageOptions | None = None,
              limits: Limits = LIMITS) -> Dataset:
    """Load a data source (see the module docstring) into memory, within the memory budget
    ``limits.data_bytes`` counted on what is decoded."""
    text = os.fspath(source)
    path = Path(text)
    if not path.exists() and _READER.match(text):
        return _from_reader(text, limits)
    if not path.exists():
        raise DataError(f"{text}: no such file or folder; give an .npz/.npy file, an image "
                        "folder or a 'package.module:function' reader")
    if path.is_dir():
        return _from_images(path, images or ImageOptions(), limits)
    if path.suffix == ".npz":
        return _from_npz(path, limits)
    if path.suffix.lower() == ".zip":
        return _from_images(path, images or ImageOptions(), limits)
    if path.suffix == ".npy":
        return Dataset(inputs={path.stem: _load_npy(path, limits)}, source=text)
    raise DataError(f"{text}: unsupported data file '{path.suffix}'; use .npz, .npy, an image "
                    "folder or .zip, or a 'package.module:function' reader")


def _from_npz(path: Path, limits: Limits) -> Dataset:
    try:
        arrays = read_npz(path, limits)
    except CORRUPT as e:
        raise DataError(f"{path}: cannot read the archive ({type(e).__name__}: "
                        f"{first_line(e)}); the file is truncated or not an .npz, re-save it "
                        "with numpy.savez") from e
    labels = arrays.pop(LABELS, None)
    if not arrays:
        raise DataError(f"{path}: the archive holds no input arrays; add one per model input")
    return Dataset(inputs=arrays, labels=labels, source=str(path))


def _load_npy(path: Path, limits: Limits) -> np.ndarray:
    try:
        with open(path, "rb") as stream:
            declared = npy_bytes(stream)
        if declared > min(limits.data_bytes, path.stat().st_size):
            raise DataError(f"{path}: the header declares {declared} bytes but the file holds "
                            f"{path.stat().st_size} (limit {limits.data_bytes}); the file is "
                            "truncated or too large, re-save it with numpy.save")
        return np.asarray(np.load(path, allow_pickle=False))
    except CORRUPT as e:
        raise DataError(f"{path}: cannot read the array ({type(e).__name__}: "
                        f"{first_line(e)}); re-save it with numpy.save") from e


def _from_reader(spec: str, limits: Limits) -> Dataset:
    module_name, _, function_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise DataError(f"{spec}: cannot import module '{module_name}' ({e}); check the "
                        "name and that it is on PYTHONPATH") from e
    function = getattr(module, function_name, None)
    if not callable(function):
        raise DataError(f"{spec}: module '{module_name}' has no function '{function_name}'")
    return _concatenate(_produced(function, spec), spec, Budget(spec, limits))


def _produced(function: Any, spec: str) -> Iterator[Any]:
    """What the reader returns or yields, one item at a time (its failures as DataError)."""
    try:
        produced = function()
        if isinstance(produced, Mapping):
            yield produced
            return
        iterator = iter(produced)
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                return
            yield item
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"{spec}: the reader failed ({type(e).__name__}: {e}); fix the "
                        "reader") from e


def _concatenate(parts: Iterable[Any], source: str, budget: Budget) -> Dataset:
    chunks: dict[str, list[np.ndarray]] = {}
    names: list[str] | None = None
    count = 0
    for index, part in enumerate(parts):
        if not isinstance(part, Mapping):
            raise DataError(f"{source}: item {index} is a {type(part).__name__}, not a dict of "
                            "arrays; yield {input_name: array}")
        keys = sorted(str(k) for k in part)
        if names is not None and keys != names:
            raise DataError(f"{source}: item {index} has keys {keys} but item 0 had {names}; "
                            "yield the same inputs every time")
        names = keys
        for name, value in part.items():
            array = np.asarray(value)
            budget.take(2 * array.nbytes, f"item {index}")  # kept, then concatenated
            chunks.setdefault(str(name), []).append(array)
        count += 1
    if count == 0:
        raise DataError(f"{source}: the reader produced no data; yield at least one batch")
    try:
        arrays = {name: np.concatenate(parts_, axis=0) for name, parts_ in chunks.items()}
    except ValueError as e:
        raise DataError(f"{source}: batches do not stack ({e}); keep every shape but the "
                        "first axis the same") from e
    labels = arrays.pop(LABELS, None)
    return Dataset(inputs=arrays, labels=labels, source=source)


def _from_images(folder: Path, options: ImageOptions, limits: Limits) -> Dataset:
    read = read_image_zip if folder.is_file() else read_images
    try:
        batch, labels, count = read(folder, options, limits)
    except CORRUPT as e:  # a damaged zip of images
        raise DataError(f"{folder}: cannot read the zip of images ({type(e).__name__}: "
                        f"{first_line(e)}); upload a .zip of images") from e
    if count == 0:
        raise DataError(f"{folder}: the folder has no images ({', '.join(sorted(IMAGE_SUFFIXES))}"
                        "); point --data at a folder of images or an .npz file")
    logger.info("decoded %d images from %s to %s", count, folder, batch.shape)
    return Dataset(inputs={options.input_name: batch}, labels=labels, source=str(folder))


# ------------------------------------------------------------------ checks
def _format_shape(shape: tuple[Any, ...] | None) -> str:
    if shape is None:
        return "(unknown)"
    dims = ["?" if d is None else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def check_signature(dataset: Dataset, graph: ModelGraph) -> None:
    """Raise :class:`DataError` unless every model input has an array of the right dtype, rank
    and fixed dimensions (the first, sample, axis is batched and not checked), and
    :class:`ModelError` for a quantizable node's empty weight, which no build can quantize."""
    _check_model(graph)
    provided = dict(dataset.inputs)
    for info in graph.inputs:
        if info.name not in provided:
            raise DataError(f"{dataset.source}: no array for model input '{info.name}' "
                            f"{_format_shape(info.shape)}; the data provides {sorted(provided)}; "
                            "name the arrays after the model's inputs")
        array = provided.pop(info.name)
        expected = _format_shape(info.shape)
        if array.dtype != info.dtype:
            raise DataError(f"{dataset.source}: input '{info.name}' has dtype {array.dtype} but "
                            f"the model expects {np.dtype(info.dtype).name} {expected}; convert "
                            f"it with .astype('{np.dtype(info.dtype).name}')")
        if info.shape is None:
            continue
        wrong_rank = array.ndim != len(info.shape)
        wrong_dim = not wrong_rank and any(
            isinstance(d, int) and d != s for d, s in zip(info.shape[1:], array.shape[1:],
                                                          strict=True))
        if wrong_rank or wrong_dim:
            raise DataError(f"{dataset.source}: input '{info.name}' has shape "
                            f"{_format_shape(array.shape)} but the model expects {expected}; "
                            "fix the data or pick the right model")
    if provided:
        logger.warning("%s: ignoring array(s) %s that are not model inputs", dataset.source,
                       sorted(provided))


def _check_model(graph: ModelGraph) -> None:
    label = graph.path or graph.name
    for node in graph.quantizable_nodes():
        stored = (*node.weights, *([node.bias] if node.bias else []), *node.activation_inputs)
        for name in stored:
            array = graph.initializers.get(name)
            if array is not None and array.size == 0:
                raise ModelError(f"{label}: initializer '{name}' of {node.op_type} node "
                                 f"'{node.name}' holds no values (shape {list(array.shape)}); "
                                 "remove the node or re-export the model with its weights")


def check_finite(feeds: Mapping[str, np.ndarray], *, source: str, batch: int,
                 batch_size: int, first: int | None = None) -> None:
    """Raise :class:`DataError` naming the input, batch and first sample holding NaN or Inf
    (``first``: the batch's first sample, when batches are not all ``batch_size`` long)."""
    for name, array in feeds.items():
        if array.dtype.kind != "f":
            continue
        finite = np.isfinite(array)
        if not finite.all():
            bad = np.argwhere(~finite)[0]
            kind = "NaN" if np.isnan(array[tuple(bad)]) else "Inf"
            sample = (batch * batch_size if first is None else first) + int(bad[0])
            raise DataError(f"{source}: input '{name}' holds {kind} in batch {batch} (sample "
                            f"{sample}); clean or drop that sample")
