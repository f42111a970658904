"""LADD on 2-D toy data: a 1-step MLP generator against heads on the frozen toy teacher's features
(teacher from ``Toy/config_sft_toy``; pass ``model.teacher_ckpt=...``)."""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Toy.common import toy_setting
from fastgen.configs.methods.config_ladd import create_config as ladd_config


def create_config() -> BaseConfig:
    config = toy_setting(ladd_config())
    config.model.student_update_freq = 5
    config.model.t_dist = "train"
    config.model.net_optimizer.lr = 3e-4
    config.model.discriminator_optimizer.lr = 3e-4
    return config
