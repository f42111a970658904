"""LADD on 2-D toy data: a 1-step MLP generator against heads on the frozen toy teacher's features
(teacher from ``Toy/config_sft_toy``; pass ``model.teacher_ckpt=...``)."""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import toy_loader
from fastgen.configs.methods.config_ladd import create_config as ladd_config
from fastgen.configs.net import toy_mlp


def create_config() -> BaseConfig:
    config = ladd_config()
    config.model.net = toy_mlp()
    config.model.input_shape = [2]
    config.model.num_classes = 0
    config.model.net_optimizer.lr = 1e-4
    config.model.discriminator_optimizer.lr = 1e-4
    config.model.distill_loss_weight = 0.1
    config.dataloader_train = toy_loader("eight_gaussians", batch_size=256)
    config.trainer.max_iter = 2000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 1000
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.num_samples = 2000
    config.log_config.group = "toy"
    return config
