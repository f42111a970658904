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


def toy_loader(name: str = "eight_gaussians", batch_size: int = 256, num_samples: int = 50_000, seed: int = 0) -> DictConfig:
    return LazyCall("fastgen.datasets.loader.build_dataloader")(
        dataset=LazyCall("fastgen.datasets.toy.ToyDataset")(name=name, num_samples=num_samples, seed=seed),
        batch_size=batch_size, shuffle=True, seed=seed,
    )


def data_root() -> str:
    """``$DATA_ROOT_DIR`` (default ``./data``): where ``scripts/download_data.py`` prepares the datasets.

    Read when a config is created (a ``.env`` in the working directory may set it), so ``config.yaml`` records
    the resolved path; nothing on disk is touched here.
    """
    from fastgen.utils.env import data_root as resolved

    return resolved()


def cifar10_loader(split: str = "train", batch_size: int = 128, xflip: bool = False, root: str | None = None,
                   seed: int = 0) -> DictConfig:
    """CIFAR-10 (binary version) from ``root`` (default ``$DATA_ROOT_DIR/cifar10``; prepare it with
    ``python scripts/download_data.py cifar10``). ``xflip`` adds mirrored copies (EDM's ``--xflip``)."""
    return LazyCall("fastgen.datasets.loader.build_dataloader")(
        dataset=LazyCall("fastgen.datasets.cifar10.CIFAR10Dataset")(
            root=root if root is not None else os.path.join(data_root(), "cifar10"), split=split, xflip=xflip,
        ),
        batch_size=batch_size, shuffle=True, seed=seed,
    )
