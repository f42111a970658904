"""Method config for f-distill: DMD2's config with ``f_divergence`` / ``f_weight_clip`` and the GAN branch on
(it supplies the density ratio). See ``fastgen.methods.f_distill``."""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_dmd2 import DMD2ModelConfig


def _f_distill_class() -> DictConfig:
    return LazyCall("fastgen.methods.f_distill.FDistillModel")()


def create_config() -> BaseConfig:
    config = BaseConfig(model=DMD2ModelConfig(), model_class=_f_distill_class())
    config.model.gan_loss_weight_gen = 3e-3
    return config


__all__ = ["create_config"]
