"""Hostile inputs through the real CLI, each in its own process: the documented exit code, one
stderr line, nothing left at ``--out``, and peak memory (the child's own VmHWM) under 1 GB.

The corpus is built by ``tests/hostile/build_hostile.py``; a test checks the committed files
are what the script writes.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _paths import FIXTURES, HOSTILE
from _peak import cli, read_peak

import mpsearch
from mpsearch.cli import main

pytestmark = pytest.mark.slow  # whole searches, servers, browsers, toolchains

_FORGE = importlib.util.spec_from_file_location("hostile_forge", HOSTILE / "forge.py")
assert _FORGE is not None and _FORGE.loader is not None
forge = sys.modules["hostile_forge"] = importlib.util.module_from_spec(_FORGE)
_FORGE.loader.exec_module(forge)
MODEL = str(FIXTURES / "resnet.onnx")
DATA = str(FIXTURES / "digits_eval.npz")
PEAK_LIMIT_KB = 1 << 20  # 1 GiB, in kB


def _run(argv: list[str], tmp_path: Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak RSS in kB) of ``mpsearch -q argv`` in a child process
    (-q: no progress bars on stderr)."""
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    peak = tmp_path / "peak.kb"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cli(peak, "-q", *argv),
                              stdout=stdout, stderr=stderr, cwd=tmp_path, env=env, check=False)
    return proc.returncode, err.read_text(), read_peak(peak)


def _copy(name: str, tmp_path: Path) -> str:
    source = HOSTILE / name
    target = tmp_path / name
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy(source, target)
    return str(target)


def _quantize(data: str, out: str, model: str = MODEL, profile: str = "x86_ort_auto"
              ) -> list[str]:
    return ["quantize", model, "--profile", profile, "--data", data, "--uniform", "int8",
            "--out", out, "--calibration-samples", "8"]


CASES = {
    # name: (argv builder (tmp_path, out) -> argv, message the one line must contain)
    "npz_bomb": (lambda t, o: _quantize(_copy("npz_bomb.npz", t), o),
                 "member 'input.npy' expands 1238171x to 1280 MiB (limit 100x): a zip bomb"),
    "npz_header_lie": (lambda t, o: _quantize(_copy("npz_header_lie.npz", t), o),
                       "member 'input.npy' declares 17179869184 bytes but holds 228"),
    "truncated_npz": (lambda t, o: _quantize(_copy("truncated.npz", t), o),
                      "cannot read the archive (BadZipFile: File is not a zip file); the file "
                      "is truncated or not an .npz"),
    "constant_of_shape_bomb": (
        lambda t, o: _quantize(DATA, o, model=_copy("constant_of_shape_bomb.onnx", t)),
        "node 'ConstantOfShape_0' (ConstantOfShape) would compute a 4.0 GiB tensor from 8 "
        "bytes of constants (limit 1 GiB)"),
    "png_bomb": (lambda t, o: _quantize(_copy("png_bomb", t), o),
                 "the image is 8000x8000 pixels (limit 40000000); a decompression bomb"),
    "pil_bomb": (lambda t, o: _quantize(_copy("pil_bomb", t), o),
                 "refused as a decompression bomb (Image size (900000000 pixels) exceeds limit"),
    "non_utf8_spec": (lambda t, o: ["search", _copy("non_utf8_spec.yaml", t), "--out", o],
                      "non_utf8_spec.yaml:4: byte 0xe9 is not UTF-8; save the file as UTF-8"),
    "non_utf8_profile": (
        lambda t, o: _quantize(DATA, o, profile=_copy("non_utf8_profile.yaml", t)),
        "non_utf8_profile.yaml:4: byte 0xe9 is not UTF-8; save the file as UTF-8"),
    "nan_in_eval_data": (lambda t, o: ["eval", MODEL, "--data", _copy("nan.npz", t)],
                         "input 'input' holds NaN in batch 0 (sample 0); clean or drop that "
                         "sample"),
    "nan_in_calibration_data": (lambda t, o: _quantize(_copy("nan.npz", t), o),
                                "input 'input' holds NaN in batch 0"),
}


def _bzip2_members(t: Path) -> str:
    """62 bzip2 members of 63 MiB of zeros each (a 17 KB file; members of any size are
    ratio-checked)."""
    head = forge.npy_header(((63 << 20) // 4,))
    data, crc, size = forge.compress(zipfile.ZIP_BZIP2, head, 63 << 20)
    path = t / "bzip2_members.npz"
    forge.write_zip(path, [forge.Member(f"a{i}.npy", zipfile.ZIP_BZIP2, data, crc, size)
                           for i in range(62)])
    return str(path)


def _overstated(method: int) -> Callable[[Path], str]:
    """256 MiB of zeros whose directory claims a compressed size 1/50 of it: the header ratio
    passes, the bytes decoded are counted against the bytes actually read."""
    def build(t: Path) -> str:
        head = forge.npy_header(((256 << 20) // 4,))
        data, crc, size = forge.compress(method, head, 256 << 20)
        path = t / f"overstated_{method}.npz"
        forge.write_zip(path, [forge.Member("input.npy", method, data, crc, size,
                                            packed=size // 50)])
        return str(path)
    return build


def _understated(t: Path) -> str:
    """The directory and the .npy header say 32 floats; the bzip2 stream holds 1 GiB."""
    head = forge.npy_header((32,))
    data, crc, size = forge.compress(zipfile.ZIP_BZIP2, head, 1 << 30)
    path = t / "understated.npz"
    forge.write_zip(path, [forge.Member("input.npy", zipfile.ZIP_BZIP2, data, crc, size,
                                        size=len(head) + 128)])
    return str(path)


def _big_pngs(t: Path, count: int = 8) -> str:
    """``count`` 6000x6000 black PNGs (~105 KB each): 412 MiB each as float32 RGB."""
    folder = t / "big_pngs"
    folder.mkdir()
    image = forge.png(6000, 6000)
    for i in range(count):
        (folder / f"{i}.png").write_bytes(image)
    return str(folder)


def _class_link(t: Path) -> str:
    """Class folder 'b' is a symlink to '.': every image would load twice under two labels."""
    folder = t / "classes"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "x.png").write_bytes(forge.png(8, 8))
    os.symlink(".", folder / "b")
    return str(folder)


def _many_members(t: Path) -> str:
    """A zip of images listing 120,000 (empty) files: refused from its end record, before
    zipfile builds an object per member."""
    path = t / "many.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for i in range(120_000):
            archive.writestr(f"{i}.png", b"")
    return str(path)


def _data_case(build: Callable[[Path], str], message: str) -> tuple[Any, str]:
    return (lambda t, o: _quantize(build(t), o)), message


CASES.update({
    "npz_62_bzip2_members": _data_case(
        _bzip2_members,
        "member 'a0.npy' expands 3532"),
    "npz_overstated_deflate": _data_case(
        _overstated(zipfile.ZIP_DEFLATED), "member 'input.npy' expands 112x to 7 MiB"),
    "npz_overstated_bzip2": _data_case(
        _overstated(zipfile.ZIP_BZIP2), "member 'input.npy' expands"),
    "npz_overstated_lzma": _data_case(
        _overstated(zipfile.ZIP_LZMA), "member 'input.npy' expands 110x to 4 MiB"),
    "npz_understated_bzip2": _data_case(
        _understated, "member 'input.npy' holds more than its .npy header declares"),
    "eight_6000px_pngs": _data_case(
        _big_pngs, "8 images of 6000x6000x3 as float32 takes the data past 4086 MiB decoded "
        "(memory budget 512 MiB)"),
    "three_6000px_pngs": _data_case(
        lambda t: _big_pngs(t, 3), "3 images of 6000x6000x3 as float32 takes the data past "
        "2026 MiB decoded (memory budget 512 MiB)"),
    "zip_of_120k_images": _data_case(
        _many_members, "the zip lists 120000 members in a 6608890-byte directory (limit "
        "100000 members)"),
    "class_folder_links_to_dot": _data_case(
        _class_link, "(a symlink loop or duplicate); remove the link"),
})
PEAKS: dict[str, int] = {}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_exits_2_with_one_line(case: str, tmp_path: Path) -> None:
    build, message = CASES[case]
    out = tmp_path / "out" / "result.onnx" if case != "non_utf8_spec" else tmp_path / "run"
    code, err, peak_kb = _run(build(tmp_path, str(out)), tmp_path)
    lines = err.splitlines()
    print(f"{case}: exit {code}, peak RSS {peak_kb / 1024:.0f} MiB")
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("mpsearch: error: "), err
    assert message in lines[0]
    assert not out.exists() and not (tmp_path / "out").exists()
    assert peak_kb < PEAK_LIMIT_KB, f"{case}: peak {peak_kb} kB"


def test_internal_error_exits_3_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    def broken(path: str) -> None:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(mpsearch, "load_model", broken)  # the CLI imports it from the API
    assert main(["summary", MODEL]) == 3
    assert capsys.readouterr().err == (
        "mpsearch: internal error: RuntimeError: boom; run with --debug for the traceback\n")
    with pytest.raises(RuntimeError, match="boom"):
        main(["--debug", "summary", MODEL])


def test_corpus_is_what_the_script_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    spec = importlib.util.spec_from_file_location("build_hostile", HOSTILE / "build_hostile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "HERE", tmp_path)
    # Packing 1.25 GiB takes ~10 s: the bomb is checked by its zip directory instead.
    monkeypatch.setattr(module, "npz_bomb", lambda path: shutil.copy(HOSTILE / path.name, path))
    with zipfile.ZipFile(HOSTILE / "npz_bomb.npz") as archive:
        (info,) = archive.infolist()
    assert (info.filename, info.compress_type) == ("input.npy", zipfile.ZIP_BZIP2)
    assert info.file_size == 128 + (1280 << 20) and info.compress_size < 4096
    module.main()
    built = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(HOSTILE) for p in HOSTILE.rglob("*")
                       if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts)
    assert built == committed
    for name in built:
        assert (tmp_path / name).read_bytes() == (HOSTILE / name).read_bytes(), name
    assert sum((HOSTILE / n).stat().st_size for n in committed) < 256 << 10


def test_valid_npz_in_every_zip_method_loads_as_numpy_saved_it(tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((50, 3, 8, 8)).astype(np.float32)
    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2,
                   zipfile.ZIP_LZMA):
        path = tmp_path / f"m{method}.npz"
        with zipfile.ZipFile(path, "w", compression=method) as archive:
            with archive.open("input.npy", "w") as f:
                np.lib.format.write_array(f, x)
            with archive.open("f.npy", "w") as f:
                np.lib.format.write_array(f, np.asfortranarray(x[:, 0]))
        data = mpsearch.load_data(path)
        assert np.array_equal(data.inputs["input"], x), method
        assert np.array_equal(data.inputs["f"], x[:, 0]), method


def test_image_size_is_budgeted_before_decoding(tmp_path: Path) -> None:
    """Six 4x4 PNGs in a 1 KB zip asked to become 8192x8192: refused from the headers."""
    archive = tmp_path / "six.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(6):
            z.writestr(f"img/{i}.png", forge.png(4, 4))
    assert archive.stat().st_size < 1100
    with pytest.raises(mpsearch.DataError, match=r"six.zip/img: 6 images of 8192x8192x3 as "
                       r"float32 takes the data past 5568 MiB decoded \(memory budget 512"):
        mpsearch.load_data(archive, images=mpsearch.ImageOptions(size=(8192, 8192)))
    small = mpsearch.load_data(archive, images=mpsearch.ImageOptions(size=(16, 16)))
    assert small.inputs["input"].shape == (6, 3, 16, 16)
    for dtype in ("V100000000", "object", "U5", "complex128"):
        with pytest.raises(mpsearch.DataError, match="is not a number type"):
            mpsearch.ImageOptions(dtype=dtype)


def test_reader_output_counts_against_the_budget(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "big_reader.py").write_text(
        "import numpy as np\n"
        "def batches():\n"
        "    for _ in range(1000):\n"
        "        yield {'input': np.zeros((256, 1024), np.float32)}\n")  # 1 MiB a batch
    monkeypatch.syspath_prepend(str(tmp_path))
    limits = mpsearch.data.Limits(data_bytes=8 << 20)
    with pytest.raises(mpsearch.DataError, match=r"big_reader:batches: item 4 takes the data "
                       r"past 10 MiB decoded \(memory budget 8 MiB\)"):
        mpsearch.load_data("big_reader:batches", limits=limits)


def test_links_to_one_image_or_a_parent_folder_are_refused(tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.png").write_bytes(forge.png(8, 8))
    os.symlink("a.png", flat / "b.png")
    with pytest.raises(mpsearch.DataError, match=r"flat/b.png: the same file as .*flat/a.png "
                       r"\(a symlink or duplicate\)"):
        mpsearch.load_data(flat)
    loop = tmp_path / "loop"
    (loop / "cat").mkdir(parents=True)
    (loop / "cat" / "x.png").write_bytes(forge.png(8, 8))
    os.symlink("..", loop / "cat" / "up")
    with pytest.raises(mpsearch.DataError, match=r"cat/up: the same folder as .*loop \(a "
                       r"symlink loop or duplicate\)"):
        mpsearch.load_data(loop)
