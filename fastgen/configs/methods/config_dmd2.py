"""Method config for DMD2 (distribution matching distillation) and f-distill. See ``fastgen.methods.dmd2``.

Typical use (see ``fastgen/configs/experiments/Digits/config_dmd2_digits.py``)::

    from fastgen.configs.methods.config_dmd2 import create_config
    config = create_config()
    config.model.net = ...            # the student; the teacher and the fake score default to the same network
    config.model.teacher_ckpt = "teacher.pth"
    config.model.gan_loss_weight_gen = 3e-3  # > 0 adds the GAN branch (discriminator on fake-score features)
"""

from __future__ import annotations

from typing import Literal, Optional

import attrs
from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig, default_optimizer
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_distill import DistillModelConfig
from fastgen.configs.schema import config_class


@config_class
class DMD2ModelConfig(DistillModelConfig):
    fake_score: Optional[DictConfig] = None  # LazyCall of the fake-score network; None: same as `net`
    fake_score_optimizer: DictConfig = attrs.field(factory=default_optimizer)
    fake_score_scheduler: Optional[DictConfig] = None
    discriminator_optimizer: DictConfig = attrs.field(factory=default_optimizer)
    discriminator_scheduler: Optional[DictConfig] = None
    # One student update every `student_update_freq` iterations; the fake score (and discriminator) train in
    # the others (DMD2's two-time-scale update rule, Yin et al. 2024, Sec. 4.2).
    student_update_freq: int = 5
    vsd_loss_weight: float = 1.0
    # GAN branch (Sec. 4.3): a head on the fake score's features. 0 turns it off (no discriminator is built).
    gan_loss_weight_gen: float = 0.0
    gan_loss_weight_disc: float = 1.0
    # Which network's features the discriminator head reads: "fake_score" (DMD2 Sec. 4.3: the head shares the fake
    # score's backbone, which the GAN loss then also trains) or "teacher" (frozen features, as in LADD; the fake
    # score then learns by denoising alone and only the head learns to discriminate).
    discriminator_features: Literal["fake_score", "teacher"] = "fake_score"
    feature_indices: Optional[list[int]] = None  # None: the backbone's bottleneck
    discriminator_hidden: Optional[int] = None
    # ProGAN's minibatch standard deviation (Karras et al. 2018, Sec. 3) as one more input of each head, over groups
    # of at most this many samples: it lets the discriminator see too little variety, which a per-sample head cannot
    # (DMD's reverse KL is mode-seeking). A group never mixes generated and real samples or two conditions, and
    # its samples share one noise level, so the spread is the variety within a class. 0 or 1: off.
    discriminator_minibatch_std: int = 0
    # Weighting of the fake score's denoising loss over noise levels: "schedule" (the schedule's own training
    # weight, EDM's lambda(sigma) of Karras et al. 2022 Eq. 8, which evens the loss out over sigma) or "uniform"
    # (plain squared error of the native prediction - for EDM, x0 - as the reference implementation trains its
    # fake score; low noise levels then count for little, and the critic learns the student's coarse structure).
    fake_score_loss_weighting: Literal["schedule", "uniform"] = "schedule"
    r1_weight: float = 0.0  # gamma of the R1 penalty gamma/2 E||grad_x D(x_t)||^2 on noised real data
    # How the R1 penalty is computed. "exact": the input gradient by double backpropagation through the feature
    # network and heads. "finite_difference": gamma/2 E[(D(x_t + s eps) - D(x_t))^2] / s^2 with s = r1_fd_sigma,
    # which equals the exact penalty to first order in s (E[(grad . s eps)^2] = s^2 ||grad||^2) and costs one more
    # forward pass instead of a double backward (the "approximated R1" of Lin et al. 2025, "Diffusion Adversarial
    # Post-Training for One-Step Video Generation", rescaled by 1/s^2 so that r1_weight means the same in both).
    r1_estimator: Literal["exact", "finite_difference"] = "exact"
    r1_fd_sigma: float = 0.01  # step s of the finite-difference R1, in data units
    # Times at which the student's samples are noised for the distribution-matching gradient, clamped to
    # [vsd_t_min, vsd_t_max] (None: the schedule's own range). "sampling": uniform over a 1000-step sampling grid
    # of the schedule (DMD2's uniform timesteps; for EDM the Karras rho-grid, so high noise is well covered);
    # "train": the schedule's training distribution (EDM's log-normal, mostly low noise).
    vsd_t_dist: Literal["sampling", "train"] = "sampling"
    # Noisings per generated sample for the distribution-matching gradient: the gradient averages this many
    # (t, eps) draws, which lowers its variance for the cost of forward passes only (no extra backward).
    vsd_num_noise: int = 1
    vsd_t_min: Optional[float] = None
    vsd_t_max: Optional[float] = None
    # DMD's regression loss (Yin et al. 2024, DMD Eq. 9): > 0 also regresses G(z) onto the teacher's ODE sample of
    # the same z, on `regression_num_pairs` pairs solved once (seeded by `regression_seed`, so a resumed run
    # solves the same ones). It anchors the student to every mode of the teacher; 0 turns it off.
    regression_loss_weight: float = 0.0
    regression_num_pairs: int = 1024
    regression_batch_size: Optional[int] = None  # None: the data batch size
    regression_seed: int = 0
    # SiD only (fastgen.methods.sid): alpha of SiD's generator loss (Zhou et al. 2024; the paper uses 1.2).
    sid_alpha: float = 1.2
    # f-distill only (fastgen.methods.f_distill): the divergence whose gradient weights the VSD term.
    f_divergence: Literal["reverse_kl", "forward_kl", "js", "jeffreys", "squared_hellinger"] = "js"
    f_weight_clip: float = 10.0  # the normalised weights are clipped to [0, f_weight_clip]


def _dmd2_class() -> DictConfig:
    return LazyCall("fastgen.methods.dmd2.DMD2Model")()


def create_config() -> BaseConfig:
    """A base DMD2 config; experiment configs fill in the networks, the teacher checkpoint and the data."""
    return BaseConfig(model=DMD2ModelConfig(), model_class=_dmd2_class())


__all__ = ["DMD2ModelConfig", "create_config"]
