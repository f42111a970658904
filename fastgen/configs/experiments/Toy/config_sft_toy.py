"""2-D toy data (eight Gaussians by default) with an MLP denoiser and EDM preconditioning, trained with SFT.

Small enough to train in seconds on a laptop CPU; pick another distribution with
``dataloader_train.dataset.name=checkerboard`` (``two_moons``, ``swiss_roll``).
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import toy_loader
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net import toy_mlp


def create_config() -> BaseConfig:
    config = sft_config()
    config.model.net = toy_mlp()
    config.model.input_shape = [2]
    config.model.num_classes = 0
    config.model.net_optimizer.lr = 1e-3
    config.dataloader_train = toy_loader("eight_gaussians", batch_size=256)
    config.dataloader_val = toy_loader("eight_gaussians", batch_size=256, num_samples=4096, seed=1)
    config.trainer.max_iter = 2000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 1000
    config.trainer.validation_iter = 1000
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.num_samples = 2000
    config.log_config.group = "toy"
    return config
