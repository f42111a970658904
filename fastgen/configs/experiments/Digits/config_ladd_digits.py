"""LADD on digits: a 1-step student trained against heads on the shipped teacher's encoder features."""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import digits_distillation
from fastgen.configs.methods.config_ladd import create_config as ladd_config


def create_config() -> BaseConfig:
    config = digits_distillation(ladd_config())
    config.model.feature_indices = [1, 3]  # a mid-resolution level and the bottleneck
    config.model.student_update_freq = 5  # fewer discriminator steps per student step diverged (FD > 100)
    config.model.t_dist = "train"
    config.model.net_optimizer.lr = 1e-4
    config.model.discriminator_optimizer.lr = 1e-4
    return config
