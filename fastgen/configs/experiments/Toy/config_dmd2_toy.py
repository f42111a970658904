"""DMD2 on 2-D toy data: distill an SFT toy teacher (``Toy/config_sft_toy``) into a 1-step MLP generator.

    fastgen train --config Toy/config_sft_toy - log_config.name=toy_teacher
    fastgen train --config Toy/config_dmd2_toy - model.teacher_ckpt=FASTGEN_OUTPUT/fastgen/toy/toy_teacher/checkpoints/0002000.pth
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.callbacks import GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import toy_loader
from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config
from fastgen.configs.net import toy_mlp


def create_config() -> BaseConfig:
    config = dmd2_config()
    config.model.net = toy_mlp()
    config.model.input_shape = [2]
    config.model.num_classes = 0
    config.model.student_update_freq = 5
    config.model.net_optimizer.lr = 1e-4
    config.model.fake_score_optimizer.lr = 1e-4
    config.dataloader_train = toy_loader("eight_gaussians", batch_size=256)
    config.trainer.max_iter = 2000
    config.trainer.logging_iter = 100
    config.trainer.save_ckpt_iter = 1000
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.num_samples = 2000
    config.log_config.group = "toy"
    return config
