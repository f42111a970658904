"""CausalSFT (diffusion forcing) of a block-causal video DiT on moving digits: 8-frame videos in 4 chunks of 2
frames, every chunk trained at its own noise level, so the network denoises a chunk given earlier chunks at any
level - the initialisation of chunk-by-chunk students (CausVid, Self-Forcing). Otherwise the settings of
``Digits/config_sft_wan_moving_digits`` (rectified flow, Adam 1e-3, batch 32, power EMA, 10% label dropout).

``causal_video_dit()``: patch 2 (32 tokens per frame), hidden 96, depth 4, 4 heads; 0.72M parameters.
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import EMA_CALLBACK, WANDB_CALLBACK, GradClip_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import moving_digits_loader
from fastgen.configs.methods.config_causal_sft import create_config as causal_sft_config
from fastgen.configs.net_dit import causal_video_dit


def create_config() -> BaseConfig:
    config = causal_sft_config()
    config.model.net = causal_video_dit()
    config.model.input_shape = [1, 8, 8, 16]
    config.model.num_classes = 10
    config.model.use_ema = True
    config.model.net_optimizer.lr = 1e-3
    config.model.sample_steps = 25
    config.model.condition_dropout = 0.1
    config.dataloader_train = moving_digits_loader(split="train", batch_size=32)
    config.trainer.max_iter = 2000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 1000
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.ema.type = "power"
    config.trainer.callbacks.wandb.sample_iter = 1000
    config.trainer.callbacks.wandb.num_samples = 20
    config.log_config.group = "moving_digits"
    return config
