"""Method config for LADD (adversarial distillation on teacher features). See ``fastgen.methods.ladd``."""

from __future__ import annotations

from typing import Literal, Optional

import attrs
from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig, default_optimizer
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_distill import DistillModelConfig
from fastgen.configs.schema import config_class


@config_class
class LADDModelConfig(DistillModelConfig):
    discriminator_optimizer: DictConfig = attrs.field(factory=default_optimizer)
    discriminator_scheduler: Optional[DictConfig] = None
    student_update_freq: int = 2  # student on even iterations, discriminator on odd ones
    feature_indices: Optional[list[int]] = None  # teacher feature levels read by the heads; None: bottleneck
    discriminator_hidden: Optional[int] = None
    # Noise levels at which real and generated samples meet the discriminator (see DistillationModel.sample_noise_levels).
    t_dist: Literal["sampling", "train"] = "sampling"
    distill_loss_weight: float = 0.0


def _ladd_class() -> DictConfig:
    return LazyCall("fastgen.methods.ladd.LADDModel")()


def create_config() -> BaseConfig:
    return BaseConfig(model=LADDModelConfig(), model_class=_ladd_class())


__all__ = ["LADDModelConfig", "create_config"]
