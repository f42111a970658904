"""Method config for discrete-time consistency models (CT / CD, ECT-style). See ``fastgen.methods.cm``.

``mode="ct"`` (consistency training) needs no teacher: none is built or checkpointed, and ``teacher_ckpt``, when
set, only initialises the student (Easy Consistency Tuning starts from a pretrained diffusion model).
``mode="cd"`` (consistency distillation) loads the teacher from ``teacher_ckpt`` and steps its ODE from ``t`` to
``r``. The gap ``r = ratio * t`` follows ``CTScheduleCallback`` (preset ``CT_SCHEDULE_CALLBACK``) when it is in
``trainer.callbacks``; otherwise ``ct_ratio`` stays fixed.

Typical use (see ``fastgen/configs/experiments/Digits/config_cm_digits.py``)::

    from fastgen.configs.methods.config_cm import create_config
    config = create_config()
    config.model.net = ...
    config.model.teacher_ckpt = "diffusion_model.pth"   # CT: the initialisation; CD: the teacher
    config.model.mode = "cd"
"""

from __future__ import annotations

from typing import Literal, Optional

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_distill import DistillModelConfig
from fastgen.configs.schema import config_class


@config_class
class CMModelConfig(DistillModelConfig):
    mode: Literal["ct", "cd"] = "ct"
    # r / t before a CTScheduleCallback sets model.ct_ratio (and throughout a run without one).
    ct_ratio: float = 0.5
    # ECT's optional n(t) = 1 + k sigmoid(-b t) in r = t (1 - (1 - ratio) n(t)) (Geng et al. 2024, Sec. 3); k = 0: off.
    ratio_k: float = 0.0
    ratio_b: float = 1.0
    distance: Literal["l2", "pseudo_huber"] = "pseudo_huber"
    huber_c: Optional[float] = None  # None: 0.00054 sqrt(D) (iCT)
    weighting: Literal["inverse_gap", "uniform"] = "inverse_gap"  # inverse_gap: w = 1 / (t - r) (ECT)
    # Training times: None takes the schedule's own distribution (EDM: log-normal P_mean/P_std; RF: logit-normal).
    t_dist: Optional[Literal["lognormal", "logit_normal", "tan_lognormal"]] = None
    t_mean: Optional[float] = None
    t_std: Optional[float] = None
    cd_solver: Literal["euler", "heun"] = "heun"  # the teacher's ODE step from t to r (CD only)


def _cm_class() -> DictConfig:
    return LazyCall("fastgen.methods.cm.CMModel")()


def create_config() -> BaseConfig:
    """A base CM config; experiment configs fill in the network, the checkpoint and the data."""
    return BaseConfig(model=CMModelConfig(), model_class=_cm_class())


__all__ = ["CMModelConfig", "create_config"]
