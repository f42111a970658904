"""LADD on digits: a 1-step student trained against heads on the shipped teacher's encoder features."""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import digits_loader
from fastgen.configs.experiments.Digits.config_dmd2_digits import shipped_teacher
from fastgen.configs.methods.config_ladd import create_config as ladd_config
from fastgen.configs.net import edm_unet_8x8


def create_config() -> BaseConfig:
    config = ladd_config()
    config.model.net = edm_unet_8x8(num_classes=10)
    config.model.teacher_ckpt = shipped_teacher()
    config.model.input_shape = [1, 8, 8]
    config.model.num_classes = 10
    config.model.feature_indices = [1, 3]  # a mid-resolution level and the bottleneck
    config.model.distill_loss_weight = 0.1
    config.model.net_optimizer.lr = 1e-4
    config.model.discriminator_optimizer.lr = 1e-4
    config.dataloader_train = digits_loader(split="train", batch_size=64)
    config.trainer.max_iter = 1000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 500
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.sample_iter = 500
    config.trainer.callbacks.wandb.num_samples = 100
    config.log_config.group = "digits"
    return config
