"""Build the hostile-input corpus of tests/integration/test_hostile.py (small files; run from
anywhere).

Every file is tiny on disk and hostile when decoded or run:

* ``npz_bomb.npz``: one 1.25 GiB member of zeros, bzip2-packed into a few kB;
* ``npz_header_lie.npz``: a member whose .npy header declares a 4 GiB array in 100 bytes;
* ``truncated.npz``: a valid archive cut in half;
* ``constant_of_shape_bomb.onnx``: ~200 bytes whose ConstantOfShape folds to a 4 GiB tensor;
* ``png_bomb/bomb.png`` / ``pil_bomb/bomb.png``: 8000 x 8000 and 30000 x 30000 PNG headers
  over a few hundred bytes of pixel data (over our pixel limit; over PIL's too);
* ``non_utf8_spec.yaml`` / ``non_utf8_profile.yaml``: YAML with a Latin-1 byte in a value;
* ``nan.npz``: eight digits-shaped samples (1, 16, 16), each holding one NaN.

    python tests/hostile/build_hostile.py
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent


def _npy_header(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        stream, {"descr": dtype, "fortran_order": False, "shape": shape})
    return stream.getvalue()


def _member(name: str) -> zipfile.ZipInfo:
    """A zip entry with a fixed date, so the files are byte-identical on every build."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def _savez(path: Path | io.BytesIO, **arrays: np.ndarray) -> None:
    """numpy.savez with fixed zip dates."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            stream = io.BytesIO()
            np.lib.format.write_array(stream, np.asarray(array), allow_pickle=False)
            archive.writestr(_member(f"{name}.npy"), stream.getvalue())


def npz_bomb(path: Path, mib: int = 1280) -> None:
    """bzip2 (which numpy.load reads through zipfile) packs the zeros a million to one."""
    info = _member("input.npy")
    info.compress_type = zipfile.ZIP_BZIP2
    with zipfile.ZipFile(path, "w") as archive:
        with archive.open(info, "w", force_zip64=True) as member:
            member.write(_npy_header((mib << 18, 1, 1, 1)))  # float32: 4 bytes an element
            zeros = bytes(1 << 20)
            for _ in range(mib):
                member.write(zeros)


def npz_header_lie(path: Path) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(_member("input.npy"), _npy_header((1 << 28, 1, 4, 4)) + bytes(100))


def truncated(path: Path) -> None:
    stream = io.BytesIO()
    rng = np.random.default_rng(0)
    _savez(stream, input=rng.standard_normal((8, 1, 16, 16)).astype(np.float32),
           labels=np.arange(8))
    data = stream.getvalue()
    path.write_bytes(data[: len(data) // 2])


def constant_of_shape_bomb(path: Path) -> None:
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["big"],
                         value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("ReduceMax", ["big"], ["top"], keepdims=1),
        helper.make_node("Add", ["input", "top"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "bomb", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 10])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(np.array([1 << 30], np.int64), "shape")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(
        ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bomb(path: Path, side: int = 30000) -> None:
    path.parent.mkdir(exist_ok=True)
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)  # 8-bit grayscale
    rows = zlib.compress(bytes(side + 1) * 4, 9)  # four rows; the rest is missing
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", rows)
                     + _chunk(b"IEND", b""))


def non_utf8(spec: Path, profile: Path) -> None:
    spec.write_bytes(b"model: model.onnx\nprofile: x86_ort\ndata: {source: d.npz}\n"
                     b"metric: accuracy # caf\xe9\n")
    profile.write_bytes(b"schema: 1\nname: mine\nextends: x86_ort\n"
                        b"description: caf\xe9 board\n")


def nan_data(path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 1, 16, 16)).astype(np.float32)
    x[:, 0, 3, 5] = np.nan
    _savez(path, input=x, labels=np.arange(8) % 10)


def main() -> None:
    npz_bomb(HERE / "npz_bomb.npz")
    npz_header_lie(HERE / "npz_header_lie.npz")
    truncated(HERE / "truncated.npz")
    constant_of_shape_bomb(HERE / "constant_of_shape_bomb.onnx")
    png_bomb(HERE / "png_bomb" / "bomb.png", side=8000)  # over Limits.image_pixels only
    png_bomb(HERE / "pil_bomb" / "bomb.png", side=30000)  # over PIL's own bomb limit too
    non_utf8(HERE / "non_utf8_spec.yaml", HERE / "non_utf8_profile.yaml")
    nan_data(HERE / "nan.npz")
    for file in sorted(HERE.rglob("*")):
        if file.is_file() and file.suffix != ".py":
            print(f"{file.relative_to(HERE)}: {file.stat().st_size} bytes")


if __name__ == "__main__":
    main()
