"""Digits teacher: a class-conditional EDM model of scikit-learn's 8x8 digits, trained with SFT.

A ~1M-parameter U-Net (channels 32/64/64), EDM preconditioning with ``sigma_data = 0.5``, Adam at 1e-3,
batch 64 and an EDM2 power-function EMA (gamma 6.94: suited to short runs, where a constant 0.999 would still
be dominated by the first weights after 1,000 steps). Samples use 18 Heun steps (35 network evaluations).
This is the recipe the quick-start runs (``fastgen train`` with no ``--config``).
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import EMA_CALLBACK, GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import digits_loader
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net import edm_unet_8x8


def create_config() -> BaseConfig:
    config = sft_config()
    config.model.net = edm_unet_8x8(num_classes=10)
    config.model.input_shape = [1, 8, 8]
    config.model.num_classes = 10
    config.model.use_ema = True
    config.model.net_optimizer.lr = 1e-3
    config.model.sample_steps = 18
    config.model.condition_dropout = 0.1
    config.dataloader_train = digits_loader(split="train", batch_size=64)
    # 32 batches of 16 validation digits per rank (512 draws, as 4 x 128 did): the 180-digit split then serves up to
    # 8 ranks (each rank draws from its own 1/N of it).
    config.dataloader_val = digits_loader(split="val", batch_size=16)
    config.trainer.max_iter = 1000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 500
    config.trainer.validation_iter = 500
    config.trainer.max_val_iter = 32
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.ema.type = "power"
    config.trainer.callbacks.wandb.sample_iter = 500
    config.trainer.callbacks.wandb.num_samples = 100
    config.log_config.group = "digits"
    return config
