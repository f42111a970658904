"""Consistency model on 2-D toy data, Easy Consistency Tuning style (Geng et al. 2024): consistency *training*
(no teacher network) started from an SFT toy model, with ECT's curriculum ``r = t (1 - 1/2^(stage+1))``.

    fastgen train --config Toy/config_sft_toy - log_config.name=toy_teacher
    fastgen train --config Toy/config_cm_toy - model.teacher_ckpt=FASTGEN_OUTPUT/fastgen/toy/toy_teacher/checkpoints/0002000.pth

``model.mode=cd`` distills the same checkpoint instead (consistency distillation with Heun teacher steps).
"""

from __future__ import annotations

from fastgen.configs.callbacks import CT_SCHEDULE_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Toy.common import toy_setting
from fastgen.configs.methods.config_cm import create_config as cm_config


def create_config() -> BaseConfig:
    config = toy_setting(cm_config(), callbacks=CT_SCHEDULE_CALLBACK)
    config.model.mode = "ct"
    config.model.t_mean = -1.1  # ECT's log-normal proposal
    config.model.t_std = 2.0
    config.model.net_optimizer.lr = 3e-4
    config.trainer.callbacks.ct_schedule.kimg_per_stage = 100.0  # a stage every ~390 steps: ratio 0.5 ... 0.984
    return config
