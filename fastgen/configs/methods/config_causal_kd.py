"""Method config for CausalKD, the ODE initialisation of causal video students (CausVid Sec. 3.3). See
``fastgen.methods.causal_kd``: KD's settings (teacher pairs in ``kd_data_path`` or on the fly), a block-causal
student (``model.net``), a bidirectional teacher (``model.teacher``) and the time at which sampling caches finished
chunks."""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_kd import KDModelConfig
from fastgen.configs.schema import config_class


@config_class
class CausalKDModelConfig(KDModelConfig):
    # the time at which a finished chunk is written into the KV cache when sampling: 0 (clean) or a context noise
    context_time: float = 0.0


def _causal_kd_class() -> DictConfig:
    return LazyCall("fastgen.methods.causal_kd.CausalKDModel")()


def create_config() -> BaseConfig:
    """A base CausalKD config; experiment configs fill in the student, the teacher and the data."""
    return BaseConfig(model=CausalKDModelConfig(), model_class=_causal_kd_class())


__all__ = ["CausalKDModelConfig", "create_config"]
