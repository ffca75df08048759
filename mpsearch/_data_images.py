"""Image folders -> one input array, within the data memory budget.

Consumes a folder of images (sub-folders are classes and give labels) and
:class:`ImageOptions`; produces the batch array and the labels. Every image's size is read from
its header first (Pillow decodes nothing on open), so the pixels times the images are checked
against :class:`~mpsearch._data_limits.Limits` before one image is decoded, and the images are
then decoded one at a time straight into the preallocated batch. A class folder that is a
symlink back into the tree, or two paths to one file, are refused, not loaded twice.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from mpsearch._data_limits import LIMITS, Budget, Limits, unzip
from mpsearch.errors import DataError

__all__ = ["IMAGE_SUFFIXES", "ImageOptions", "read_image_zip", "read_images"]

IMAGE_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})
_CHANNELS = {"RGB": 3, "L": 1, "RGBA": 4}
_SAFE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._+-]{0,120}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageOptions:
    """How image files become an input tensor: resize the shorter side to ``size`` (or to
    exactly (height, width)), center-crop to ``crop``, multiply by ``scale``, subtract ``mean``
    and divide by ``std`` per channel, lay out as ``layout`` and cast to ``dtype`` (a numeric
    type of at most 8 bytes)."""

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
        if self.mode not in _CHANNELS:
            raise DataError(f"image options: mode '{self.mode}' is not RGB, L or RGBA")
        try:
            finite = all(math.isfinite(float(v)) for v in (self.scale, *self.mean, *self.std))
        except (TypeError, ValueError):
            finite = False
        if not finite:
            raise DataError(f"image options: scale, mean and std must be finite numbers, got "
                            f"scale {self.scale}, mean {self.mean}, std {self.std}")
        if any(s == 0 for s in self.std):
            raise DataError(f"image options: std {self.std} contains 0; use 1 to keep a channel")
        for key in ("mean", "std"):
            if len(getattr(self, key)) not in (1, _CHANNELS[self.mode]):
                raise DataError(f"image options: {key} has {len(getattr(self, key))} values; "
                                f"give 1 or {_CHANNELS[self.mode]} (one per {self.mode} channel)")
        try:
            kind, itemsize = np.dtype(self.dtype).kind, np.dtype(self.dtype).itemsize
        except (TypeError, ValueError) as e:
            raise DataError(f"image options: dtype '{str(self.dtype)[:40]}' is not a numpy "
                            "dtype; use float32, float16, uint8 or int8") from e
        if kind not in "fiu" or itemsize > 8:
            raise DataError(f"image options: dtype '{str(self.dtype)[:40]}' is not a number "
                            "type; use float32, float16, uint8 or int8")
        for key in ("size", "crop"):
            value = getattr(self, key)
            sides = () if value is None else (value,) if isinstance(value, int) else value
            if not isinstance(value, int | None) and len(sides) != 2:
                raise DataError(f"image options: {key} {value} needs one side or two "
                                "(height, width)")
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


def _walk(folder: Path, seen: dict[str, Path]) -> list[Path]:
    """Image files under ``folder`` (symlinks followed), refusing a folder or file reached
    twice: a link back into the tree would load the same images again under another name."""
    found: list[Path] = []
    for current, dirs, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(current)
        if real in seen:
            raise DataError(f"{current}: the same folder as {seen[real]} (a symlink loop or "
                            "duplicate); remove the link so each image is read once")
        seen[real] = Path(current)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(current) / name
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            real = os.path.realpath(path)
            if real in seen:
                raise DataError(f"{path}: the same file as {seen[real]} (a symlink or "
                                "duplicate); remove the link so each image is read once")
            seen[real] = path
            found.append(path)
    return found


def image_files(folder: Path) -> tuple[list[Path], np.ndarray | None]:
    """The images of ``folder`` in order, and the class labels when it has class folders."""
    classes = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    seen: dict[str, Path] = {}
    if classes:
        seen[os.path.realpath(folder)] = folder
        files: list[Path] = []
        labels: list[int] = []
        for index, sub in enumerate(classes):
            found = sorted(_walk(sub, seen))
            files += found
            labels += [index] * len(found)
        return files, np.asarray(labels, dtype=np.int64)
    return sorted(_walk(folder, seen)), None


def _target(size: tuple[int, int], options: ImageOptions) -> tuple[int, int]:
    """(width, height) after ``size``, before ``crop``."""
    w, h = size
    if options.size is None:
        return w, h
    if isinstance(options.size, int):
        ratio = options.size / min(w, h)
        return max(1, round(w * ratio)), max(1, round(h * ratio))
    return options.size[1], options.size[0]


def _final(path: Path, size: tuple[int, int], options: ImageOptions) -> tuple[int, int]:
    """(height, width) of the decoded image."""
    w, h = _target(size, options)
    if options.crop is None:
        return h, w
    ch, cw = (options.crop, options.crop) if isinstance(options.crop, int) else options.crop
    if ch > h or cw > w:
        raise DataError(f"{path}: crop {ch}x{cw} is larger than the {h}x{w} image; lower "
                        "'crop' or raise 'size'")
    return ch, cw


def _header(path: Path, limits: Limits) -> tuple[int, int]:
    """(width, height) from the file's header; nothing is decoded."""
    from PIL import Image, UnidentifiedImageError  # only image folders need Pillow

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as raw:
                w, h = raw.size
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise DataError(f"{path}: refused as a decompression bomb ({e}); resize the "
                        "image first") from e
    except (OSError, UnidentifiedImageError, ValueError, zlib.error) as e:
        raise DataError(f"{path}: cannot decode the image ({e}); remove or re-save it") from e
    if w * h > limits.image_pixels:
        raise DataError(f"{path}: the image is {w}x{h} pixels (limit {limits.image_pixels}); a "
                        "decompression bomb or not a photo, resize it first")
    return w, h


def read_images(folder: Path, options: ImageOptions, limits: Limits = LIMITS
                ) -> tuple[np.ndarray, np.ndarray | None, int]:
    """(batch, labels, image count) of an image folder; the memory it needs (the batch, plus
    the decoded, resized and float copies of the largest image) is checked before decoding."""
    files, labels = image_files(folder)
    if not files:
        return np.empty(0), labels, 0
    sizes = [_header(path, limits) for path in files]
    finals = [_final(path, size, options) for path, size in zip(files, sizes, strict=True)]
    if len(set(finals)) > 1:
        raise DataError(f"{folder}: images decode to different shapes {sorted(set(finals))[:3]}"
                        "; set 'size' and 'crop' in the image options")
    channels = _CHANNELS[options.mode]
    h, w = finals[0]
    shape = (h, w, channels) if options.layout == "NHWC" else (channels, h, w)
    one = h * w * channels
    working = max(sw * sh * 4 * 2 + tw * th * channels * 5
                  for (sw, sh), (tw, th) in ((s, _target(s, options)) for s in sizes))
    budget = Budget(folder, limits)
    budget.take(len(files) * one * np.dtype(options.dtype).itemsize + working,
                f"{len(files)} images of {h}x{w}x{channels} as {options.dtype}")
    batch = np.empty((len(files), *shape), dtype=options.dtype)
    for index, path in enumerate(files):
        batch[index] = _decode(path, options)
    return batch, labels, len(files)


def _decode(path: Path, options: ImageOptions) -> np.ndarray:
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as raw:
                image = raw.convert(options.mode)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning, OSError,
            ValueError, zlib.error) as e:
        raise DataError(f"{path}: cannot decode the image ({e}); remove or re-save it") from e
    if options.size is not None:
        image = image.resize(_target(image.size, options), Image.Resampling.BILINEAR)
    if options.crop is not None:
        w, h = image.size
        ch, cw = (options.crop, options.crop) if isinstance(options.crop, int) else options.crop
        left, top = (w - cw) // 2, (h - ch) // 2
        image = image.crop((left, top, left + cw, top + ch))
    pixels = np.asarray(image, dtype=np.float32)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    pixels *= np.float32(options.scale)
    pixels -= np.asarray(options.mean, np.float32)
    pixels /= np.asarray(options.std, np.float32)
    return pixels.transpose(2, 0, 1) if options.layout == "NCHW" else pixels


def read_image_zip(archive: Path, options: ImageOptions, limits: Limits = LIMITS
                   ) -> tuple[np.ndarray, np.ndarray | None, int]:
    """:func:`read_images` of a zip of images (class folders kept; one top folder is looked
    through), unpacked to a temporary folder in bounded chunks against the budget: only image
    files with plain names are written, never a path outside that folder."""
    with tempfile.TemporaryDirectory(prefix="mpsearch-images-") as tmp:
        dest = Path(tmp)

        def target(info: zipfile.ZipInfo) -> Path | None:
            parts = PurePosixPath(info.filename.replace("\\", "/")).parts
            if (not parts or parts[-1].startswith(".") or "__MACOSX" in parts
                    or Path(parts[-1]).suffix.lower() not in IMAGE_SUFFIXES):
                return None
            if any(not _SAFE_PART.match(p) for p in parts):
                raise DataError(f"{archive}: unsafe path '{info.filename[:80]}' in the zip; "
                                "use plain folder and file names")
            out = dest.joinpath(*parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            return out

        if unzip(archive, limits, target) == 0:
            raise DataError(f"{archive}: no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in "
                            "the zip")
        root = dest
        while len(children := list(root.iterdir())) == 1 and children[0].is_dir():
            root = children[0]  # a zip of one top folder holding the images or class folders
        try:
            return read_images(root, options, limits)
        except DataError as e:  # name the zip and its member, not the temporary folder
            raise DataError(str(e).replace(str(dest), str(archive))) from e
