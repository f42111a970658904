"""Dataset / dataloader configs. ``batch_size`` is per rank; ``trainer.batch_size_global`` sets accumulation."""

from __future__ import annotations

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
