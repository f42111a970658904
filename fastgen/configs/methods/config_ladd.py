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
    # One student update every `student_update_freq` iterations, the discriminator in the others: with fewer
    # discriminator steps the student collapses onto a few modes (measured on the 2-D toy data).
    student_update_freq: int = 3
    feature_indices: Optional[list[int]] = None  # teacher feature levels read by the heads; None: bottleneck
    discriminator_hidden: Optional[int] = None
    # ProGAN's minibatch standard deviation (Karras et al. 2018, Sec. 3) as one more input of each head, over groups
    # of at most this many samples of one condition sharing one noise level: it lets the discriminator see too little
    # variety within a class, which a per-sample head cannot. 0 or 1: off.
    discriminator_minibatch_std: int = 0
    # Noise levels at which real and generated samples meet the discriminator (see DistillationModel.sample_noise_levels).
    t_dist: Literal["sampling", "train"] = "sampling"
    distill_loss_weight: float = 0.0
    # R1 penalty on noised real data (Mescheder et al. 2018, Eq. 9), gamma/2 E||grad_x D(x_t)||^2, estimated by
    # finite differences gamma/2 E[(D(x_t + s eps) - D(x_t))^2] / s^2 (as DMD2's r1_estimator=finite_difference:
    # no second derivative through the frozen, possibly sharded teacher). 0: off.
    r1_weight: float = 0.0
    r1_fd_sigma: float = 0.01  # step s, in data units


def _ladd_class() -> DictConfig:
    return LazyCall("fastgen.methods.ladd.LADDModel")()


def create_config() -> BaseConfig:
    return BaseConfig(model=LADDModelConfig(), model_class=_ladd_class())


__all__ = ["LADDModelConfig", "create_config"]
