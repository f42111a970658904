"""CIFAR-10 (Krizhevsky 2009) read from the official *binary* distribution, ``cifar-10-batches-bin``.

Why the binary files: they are plain bytes - each record is one label byte (0-9) followed by the 3,072 pixel
bytes of a 32x32 RGB image in channel-major (CHW) order - so reading them runs no code from the download,
unlike the Python version's pickles, which are never unpickled here. The folder is what
``tar xzf cifar-10-binary.tar.gz`` extracts: ``data_batch_1.bin`` ... ``data_batch_5.bin`` (train, 5 x 10,000
records) and ``test_batch.bin`` (10,000). The recipes read the EDM-style image zips that
``fastgen download-data cifar10`` converts the same archive into (``fastgen.datasets.image_zip``); this reader
is for a folder extracted by hand.

Items are ``{"real": float32 (3, 32, 32) in [-1, 1], "condition": int64 label}``; pixels map as
``x = p / 127.5 - 1``. The whole split stays in memory as uint8 (150 MB for train) and is converted per batch.

Horizontal flips (``xflip=True``) follow EDM's dataset ``xflip`` option (Karras et al. 2022, App. F.2): the
dataset doubles to ``2N`` items and item ``N + i`` is image ``i`` mirrored. The flip is thus chosen by the
loader's seeded permutation (``fastgen.datasets.loader``) - no extra random stream, and a resumed run sees
exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from fastgen.utils.errors import UsageError

if TYPE_CHECKING:
    import torch

NUM_CLASSES = 10
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
IMAGE_SHAPE = (3, 32, 32)
RECORD_BYTES = 1 + 3 * 32 * 32  # one label byte + CHW pixels
BATCHES_DIR = "cifar-10-batches-bin"
SPLIT_FILES: dict[str, tuple[str, ...]] = {
    "train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
    "test": ("test_batch.bin",),
}


def prepare_command(root: Path) -> str:
    """How to put the binary files where ``root`` expects them."""
    if root.name == BATCHES_DIR:
        root = root.parent
    return (f"tar xzf cifar-10-binary.tar.gz -C {root} (the recipes read the image zips of "
            "`fastgen download-data cifar10` instead)")


def batches_dir(root: str | os.PathLike[str]) -> Path:
    """The folder holding the ``.bin`` files: ``root/cifar-10-batches-bin`` if it exists, else ``root`` itself."""
    root = Path(root)
    nested = root / BATCHES_DIR
    return nested if nested.is_dir() else root


def _bad_label(path: Path, label: int, fix: str) -> UsageError:
    return UsageError(f"CIFAR-10 file {path} has a label byte {label} (expected 0-9; corrupt or not the binary "
                      f"version); prepare the data again with: {fix}")


def check_file(path: Path, root: Path, check_labels: bool = True) -> int:
    """Number of records in one ``.bin`` file; ``UsageError`` (with the command to fix it) if it is unusable.

    A file must be non-empty and a whole number of records; with ``check_labels`` every label byte must be 0-9
    (this catches a pickle or a garbled file that happens to have a fitting size). Uses only the standard
    library.
    """
    fix = prepare_command(root)
    if not path.is_file():
        raise UsageError(f"CIFAR-10 file missing: {path}; prepare the data with: {fix}")
    size = path.stat().st_size
    if size == 0 or size % RECORD_BYTES != 0:
        raise UsageError(f"CIFAR-10 file {path} has {size} bytes, not a whole number of {RECORD_BYTES}-byte "
                         f"records (corrupt or not the binary version); prepare the data again with: {fix}")
    if check_labels:
        labels = memoryview(path.read_bytes())[::RECORD_BYTES].tobytes()
        if max(labels) >= NUM_CLASSES:
            raise _bad_label(path, max(labels), fix)
    return size // RECORD_BYTES


def check_split(root: str | os.PathLike[str], split: str = "train", check_labels: bool = True) -> dict[str, int]:
    """``{file name: records}`` of a split's files, after checking each (``UsageError`` if one is unusable)."""
    if split not in SPLIT_FILES:
        raise UsageError(f"CIFAR-10 split must be 'train' or 'test', got {split!r}")
    root = Path(root)
    folder = batches_dir(root)
    return {name: check_file(folder / name, root, check_labels) for name in SPLIT_FILES[split]}


def read_split(root: str | os.PathLike[str], split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """A split as ``(N, 3, 32, 32)`` uint8 images and ``(N,)`` int64 labels, in file and record order."""
    import numpy as np
    import torch

    counts = check_split(root, split, check_labels=False)  # sizes first; the labels are checked once loaded
    folder = batches_dir(root)
    total = sum(counts.values())
    images = np.empty((total, RECORD_BYTES - 1), dtype=np.uint8)  # filled file by file: one copy in memory
    labels = np.empty(total, dtype=np.int64)
    start = 0
    for name, count in counts.items():
        records = np.fromfile(folder / name, dtype=np.uint8).reshape(count, RECORD_BYTES)
        if records[:, 0].max() >= NUM_CLASSES:
            raise _bad_label(folder / name, int(records[:, 0].max()), prepare_command(Path(root)))
        labels[start:start + count] = records[:, 0]
        images[start:start + count] = records[:, 1:]
        start += count
    return torch.from_numpy(images).view(total, *IMAGE_SHAPE), torch.from_numpy(labels)


class CIFAR10Dataset:
    """CIFAR-10 from ``root`` (``$DATA_ROOT_DIR/cifar10``, or the ``cifar-10-batches-bin`` folder itself).

    ``split`` is ``train`` (50,000 images) or ``test`` (10,000); ``xflip`` doubles the dataset with mirrored
    copies (see the module docstring). Missing or malformed files raise ``UsageError`` naming the file and the
    command that prepares the data.
    """

    DATA_PATH_ARGUMENTS = ("root",)  # fastgen.configs.checks.check_data_paths checks it exists before a run

    def __init__(self, root: str = "./data/cifar10", split: str = "train", xflip: bool = False) -> None:
        self.root = str(root)
        self.split = split
        self.xflip = bool(xflip)
        self.images, self.labels = read_split(root, split)
        self.num_images = int(self.images.shape[0])

    def __len__(self) -> int:
        return self.num_images * (2 if self.xflip else 1)

    def get_batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """Items ``indices`` (each in ``[0, len)``) as one batch; indices ``>= N`` are mirrored images."""
        import torch

        indices = torch.as_tensor(indices, dtype=torch.long)
        base = indices % self.num_images
        images = self.images[base].float().div_(127.5).sub_(1.0)
        if self.xflip:
            flip = (indices >= self.num_images).view(-1, 1, 1, 1)
            images = torch.where(flip, images.flip(-1), images)
        return {"real": images, "condition": self.labels[base]}

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        import torch

        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} items")
        batch = self.get_batch(torch.tensor([index % len(self)]))
        return {key: value[0] for key, value in batch.items()}


__all__ = ["CIFAR10Dataset", "NUM_CLASSES", "CLASSES", "RECORD_BYTES", "check_split", "read_split", "batches_dir"]
