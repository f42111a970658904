"""The EDM-style image dataset: an uncompressed zip (or a folder) of PNG files plus ``dataset.json`` with labels.

The format is the one EDM (Karras et al. 2022) and StyleGAN2-ADA read and EDM's ``dataset_tool.py`` writes:
images at ``00000/img00000000.png``, ``00000/img00000001.png``, ... (1,000 per folder in practice, the folder is
the index's first five digits), stored uncompressed (``ZIP_STORED``, PNG ``compress_level=0``) so that decoding
is cheap, and ``dataset.json`` = ``{"labels": [["00000/img00000000.png", 6], ...]}`` (``"labels": null`` for an
unlabelled set). ``fastgen download-data`` writes it (``write_image_zip``); ``ImageZipDataset`` reads it - and
reads zips made by EDM's own tool, or a folder laid out the same way.

Items are ``{"real": float32 (C, H, W) in [-1, 1], "condition": int64 label}`` (no ``condition`` without labels);
pixels map as ``x = p / 127.5 - 1`` (EDM's ``images.to(torch.float32) / 127.5 - 1``). ``xflip`` follows EDM's
dataset option (App. F.2 of the paper): the dataset doubles to ``2N`` items and item ``N + i`` is image ``i``
mirrored, so the loader's seeded permutation (``fastgen.datasets.loader``) decides the flips and a resumed run
sees exactly the batches an uninterrupted one would.

Each process opens the zip on first use (``_archive``) and reopens it after a fork: DataLoader workers started
with ``fork`` would otherwise share one file offset with their parent and read each other's bytes.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastgen.datasets.image_files import (  # encode_png, write_image_zip, inspect_image_set: re-exported
    ImageSetSummary,
    _listing,
    _read_labels,
    archive_name,
    encode_png,
    inspect_image_set,
    write_image_zip,
)
from fastgen.utils.errors import FastGenRuntimeError, UsageError

if TYPE_CHECKING:
    import numpy as np
    import torch

class ImageZipDataset:
    """An EDM image zip (or folder) at ``path``; see the module docstring.

    ``use_labels=False`` drops the labels (an unconditional model on a labelled set). A missing ``path`` raises
    ``UsageError`` naming the ``fastgen download-data`` command that writes it, when one does.
    """

    DATA_PATH_ARGUMENTS = ("path",)  # fastgen.configs.checks.check_data_paths checks these exist before a run

    def __init__(self, path: str, xflip: bool = False, use_labels: bool = True) -> None:
        self.path = str(path)
        self.xflip = bool(xflip)
        location = Path(self.path).expanduser()
        if not location.exists():
            from fastgen.datasets.prepare import prepare_hint

            hint = prepare_hint(location)
            raise UsageError(f"image dataset {location} does not exist" + (f"; prepare it with: {hint}" if hint else ""))
        self._location = location
        self._is_dir = location.is_dir()
        self.names, meta = _listing(location)
        if not self.names:
            raise UsageError(f"image dataset {location} holds no images (.png/.jpg files)")
        labels = _read_labels(meta, self.path, self.names) if use_labels else None
        self.num_images = len(self.names)
        self._archive_handle: zipfile.ZipFile | None = None
        self._archive_pid = -1
        first = self._decode(0)
        self.image_shape = (first.shape[2], first.shape[0], first.shape[1])  # (C, H, W)
        self._labels: torch.Tensor | None = None
        if labels is not None:
            import torch

            self._labels = torch.tensor(labels, dtype=torch.int64)
        self.num_classes = int(self._labels.max()) + 1 if self._labels is not None else 0

    def __len__(self) -> int:
        return self.num_images * (2 if self.xflip else 1)

    @property
    def has_labels(self) -> bool:
        return self._labels is not None

    def _archive(self) -> zipfile.ZipFile:
        pid = os.getpid()
        if self._archive_handle is None or self._archive_pid != pid:
            self._archive_handle = zipfile.ZipFile(self._location)  # a forked copy's handle is left alone
            self._archive_pid = pid
        return self._archive_handle

    def _read(self, index: int) -> bytes:
        name = self.names[index]
        if self._is_dir:
            return (self._location / name).read_bytes()
        return self._archive().read(name)

    def _decode(self, index: int) -> np.ndarray:
        """Image ``index`` as ``(H, W, C)`` uint8."""
        import numpy as np
        import PIL.Image

        try:
            with PIL.Image.open(io.BytesIO(self._read(index))) as image:
                array = np.asarray(image)
        except (OSError, zipfile.BadZipFile, EOFError, KeyError) as exc:
            raise FastGenRuntimeError(f"cannot read {self.names[index]} from {self.path}: {exc}") from None
        if array.ndim == 2:
            array = array[:, :, None]
        if array.dtype != np.uint8 or array.shape[2] not in (1, 3):
            raise FastGenRuntimeError(f"{self.names[index]} in {self.path} is not 8-bit grayscale or RGB "
                                      f"(shape {array.shape}, {array.dtype})")
        return array

    def _image(self, index: int) -> np.ndarray:
        array = self._decode(index)
        if (array.shape[2], array.shape[0], array.shape[1]) != self.image_shape:
            raise FastGenRuntimeError(f"{self.names[index]} in {self.path} is {array.shape[1]}x{array.shape[0]}x"
                                      f"{array.shape[2]}, the others {self.image_shape[2]}x{self.image_shape[1]}x"
                                      f"{self.image_shape[0]}: all images of a dataset must match")
        return array

    def get_batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """Items ``indices`` (each in ``[0, len)``) as one batch; indices ``>= N`` are mirrored images."""
        import numpy as np
        import torch

        indices = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        base = (indices % self.num_images).tolist()
        pixels = torch.from_numpy(np.stack([self._image(i) for i in base])).permute(0, 3, 1, 2)
        images = torch.empty(pixels.shape, dtype=torch.float32)  # (B, C, H, W), contiguous
        images.copy_(pixels).div_(127.5).sub_(1.0)
        if self.xflip:
            flip = indices >= self.num_images
            if bool(flip.any()):
                images[flip] = images[flip].flip(-1)
        batch = {"real": images}
        if self._labels is not None:
            batch["condition"] = self._labels[base]
        return batch

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        import torch

        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} items")
        batch = self.get_batch(torch.tensor([index % len(self)]))
        return {key: value[0] for key, value in batch.items()}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return (self[i] for i in range(len(self)))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_archive_handle"] = None  # a spawned worker opens its own
        state["_archive_pid"] = -1
        return state


__all__ = ["ImageSetSummary", "ImageZipDataset", "archive_name", "encode_png", "inspect_image_set",
           "write_image_zip"]
