"""Method config for CausVid (Yin et al. 2025). See ``fastgen.methods.causvid``: DMD2's settings, a block-causal
student (``model.net``), a bidirectional teacher and fake score (``model.teacher``, ``model.fake_score``:
``causal_video_dit(causal=False)``) and the time at which sampling caches finished chunks."""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_dmd2 import DMD2ModelConfig
from fastgen.configs.schema import config_class


@config_class
class CausVidModelConfig(DMD2ModelConfig):
    # the time at which a finished chunk is written into the KV cache: 0 (clean) or a small context noise level
    context_time: float = 0.0


def _causvid_class() -> DictConfig:
    return LazyCall("fastgen.methods.causvid.CausVidModel")()


def create_config() -> BaseConfig:
    """A base CausVid config; experiment configs fill in the student, the teacher and the data."""
    return BaseConfig(model=CausVidModelConfig(), model_class=_causvid_class())


__all__ = ["CausVidModelConfig", "create_config"]
