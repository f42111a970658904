"""SFT of a small Wan network (diffusers' ``WanTransformer3DModel``, the Wan 2.1 video family) on moving digits:
8-frame videos of one digit gliding across an 8x16 canvas (``fastgen.datasets.moving_digits``), in pixel space,
rectified flow (Wan's schedule, unshifted), labels through a fixed bank of 10 random prompt embeddings, 10% label
dropout for guidance. The video family's CPU check: the run's per-frame digits FD falls from its initialisation
(``benchmarks/moving_digits.py``, measured in ``docs/experiments/moving-digits.md``), and its EMA network is the
bidirectional teacher for causal video students.

``WAN_MOVING_DIGITS``: patches ``(1, 2, 2)`` (256 tokens per video), 4 blocks of 4 heads x 16, FFN 256; 0.31M
parameters. Adam at 1e-3, batch 32, EDM2 power EMA, 25 Euler-Heun steps for samples.
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import EMA_CALLBACK, WANDB_CALLBACK, GradClip_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import moving_digits_loader
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_diffusers import WAN_MOVING_DIGITS, wan_transformer


def create_config() -> BaseConfig:
    config = sft_config()
    config.model.net = wan_transformer(WAN_MOVING_DIGITS, num_prompts=10, shift=1.0)
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
