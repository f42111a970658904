"""Method config for CausalSFT (diffusion forcing: an independent noise level per chunk of frames). See
``fastgen.methods.causal_sft``; the network must be chunked (``fastgen.configs.net_dit.causal_video_dit``)."""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_sft import SFTModelConfig
from fastgen.configs.schema import config_class


@config_class
class CausalSFTModelConfig(SFTModelConfig):
    pass


def _causal_sft_class() -> DictConfig:
    return LazyCall("fastgen.methods.causal_sft.CausalSFTModel")()


def create_config() -> BaseConfig:
    """A base CausalSFT config; experiment configs fill in the chunked video network and the data."""
    return BaseConfig(model=CausalSFTModelConfig(), model_class=_causal_sft_class())


__all__ = ["CausalSFTModelConfig", "create_config"]
