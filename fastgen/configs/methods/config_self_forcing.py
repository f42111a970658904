"""Method config for Self-Forcing (Huang et al. 2025). See ``fastgen.methods.self_forcing``: DMD2's settings, a
block-causal student (``model.net``), a bidirectional teacher and fake score (``model.teacher``,
``model.fake_score``: ``causal_video_dit(causal=False)``) and the cache's context time."""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_causvid import CausVidModelConfig
from fastgen.configs.schema import config_class


@config_class
class SelfForcingModelConfig(CausVidModelConfig):
    """CausVid's fields (DMD2's and ``context_time``); only the way the student's training videos are made differs."""


def _self_forcing_class() -> DictConfig:
    return LazyCall("fastgen.methods.self_forcing.SelfForcingModel")()


def create_config() -> BaseConfig:
    """A base Self-Forcing config; experiment configs fill in the student, the teacher and the data."""
    return BaseConfig(model=SelfForcingModelConfig(), model_class=_self_forcing_class())


__all__ = ["SelfForcingModelConfig", "create_config"]
