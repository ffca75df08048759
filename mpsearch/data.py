"""Calibration and validation data: files, image folders or Python readers -> :class:`Dataset`.

Consumes a data source: an ``.npz`` archive (arrays named after the model's inputs, optional
``labels``), an ``.npy`` file (one input, named after the file's stem until
:meth:`Dataset.for_inputs` binds it to a one-input model), a folder of images
(decoded with Pillow as :class:`ImageOptions` says; sub-folders are classes and give labels) or
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
import warnings
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from mpsearch._data_limits import CORRUPT, LIMITS, Limits, check_npz, first_line, npy_bytes
from mpsearch.errors import DataError

if TYPE_CHECKING:
    from mpsearch.graph import ModelGraph

__all__ = ["LIMITS", "Dataset", "ImageOptions", "Limits", "check_finite", "check_signature",
           "load_data"]

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})
_READER = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
LABELS = "labels"




@dataclass(frozen=True, slots=True, kw_only=True)
class ImageOptions:
    """How image files become an input tensor: resize the shorter side to ``size`` (or to
    exactly (height, width)), center-crop to ``crop``, multiply by ``scale``, subtract ``mean``
    and divide by ``std`` per channel, lay out as ``layout`` and cast to ``dtype``."""

    size: int | tuple[int, int] | None = None
    crop: int | tuple[int, int] | None = None
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    scale: float = 1.0 / 255.0
    layout: str = "NCHW"
    dtype: str = "float32"
    mode: str = "RGB"
    input_name: str = "input"

    def __post_init__(self) -> None:
        if self.layout not in ("NCHW", "NHWC"):
            raise DataError(f"image options: layout '{self.layout}' is not NCHW or NHWC")
        if self.mode not in ("RGB", "L", "RGBA"):
            raise DataError(f"image options: mode '{self.mode}' is not RGB, L or RGBA")
        if any(s == 0 for s in self.std):
            raise DataError(f"image options: std {self.std} contains 0; use 1 to keep a channel")
        try:
            np.dtype(self.dtype)
        except TypeError as e:
            raise DataError(f"image options: dtype '{self.dtype}' is not a numpy dtype") from e
        for key in ("size", "crop"):
            value = getattr(self, key)
            sides = () if value is None else (value,) if isinstance(value, int) else value
            if any(not 1 <= int(v) <= LIMITS.image_side for v in sides):
                raise DataError(f"image options: {key} {value} is outside 1..{LIMITS.image_side}"
                                " pixels; use a smaller size")

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> ImageOptions:
        """Options from a parsed spec section; an unknown key is an error."""
        known = {"size", "crop", "mean", "std", "scale", "layout", "dtype", "mode", "input_name"}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise DataError(f"image options: unknown key(s) {unknown}; valid keys are "
                            f"{sorted(known)}")
        values = dict(spec)
        for key in ("size", "crop"):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        for key in ("mean", "std"):
            if key in values:
                raw = values[key]
                values[key] = tuple(float(v) for v in (raw if isinstance(raw, list | tuple)
                                                       else [raw]))
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "crop": self.crop, "mean": list(self.mean),
                "std": list(self.std), "scale": self.scale, "layout": self.layout,
                "dtype": self.dtype, "mode": self.mode, "input_name": self.input_name}


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
def load_data(source: str | os.PathLike[str], *, images: ImageOptions | None = None) -> Dataset:
    """Load a data source (see the module docstring) into memory."""
    text = os.fspath(source)
    path = Path(text)
    if not path.exists() and _READER.match(text):
        return _from_reader(text)
    if not path.exists():
        raise DataError(f"{text}: no such file or folder; give an .npz/.npy file, an image "
                        "folder or a 'package.module:function' reader")
    if path.is_dir():
        return _from_images(path, images or ImageOptions())
    if path.suffix == ".npz":
        return _from_npz(path)
    if path.suffix == ".npy":
        return Dataset(inputs={path.stem: _load_npy(path)}, source=text)
    raise DataError(f"{text}: unsupported data file '{path.suffix}'; use .npz, .npy, an image "
                    "folder or a 'package.module:function' reader")


def _from_npz(path: Path, limits: Limits = LIMITS) -> Dataset:
    try:
        check_npz(path, limits)
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except CORRUPT as e:
        raise DataError(f"{path}: cannot read the archive ({type(e).__name__}: "
                        f"{first_line(e)}); the file is truncated or not an .npz, re-save it "
                        "with numpy.savez") from e
    labels = arrays.pop(LABELS, None)
    if not arrays:
        raise DataError(f"{path}: the archive holds no input arrays; add one per model input")
    return Dataset(inputs=arrays, labels=labels, source=str(path))


def _load_npy(path: Path, limits: Limits = LIMITS) -> np.ndarray:
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


def _from_reader(spec: str) -> Dataset:
    module_name, _, function_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise DataError(f"{spec}: cannot import module '{module_name}' ({e}); check the "
                        "name and that it is on PYTHONPATH") from e
    function = getattr(module, function_name, None)
    if not callable(function):
        raise DataError(f"{spec}: module '{module_name}' has no function '{function_name}'")
    try:
        produced = function()
        parts = [produced] if isinstance(produced, Mapping) else list(produced)
    except Exception as e:
        raise DataError(f"{spec}: the reader failed ({type(e).__name__}: {e}); fix the "
                        "reader") from e
    return _concatenate(parts, spec)


def _concatenate(parts: Iterable[Any], source: str) -> Dataset:
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
            chunks.setdefault(str(name), []).append(np.asarray(value))
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


def _image_files(folder: Path) -> tuple[list[Path], np.ndarray | None]:
    classes = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if classes:
        files, labels = [], []
        for index, sub in enumerate(classes):
            found = sorted(p for p in sub.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
            files += found
            labels += [index] * len(found)
        return files, np.asarray(labels, dtype=np.int64)
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES), None


def _from_images(folder: Path, options: ImageOptions) -> Dataset:
    files, labels = _image_files(folder)
    if not files:
        raise DataError(f"{folder}: the folder has no images ({', '.join(sorted(IMAGE_SUFFIXES))}"
                        "); point --data at a folder of images or an .npz file")
    arrays = [_decode(path, options) for path in files]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise DataError(f"{folder}: images decode to different shapes {sorted(shapes)[:3]}; set "
                        "'size' and 'crop' in the image options")
    batch = np.stack(arrays)
    logger.info("decoded %d images from %s to %s", len(files), folder, batch.shape)
    return Dataset(inputs={options.input_name: batch}, labels=labels, source=str(folder))


def _pair(value: int | tuple[int, int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _decode(path: Path, options: ImageOptions) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError  # only image folders need Pillow

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as raw:  # reads the header only
                pixels_declared = raw.size[0] * raw.size[1]
                if pixels_declared > LIMITS.image_pixels:
                    raise DataError(
                        f"{path}: the image is {raw.size[0]}x{raw.size[1]} pixels (limit "
                        f"{LIMITS.image_pixels}); a decompression bomb or not a photo, "
                        "resize it first")
                image = raw.convert(options.mode)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise DataError(f"{path}: refused as a decompression bomb ({e}); resize the "
                        "image first") from e
    except (OSError, UnidentifiedImageError, ValueError, zlib.error) as e:
        raise DataError(f"{path}: cannot decode the image ({e}); remove or re-save it") from e
    if options.size is not None:
        if isinstance(options.size, int):
            w, h = image.size
            ratio = options.size / min(w, h)
            target = (max(1, round(w * ratio)), max(1, round(h * ratio)))
        else:
            target = (options.size[1], options.size[0])
        image = image.resize(target, Image.Resampling.BILINEAR)
    if options.crop is not None:
        ch, cw = _pair(options.crop)
        w, h = image.size
        if ch > h or cw > w:
            raise DataError(f"{path}: crop {ch}x{cw} is larger than the {h}x{w} image; lower "
                            "'crop' or raise 'size'")
        left, top = (w - cw) // 2, (h - ch) // 2
        image = image.crop((left, top, left + cw, top + ch))
    pixels = np.asarray(image, dtype=np.float32)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    mean, std = np.asarray(options.mean, np.float32), np.asarray(options.std, np.float32)
    array: np.ndarray = (pixels * np.float32(options.scale) - mean) / std
    if options.layout == "NCHW":
        array = array.transpose(2, 0, 1)
    return np.ascontiguousarray(array.astype(options.dtype))


# ------------------------------------------------------------------ checks
def _format_shape(shape: tuple[Any, ...] | None) -> str:
    if shape is None:
        return "(unknown)"
    dims = ["?" if d is None else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def check_signature(dataset: Dataset, graph: ModelGraph) -> None:
    """Raise :class:`DataError` unless every model input has an array of the right dtype, rank
    and fixed dimensions (the first, sample, axis is batched and not checked)."""
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
