"""scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes), with labels.

Pixels (0..16) are mapped to ``[-1, 1]``. ``split`` takes a fixed, seeded 90/10 train/validation partition, or
``all``. The data ships inside scikit-learn, so nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch

NUM_CLASSES = 10


def _digits_file() -> Path:
    """scikit-learn's ``datasets/data/digits.csv.gz``, found without importing scikit-learn (``sklearn.datasets``
    takes most of a second to import, in every process that reads the digits)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # a top-level package: located, not imported
    if spec is None or not spec.submodule_search_locations:
        from fastgen.utils.errors import UsageError

        raise UsageError("the digits dataset ships with scikit-learn: pip install scikit-learn")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """All digits as ``(N, 1, 8, 8)`` float images in [-1, 1] and ``(N,)`` int64 labels: exactly
    ``sklearn.datasets.load_digits()``'s ``images`` and ``target`` (its file: 64 pixel values 0..16, then the
    label, per row), read with numpy."""
    import gzip

    import numpy as np

    with gzip.open(_digits_file(), "rt") as handle:
        table = np.loadtxt(handle, delimiter=",")
    images = torch.from_numpy(table[:, :-1].reshape(-1, 8, 8)).float().div(16.0).mul(2.0).sub(1.0).unsqueeze(1)
    labels = torch.from_numpy(table[:, -1].astype(np.int64))
    return images, labels


class DigitsDataset:
    """Items are ``{"real": (1, 8, 8), "condition": label}``."""

    def __init__(self, split: str = "train", val_fraction: float = 0.1, seed: int = 0) -> None:
        if split not in ("train", "val", "all"):
            raise ValueError(f"split must be 'train', 'val' or 'all', got {split!r}")
        images, labels = load_digits_tensors()
        if split != "all":
            order = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(seed))
            n_val = int(round(images.shape[0] * val_fraction))
            keep = order[:n_val] if split == "val" else order[n_val:]
            images, labels = images[keep], labels[keep]
        self.images, self.labels = images.contiguous(), labels.contiguous()

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"real": self.images[index], "condition": self.labels[index]}

    def get_batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"real": self.images[indices], "condition": self.labels[indices]}
