"""Method config for SiD (score identity distillation): DMD2's config (``sid_alpha`` is SiD's alpha) with the
SiD model class. See ``fastgen.methods.sid``."""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_dmd2 import DMD2ModelConfig


def _sid_class() -> DictConfig:
    return LazyCall("fastgen.methods.sid.SiDModel")()


def create_config() -> BaseConfig:
    return BaseConfig(model=DMD2ModelConfig(), model_class=_sid_class())


__all__ = ["create_config"]
