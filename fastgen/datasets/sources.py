"""Readers of the datasets' published formats, each yielding images for ``fastgen.datasets.image_zip``.

* **CIFAR-10** - the official *binary* archive ``cifar-10-binary.tar.gz``: records of one label byte and 3,072
  pixel bytes (CHW) in ``cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin``. Members are read straight from
  the archive (nothing is extracted to disk, nothing is unpickled), after refusing links, devices, absolute paths
  and ``..``; every file must be a whole number of records with labels 0-9.
* **MNIST / Fashion-MNIST** - IDX files (LeCun et al.): ``train-images-idx3-ubyte.gz`` etc. An image file starts
  with the big-endian magic ``0x00000803`` then the count, rows and columns; a label file with ``0x00000801`` and
  the count. As EDM's ``dataset_tool.py`` does for MNIST, the 28x28 images are zero-padded by 2 pixels on every
  side to 32x32 (EDM requires power-of-two sizes).
* **digits** - scikit-learn's bundled 8x8 digits (values 0-16), in the same seeded 90/10 train/val partition and
  order as ``fastgen.datasets.digits.DigitsDataset``, with pixels ``round(v * 255 / 16)``, so the image zip
  reproduces ``DigitsDataset`` to within one 8-bit step (parity).
* **ImageNet** - a local ILSVRC-2012 training folder, ``train/nXXXXXXXX/*.JPEG`` (the official archive
  extracted) or Kaggle's ``ILSVRC/Data/CLS-LOC/train/nXXXXXXXX/*.JPEG`` (the "ImageNet Object Localization
  Challenge" download EDM's README uses). Labels are the index of the synset folder in sorted order - what EDM's
  ``dataset_tool.py`` derives from top-level folder names when there is no ``dataset.json``, and the order of
  Kaggle's ``LOC_synset_mapping.txt``. Images are resized the way EDM prepares ImageNet-64
  (``dataset_tool.py --resolution=64x64 --transform=center-crop``): the largest centred square is cut out
  (``crop = min(H, W)``; rows ``(H - crop) // 2 .. (H + crop) // 2``, columns likewise), grayscale/CMYK become
  RGB, and PIL's Lanczos filter resizes it to 64x64.
"""

from __future__ import annotations

import gzip
import re
import struct
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from fastgen.datasets.download import DownloadError
from fastgen.utils.errors import UsageError

if TYPE_CHECKING:
    import numpy as np

Images = tuple["np.ndarray", "np.ndarray"]  # (N, H, W[, C]) uint8, (N,) int64


# ------------------------------------------------------------------------------------------------- CIFAR-10
def _safe_member(member: tarfile.TarInfo, top: str) -> None:
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts or "\\" in member.name or "\0" in member.name:
        raise DownloadError(f"refusing archive member {member.name!r}: absolute path or '..'")
    if not (member.isfile() or member.isdir()):
        raise DownloadError(f"refusing archive member {member.name!r}: not a regular file or folder "
                            "(links and devices are not read)")
    if not path.parts or path.parts[0] != top:
        raise DownloadError(f"refusing archive member {member.name!r}: outside {top}/")


def read_cifar10_archive(archive: Path) -> dict[str, Images]:
    """``{"train": (images (50000, 32, 32, 3), labels), "test": ...}`` from the binary archive, in record order."""
    import numpy as np

    from fastgen.datasets.cifar10 import BATCHES_DIR, NUM_CLASSES, RECORD_BYTES, SPLIT_FILES

    wanted = {f"{BATCHES_DIR}/{name}" for names in SPLIT_FILES.values() for name in names}
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                _safe_member(member, BATCHES_DIR)
                if member.name in wanted:
                    handle = tar.extractfile(member)
                    assert handle is not None  # a regular file
                    found[member.name] = handle.read()
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as exc:
        raise DownloadError(f"cannot read {archive.name}: {exc} (truncated or not a .tar.gz); it was deleted - run "
                            "the command again") from None
    splits = {}
    for split, names in SPLIT_FILES.items():
        images, labels = [], []
        for name in names:
            key = f"{BATCHES_DIR}/{name}"
            if key not in found:
                raise DownloadError(f"{archive.name} is not CIFAR-10 binary data: {key} is missing")
            data = found[key]
            if not data or len(data) % RECORD_BYTES:
                raise DownloadError(f"{archive.name} is not CIFAR-10 binary data: {name} has {len(data)} bytes, not "
                                    f"a whole number of {RECORD_BYTES}-byte records")
            records = np.frombuffer(data, dtype=np.uint8).reshape(-1, RECORD_BYTES)
            if records[:, 0].max() >= NUM_CLASSES:
                raise DownloadError(f"{archive.name} is not CIFAR-10 binary data: {name} has a label byte "
                                    f"{records[:, 0].max()} (expected 0-9)")
            labels.append(records[:, 0].astype(np.int64))
            images.append(records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))  # CHW -> HWC
        splits[split] = (np.concatenate(images), np.concatenate(labels))
    return splits


# ---------------------------------------------------------------------------------------- MNIST / Fashion-MNIST
IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801


def _read_gz(path: Path) -> bytes:
    try:
        with gzip.open(path, "rb") as handle:
            return handle.read()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DownloadError(f"cannot read {path.name}: {exc} (truncated or not gzip); it was deleted - run the "
                            "command again") from None


def read_idx(images_gz: Path, labels_gz: Path, pad_to: int = 32) -> Images:
    """An IDX image/label pair as ``(N, pad_to, pad_to)`` uint8 images (centred, zero-padded) and labels."""
    import numpy as np

    images, labels = _read_gz(images_gz), _read_gz(labels_gz)
    if len(images) < 16 or struct.unpack(">I", images[:4])[0] != IDX_IMAGES_MAGIC:
        raise DownloadError(f"{images_gz.name} is not an IDX image file (magic 0x00000803)")
    if len(labels) < 8 or struct.unpack(">I", labels[:4])[0] != IDX_LABELS_MAGIC:
        raise DownloadError(f"{labels_gz.name} is not an IDX label file (magic 0x00000801)")
    count, rows, cols = struct.unpack(">III", images[4:16])
    (label_count,) = struct.unpack(">I", labels[4:8])
    if len(images) != 16 + count * rows * cols or len(labels) != 8 + label_count or count != label_count:
        raise DownloadError(f"{images_gz.name} / {labels_gz.name}: sizes do not match their headers "
                            f"({count} images of {rows}x{cols}, {label_count} labels)")
    pixels = np.frombuffer(images, dtype=np.uint8, offset=16).reshape(count, rows, cols)
    label_array = np.frombuffer(labels, dtype=np.uint8, offset=8).astype(np.int64)
    if label_array.size and label_array.max() > 9:
        raise DownloadError(f"{labels_gz.name} has a label {label_array.max()} (expected 0-9)")
    if pad_to > max(rows, cols):
        top, left = (pad_to - rows) // 2, (pad_to - cols) // 2
        pixels = np.pad(pixels, [(0, 0), (top, pad_to - rows - top), (left, pad_to - cols - left)])
    return pixels, label_array


# ---------------------------------------------------------------------------------------------------- digits
def digits_split(split: str) -> Images:
    """``DigitsDataset(split)`` as 8x8 uint8 images (``round(v * 255 / 16)``) and labels, in its order."""
    import numpy as np

    from fastgen.datasets.digits import DigitsDataset

    dataset = DigitsDataset(split=split)
    values = (dataset.images.squeeze(1).double() + 1.0) * 8.0  # back to 0..16
    pixels = np.rint(values.numpy() * 255.0 / 16.0).clip(0, 255).astype(np.uint8)
    return pixels, dataset.labels.numpy().astype(np.int64)


# -------------------------------------------------------------------------------------------------- ImageNet
SYNSET = re.compile(r"^n\d{8}$")
JPEG_SUFFIXES = (".jpeg", ".jpg", ".png")
TRAIN_FOLDERS = ("ILSVRC/Data/CLS-LOC/train", "Data/CLS-LOC/train", "CLS-LOC/train", "train", ".")


def imagenet_train_folder(source: Path) -> Path:
    """The folder of ``nXXXXXXXX`` synset folders under ``source`` (Kaggle or ILSVRC-2012 layout)."""
    source = Path(source).expanduser()
    if not source.is_dir():
        raise UsageError(f"--source {source} is not a folder (give the ImageNet download: the folder holding "
                         "ILSVRC/Data/CLS-LOC/train (Kaggle) or train/ (ILSVRC-2012))")
    for relative in TRAIN_FOLDERS:
        folder = source / relative
        if folder.is_dir() and any(SYNSET.match(p.name) and p.is_dir() for p in folder.iterdir()):
            return folder
    raise UsageError(f"no ImageNet training folder under {source}: expected ILSVRC/Data/CLS-LOC/train/nXXXXXXXX/ "
                     "(Kaggle) or train/nXXXXXXXX/ (ILSVRC-2012) holding JPEG files")


def imagenet_files(source: Path) -> tuple[list[tuple[Path, int]], list[str]]:
    """``([(image path, label), ...] in sorted path order, sorted synset ids)``; label = index of the synset."""
    folder = imagenet_train_folder(source)
    synsets = sorted(p.name for p in folder.iterdir() if p.is_dir() and SYNSET.match(p.name))
    files = [(path, label) for label, synset in enumerate(synsets)
             for path in sorted((folder / synset).rglob("*")) if path.suffix.lower() in JPEG_SUFFIXES and path.is_file()]
    if not files:
        raise UsageError(f"the ImageNet folder {folder} holds no .JPEG files")
    return files, synsets


#: a square side, or ``(width, height)`` (``encode-data --resolution 768x512``)
Resolution = int | tuple[int, int]


def center_crop_resize(path: Path | Any, resolution: Resolution) -> np.ndarray:
    """EDM's ``--transform=center-crop`` (see the module docstring) of an image file (a path or a binary file
    object): ``(resolution, resolution, 3)`` uint8; ``(width, height)``: ``(height, width, 3)`` (``crop_box``)."""
    import numpy as np
    import PIL.Image

    try:
        with PIL.Image.open(path) as image:
            array = np.asarray(image.convert("RGB"))
    except (OSError, ValueError) as exc:
        raise DownloadError(f"cannot decode {path}: {exc}") from None
    return center_crop_resize_array(array, resolution)


def target_size(resolution: Resolution) -> tuple[int, int]:
    """``(width, height)`` of a square side or a ``(width, height)`` pair."""
    return (resolution, resolution) if isinstance(resolution, int) else (int(resolution[0]), int(resolution[1]))


def crop_box(width: int, height: int, resolution: Resolution) -> tuple[int, int, int, int]:
    """``(left, top, crop_width, crop_height)``: the largest centred region of a ``width x height`` picture with the
    target's aspect ratio - for a square target the largest centred square (``crop = min(H, W)``, EDM's
    ``center-crop``), for a ``w x h`` one the full height and ``round(H w / h)`` columns when the picture is wider
    than the target, else the full width and ``round(W h / w)`` rows (EDM's ``center-crop-wide`` for any ratio)."""
    wanted_w, wanted_h = target_size(resolution)
    if width * wanted_h >= height * wanted_w:  # wider than the target: keep every row
        crop_w, crop_h = min(width, round(height * wanted_w / wanted_h)), height
    else:
        crop_w, crop_h = width, min(height, round(width * wanted_h / wanted_w))
    return (width - crop_w) // 2, (height - crop_h) // 2, crop_w, crop_h


def center_crop_resize_array(array: np.ndarray, resolution: Resolution) -> np.ndarray:
    """The largest centred region of an ``(H, W, 3)`` uint8 array with the target's aspect ratio (``crop_box``),
    resized to ``resolution`` (a square side, or ``(width, height)``) with Lanczos."""
    import numpy as np
    import PIL.Image

    height, width = array.shape[:2]
    left, top, crop_w, crop_h = crop_box(width, height, resolution)
    array = array[top:top + crop_h, left:left + crop_w]
    resized = PIL.Image.fromarray(np.ascontiguousarray(array), "RGB").resize(target_size(resolution),
                                                                            PIL.Image.Resampling.LANCZOS)
    return np.asarray(resized)


def imagenet_png(item: tuple[Path, int], resolution: int = 64) -> tuple[bytes, int]:
    """One ImageNet file as (uncompressed PNG bytes, label); a top-level function so a process pool can run it."""
    from fastgen.datasets.image_files import encode_png

    path, label = item
    return encode_png(center_crop_resize(path, resolution)), label


def encoded(images: np.ndarray, labels: np.ndarray) -> Iterator[tuple[bytes, int]]:
    """In-memory images as (PNG bytes, label) pairs, in order."""
    from fastgen.datasets.image_files import encode_png

    for image, label in zip(images, labels):
        yield encode_png(image), int(label)


__all__ = ["Resolution", "center_crop_resize", "center_crop_resize_array", "crop_box", "digits_split", "encoded",
           "imagenet_files", "imagenet_png", "imagenet_train_folder", "read_cifar10_archive", "read_idx", "target_size"]
