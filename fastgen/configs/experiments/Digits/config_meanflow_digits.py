"""MeanFlow on digits, from scratch (Geng et al. 2025): a class-conditional U-Net ``u(z_t, r, t)`` with the second
time input (``use_r=True``) on the rectified-flow schedule, sampled in one step ``x0 = x1 - u(x1, 0, 1)``.
No teacher; an EDM2 power-function EMA network is what samples come from.

    fastgen train --config Digits/config_meanflow_digits
    fastgen train --config Digits/config_meanflow_digits - model.t_list=[1.0,0.5]   # two sampling steps
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import EMA_CALLBACK, GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import digits_loader
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_meanflow import create_config as meanflow_config
from fastgen.configs.net import flow_schedule


def meanflow_unet_8x8(num_classes: int = 10, model_channels: int = 32) -> DictConfig:
    """The digits U-Net (channels 32/64/64) with the ``r`` input, on the rectified-flow schedule."""
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall("fastgen.networks.unet.UNet")(
            img_resolution=8, in_channels=1, model_channels=model_channels, channel_mult=[1, 2, 2], num_blocks=1,
            num_classes=num_classes, use_r=True,
        ),
        noise_scheduler=flow_schedule(),
    )


def create_config() -> BaseConfig:
    config = meanflow_config()
    config.model.net = meanflow_unet_8x8(num_classes=10)
    config.model.input_shape = [1, 8, 8]
    config.model.num_classes = 10
    config.model.use_ema = True
    config.model.ratio_r_neq_t = 0.25
    config.model.net_optimizer.lr = 1e-3
    config.dataloader_train = digits_loader(split="train", batch_size=64)
    config.trainer.max_iter = 4000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 1000
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.ema.type = "power"
    config.trainer.callbacks.wandb.sample_iter = 1000
    config.trainer.callbacks.wandb.num_samples = 100
    config.log_config.group = "digits"
    config.log_config.name = "meanflow"
    return config
