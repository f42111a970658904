"""What the CIFAR-10 recipes share: class-conditional 32x32 RGB at EDM's DDPM++ size, an EMA network, the teacher's
18 Heun steps (35 evaluations, as EDM samples CIFAR-10), checkpoints every 5,000 iterations and W&B grids of 100
samples. Recipes call ``cifar10_setting(method_config, ...)`` and then set only what is particular to them."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from fastgen.configs.callbacks import GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.net import edm_unet_cifar10


def cifar10_setting(config: BaseConfig, ema_callback: dict[str, Any], sample_iter: int,
                    net: DictConfig | None = None) -> BaseConfig:
    """Fill in ``net`` (default: ``edm_unet_cifar10`` with 10 classes), the shape, EMA, sampling steps, the
    checkpoint/log cadence and GradClip + ``ema_callback`` + W&B (100 samples every ``sample_iter``)."""
    config.model.net = net if net is not None else edm_unet_cifar10(num_classes=10)
    config.model.input_shape = [3, 32, 32]
    config.model.num_classes = 10
    config.model.use_ema = True
    config.model.sample_steps = 18
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 5000
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **ema_callback, **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.sample_iter = sample_iter
    config.trainer.callbacks.wandb.num_samples = 100
    config.log_config.group = "cifar10"
    return config
