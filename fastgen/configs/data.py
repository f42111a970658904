"""Dataset / dataloader configs. ``batch_size`` is per rank; ``trainer.batch_size_global`` sets accumulation."""

from __future__ import annotations

import os

from omegaconf import DictConfig

from fastgen.configs.instantiate import LazyCall


def digits_loader(split: str = "train", batch_size: int = 128, seed: int = 0) -> DictConfig:
    return LazyCall("fastgen.datasets.loader.build_dataloader")(
        dataset=LazyCall("fastgen.datasets.digits.DigitsDataset")(split=split),
        batch_size=batch_size, shuffle=True, seed=seed,
    )


def moving_digits_loader(split: str = "train", batch_size: int = 32, frames: int = 8, width: int = 16,
                         seed: int = 0) -> DictConfig:
    """Moving-digits videos ``(1, frames, 8, width)`` with their digit's label (``fastgen.datasets.moving_digits``)."""
    return LazyCall("fastgen.datasets.loader.build_dataloader")(
        dataset=LazyCall("fastgen.datasets.moving_digits.MovingDigitsDataset")(split=split, frames=frames, width=width),
        batch_size=batch_size, shuffle=True, seed=seed,
    )


def audio_video_digits_loader(split: str = "train", batch_size: int = 32, frames: int = 8, width: int = 16,
                              seed: int = 0) -> DictConfig:
    """Moving-digits videos with their sound: ``{"video": (1, frames, 8, width), "audio": (1, frames, 16)}`` and the
    digit's label (``fastgen.datasets.audio_video_digits``; a multimodal model's ``model.modality_shapes``)."""
    return LazyCall("fastgen.datasets.loader.build_dataloader")(
        dataset=LazyCall("fastgen.datasets.audio_video_digits.AudioVideoDigitsDataset")(split=split, frames=frames,
                                                                                        width=width),
        batch_size=batch_size, shuffle=True, seed=seed,
    )


def toy_loader(name: str = "eight_gaussians", batch_size: int = 256, num_samples: int = 50_000, seed: int = 0) -> DictConfig:
    return LazyCall("fastgen.datasets.loader.build_dataloader")(
        dataset=LazyCall("fastgen.datasets.toy.ToyDataset")(name=name, num_samples=num_samples, seed=seed),
        batch_size=batch_size, shuffle=True, seed=seed,
    )


def data_root() -> str:
    """``$DATA_ROOT_DIR`` (default ``./data``): where ``fastgen download-data`` prepares the datasets.

    Read when a config is created (a ``.env`` in the working directory may set it), so ``config.yaml`` records
    the resolved path; nothing on disk is touched here.
    """
    from fastgen.utils.env import data_root as resolved

    return resolved()


def image_zip_loader(path: str, batch_size: int = 128, xflip: bool = False, seed: int = 0,
                     num_workers: int = 0) -> DictConfig:
    """An EDM-style image zip or folder (``fastgen.datasets.image_zip``); the path is checked before training
    (``fastgen.configs.checks.check_data_paths``), so a missing one fails with the key to override."""
    return LazyCall("fastgen.datasets.loader.build_dataloader")(
        dataset=LazyCall("fastgen.datasets.image_zip.ImageZipDataset")(path=path, xflip=xflip),
        batch_size=batch_size, shuffle=True, seed=seed, num_workers=num_workers,
    )


def webdataset_loader(datatags: list[str], batch_size: int = 128, fields: dict[str, str] | None = None,
                      shuffle_buffer: int = 1000, seed: int = 0, num_workers: int = 0) -> DictConfig:
    """WebDataset shards (``fastgen.datasets.webdataset``): ``datatags`` is a list of ``WDS:<folder, .tar file or
    s3://bucket/prefix>``; ``fields`` maps batch keys to extensions (default ``{"real": "png;jpg;jpeg;webp;npy"}``;
    add ``condition: cls`` for class labels). Override the shards with
    ``- dataloader_train.datatags=[WDS:/data/my_shards]``; local paths are checked before training."""
    return LazyCall("fastgen.datasets.webdataset.build_webdataset_loader")(
        datatags=list(datatags), batch_size=batch_size, fields=dict(fields) if fields is not None else None,
        shuffle=True, shuffle_buffer=shuffle_buffer, seed=seed, num_workers=num_workers,
    )


CIFAR10_FILES = {"train": "cifar10-32x32.zip", "test": "cifar10-32x32-test.zip"}


def cifar10_loader(split: str = "train", batch_size: int = 128, xflip: bool = False, root: str | None = None,
                   seed: int = 0) -> DictConfig:
    """CIFAR-10's image zip (``cifar10-32x32.zip`` / ``cifar10-32x32-test.zip``) from ``root`` (default
    ``$DATA_ROOT_DIR/cifar10``), as ``fastgen download-data cifar10`` writes it. ``xflip`` adds mirrored copies
    (EDM's ``--xflip``)."""
    if split not in CIFAR10_FILES:
        raise ValueError(f"CIFAR-10 split must be 'train' or 'test', got {split!r}")
    folder = root if root is not None else os.path.join(data_root(), "cifar10")
    return image_zip_loader(os.path.join(folder, CIFAR10_FILES[split]), batch_size=batch_size, xflip=xflip, seed=seed)
