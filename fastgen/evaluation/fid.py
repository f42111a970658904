"""FID for natural images (CIFAR-10, ImageNet): InceptionV3 pool3 statistics and the Fréchet distance.

``FID = FD(N(mu_s, S_s), N(mu_r, S_r))`` over 2048-d pool3 features (Heusel et al. 2017, Eq. 6), with the FID
InceptionV3 of ``fastgen.evaluation.inception`` loaded from a local weights file (nothing is downloaded).

Reference statistics come from (``load_reference_statistics``):

* an ``.npz`` with ``mu`` and ``sigma`` (pytorch-fid's ``--save-stats`` files, the guided-diffusion suite's
  reference batches, or ``save_statistics`` here);
* an ``.npz`` of images (``arr_0``: uint8 NHWC, the guided-diffusion convention);
* a folder of images (``.png``, ``.jpg``, ``.jpeg``, ``.bmp``, ``.webp``), read with Pillow as RGB.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastgen.evaluation.frechet import feature_statistics, frechet_distance_to_statistics

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


def images_to_unit_nchw(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 NHWC (``C`` 1 or 3) -> float ``(N, 3, H, W)`` in ``[0, 1]`` (grayscale repeated to RGB)."""
    x = torch.as_tensor(np.asarray(images) if not isinstance(images, torch.Tensor) else images)
    if x.dim() == 3:
        x = x.unsqueeze(-1)
    if x.dim() != 4 or x.shape[-1] not in (1, 3) or x.dtype != torch.uint8:
        raise ValueError(f"FID expects uint8 images (N, H, W, 1 or 3); got {x.dtype} {tuple(x.shape)}")
    x = x.permute(0, 3, 1, 2).float().div(255.0)
    return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x


@torch.no_grad()
def inception_features(images: np.ndarray | torch.Tensor, model: torch.nn.Module, batch_size: int = 64,
                       device: torch.device | str = "cpu",
                       progress: Callable[[int], None] | None = None) -> np.ndarray:
    """``(N, 2048)`` float64 pool3 features of uint8 NHWC ``images``; ``progress(k)`` after each batch of k."""
    feats = []
    n = len(images)
    for start in range(0, n, batch_size):
        batch = images_to_unit_nchw(images[start : start + batch_size]).to(device)
        feats.append(model(batch).double().cpu().numpy())
        if progress is not None:
            progress(batch.shape[0])
    return np.concatenate(feats) if feats else np.zeros((0, 2048))


def read_image_folder(folder: str | os.PathLike[str]) -> np.ndarray:
    """All images in ``folder`` (sorted by name, not recursive) as uint8 ``(N, H, W, 3)``; sizes must agree."""
    from PIL import Image

    from fastgen.utils.errors import UsageError

    files = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise UsageError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {folder}")
    arrays = []
    for file in files:
        with Image.open(file) as image:
            arrays.append(np.asarray(image.convert("RGB"), dtype=np.uint8))
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise UsageError(f"images in {folder} have different sizes: {sorted(shapes)[:3]}")
    return np.stack(arrays)


def save_statistics(path: str | os.PathLike[str], mu: np.ndarray, sigma: np.ndarray) -> None:
    """Write ``mu``/``sigma`` as an ``.npz`` (the key names pytorch-fid and guided-diffusion use)."""
    from fastgen.utils.io import atomic_open

    with atomic_open(Path(path), "wb") as handle:
        np.savez(handle, mu=mu, sigma=sigma)


def load_reference_statistics(source: str | os.PathLike[str], model_loader: Callable[[], torch.nn.Module],
                              batch_size: int = 64, device: torch.device | str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """``(mu, sigma)`` from an ``.npz`` of statistics, an ``.npz`` of images or an image folder.

    ``model_loader`` builds the Inception network only when images have to be embedded."""
    from fastgen.utils.errors import UsageError

    path = Path(source).expanduser()
    if path.is_dir():
        images = read_image_folder(path)
    elif path.is_file():
        try:
            with np.load(path, allow_pickle=False) as data:
                if "mu" in data and "sigma" in data:
                    return np.asarray(data["mu"], np.float64), np.asarray(data["sigma"], np.float64)
                if "arr_0" not in data:
                    raise UsageError(f"{path} holds neither mu/sigma nor arr_0 images (keys: {', '.join(data.files)})")
                images = data["arr_0"]
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read reference {path}: {exc}") from None
    else:
        raise UsageError(f"reference statistics not found: {path}")
    return feature_statistics(inception_features(images, model_loader(), batch_size=batch_size, device=device))


def fid_from_images(images: np.ndarray, reference: tuple[np.ndarray, np.ndarray], model: torch.nn.Module,
                    batch_size: int = 64, device: torch.device | str = "cpu",
                    progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """``{"fid", "num_samples"}`` of uint8 NHWC ``images`` against reference ``(mu, sigma)``."""
    features = inception_features(images, model, batch_size=batch_size, device=device, progress=progress)
    return {"fid": frechet_distance_to_statistics(features, *reference), "num_samples": int(features.shape[0])}


__all__ = [
    "fid_from_images",
    "images_to_unit_nchw",
    "inception_features",
    "load_reference_statistics",
    "read_image_folder",
    "save_statistics",
]
