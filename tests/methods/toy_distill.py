"""Helpers for the method tests: tiny toy configs, training a method on toy data and measuring its samples.

(A module with its own name: ``from conftest import ...`` would resolve to whichever ``conftest`` was imported
first - ``tests/conftest.py`` in a full run.)"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from fastgen.configs.callbacks import GradClip_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import toy_loader
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.net import edm_schedule

TOY = "eight_gaussians"
TEACHER_ITERS = 1500


def small_toy_mlp(schedule: DictConfig | None = None, use_r: bool = False, hidden_dim: int = 128,
                  num_layers: int = 2) -> DictConfig:
    """An MLP denoiser small enough to train in seconds (EDM, sigma_data 0.7, unless ``schedule`` is given)."""
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall("fastgen.networks.mlp.MLPDenoiser")(data_dim=2, hidden_dim=hidden_dim,
                                                              num_layers=num_layers, use_r=use_r),
        noise_scheduler=schedule if schedule is not None else edm_schedule(sigma_data=0.7),
    )


def toy_run_config(config: BaseConfig, name: str, max_iter: int, batch_size: int = 256) -> BaseConfig:
    """Fill in the toy data, a short schedule without checkpoints in between, and no W&B."""
    config.model.input_shape = [2]
    config.model.num_classes = 0
    config.dataloader_train = toy_loader(TOY, batch_size=batch_size, num_samples=20_000)
    config.dataloader_val = None
    config.trainer.max_iter = max_iter
    config.trainer.logging_iter = max(max_iter // 4, 1)
    config.trainer.save_ckpt_iter = max_iter
    config.trainer.validation_iter = None
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK})
    config.log_config.name = name
    config.log_config.wandb_mode = "disabled"
    return config


def train(config: BaseConfig) -> Any:
    """Run the real Trainer on ``config``; return the trained method."""
    from fastgen.trainer import Trainer

    return Trainer(config).run()


def toy_energy(model: Any, n: int = 2000, seed: int = 0) -> float:
    """Energy distance between ``n`` samples of the method's student sampler and fresh toy data."""
    from fastgen.datasets.toy import toy_samples
    from fastgen.evaluation.toy import energy_distance

    samples, _ = model.sample(n, generator=torch.Generator().manual_seed(seed), net=model.net)
    return energy_distance(samples, toy_samples(TOY, n, seed=12345))


def build(config: BaseConfig, seed: int = 0) -> Any:
    """Instantiate the method of ``config`` and run its fresh-run initialisation (teachers, copies)."""
    from fastgen.configs.instantiate import instantiate

    torch.manual_seed(seed)
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    model.init_optimizers()
    return model


def tiny(create_config: Any, net: DictConfig | None = None, **model: Any) -> BaseConfig:
    """A method config on a ~1k-parameter toy MLP, with the given ``model.*`` fields."""
    config = create_config()
    config.model.net = net if net is not None else small_toy_mlp(hidden_dim=16, num_layers=1)
    config.model.input_shape = [2]
    for key, value in model.items():
        setattr(config.model, key, value)
    return config


def has_grad(module: torch.nn.Module) -> bool:
    return any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in module.parameters())


def report(method: str, before: float, after: float) -> None:
    """Print the e2e numbers (visible with ``pytest -s``)."""
    print(f"\n[e2e] {method}: energy distance to fresh toy data {before:.4f} -> {after:.4f}")
