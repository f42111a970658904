"""Consistency model on digits, Easy Consistency Tuning (Geng et al. 2024): consistency training started from
the shipped digits teacher, with ECT's curriculum ``r = t (1 - 1/2^(stage+1))`` (``CTScheduleCallback``, a new
stage every 200 steps at batch 64) and ECT's log-normal time proposal.

No teacher network is kept (``mode="ct"``: the checkpoint only initialises the student). Consistency
*distillation* from the same teacher: ``- model.mode=cd``. Two-step sampling: ``- model.t_list=[80.0,0.8]``.
"""

from __future__ import annotations

from fastgen.configs.callbacks import CT_SCHEDULE_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import digits_distillation
from fastgen.configs.methods.config_cm import create_config as cm_config


def create_config() -> BaseConfig:
    config = digits_distillation(cm_config(), callbacks=CT_SCHEDULE_CALLBACK)
    config.model.mode = "ct"
    config.model.t_mean = -1.1  # ECT's proposal ln(t) ~ N(-1.1, 2.0^2)
    config.model.t_std = 2.0
    config.model.net_optimizer.lr = 1e-4
    config.trainer.callbacks.ct_schedule.kimg_per_stage = 12.8
    return config
