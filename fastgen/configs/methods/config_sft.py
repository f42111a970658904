"""Method config for SFT (supervised diffusion / flow-matching training). See ``fastgen.methods.sft``."""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig, BaseModelConfig
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.schema import config_class


@config_class
class SFTModelConfig(BaseModelConfig):
    condition_dropout: float = 0.0  # probability of training on the null label (for classifier-free guidance)


def _sft_class() -> DictConfig:
    return LazyCall("fastgen.methods.sft.SFTModel")()


def create_config() -> BaseConfig:
    """A base SFT config; experiment configs fill in the network and data."""
    config = BaseConfig(model=SFTModelConfig(), model_class=_sft_class())
    return config


__all__ = ["SFTModelConfig", "create_config"]
