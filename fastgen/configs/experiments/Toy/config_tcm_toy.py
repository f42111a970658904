"""Truncated consistency model on 2-D toy data (Lee et al. 2025): two runs of this recipe.

    fastgen train --config Toy/config_tcm_toy - model.teacher_ckpt=TEACHER log_config.name=tcm_stage1
    fastgen train --config Toy/config_tcm_toy - model.teacher_ckpt=TEACHER log_config.name=tcm_stage2 \\
        model.tcm_stage=2 model.stage1_ckpt=FASTGEN_OUTPUT/fastgen/toy/tcm_stage1/checkpoints/0002000.pth

``TEACHER`` is an SFT toy checkpoint (``fastgen train --config Toy/config_sft_toy``). Stage 1 is ECT-style
consistency training from it (as ``Toy/config_cm_toy``); stage 2 retrains on ``sigma in [t', 80]`` with
``t' = 1`` and the frozen stage-1 model as the boundary.
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import CT_SCHEDULE_CALLBACK, GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import toy_loader
from fastgen.configs.methods.config_tcm import create_config as tcm_config
from fastgen.configs.net import toy_mlp


def create_config() -> BaseConfig:
    config = tcm_config()
    config.model.net = toy_mlp()
    config.model.input_shape = [2]
    config.model.num_classes = 0
    config.model.mode = "ct"
    config.model.t_mean = -1.1
    config.model.t_std = 2.0
    config.model.t_prime = 1.0
    config.model.net_optimizer.lr = 3e-4
    config.dataloader_train = toy_loader("eight_gaussians", batch_size=256)
    config.trainer.max_iter = 2000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 1000
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **CT_SCHEDULE_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.num_samples = 2000
    config.log_config.group = "toy"
    return config
