"""What every 2-D toy recipe shares: an MLP on eight Gaussians, batch 256, 2,000 iterations, GradClip + W&B
(2,000-point scatter plots). Recipes call ``toy_setting(method_config)`` and set only what is particular to them;
distillation recipes take the teacher from ``Toy/config_sft_toy`` via ``model.teacher_ckpt=...``."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from fastgen.configs.callbacks import GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import toy_loader
from fastgen.configs.net import toy_mlp


def toy_setting(config: BaseConfig, max_iter: int = 2000, save_ckpt_iter: int = 1000,
                callbacks: dict[str, Any] | None = None, net: DictConfig | None = None) -> BaseConfig:
    config.model.net = net if net is not None else toy_mlp()
    config.model.input_shape = [2]
    config.model.num_classes = 0
    config.dataloader_train = toy_loader("eight_gaussians", batch_size=256)
    config.trainer.max_iter = max_iter
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = save_ckpt_iter
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **(callbacks or {}), **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.num_samples = 2000
    config.log_config.group = "toy"
    return config
