"""Consistency model on digits: consistency *distillation* from the shipped digits teacher (Song et al. 2023,
Algorithm 2: one Heun step of the teacher's ODE gives the earlier state), with Easy Consistency Tuning's
curriculum ``r = t (1 - 1/2^(stage+1))`` (Geng et al. 2024; ``CTScheduleCallback``, a new stage every 1,000 steps
at batch 64), ECT's log-normal time proposal ``ln t ~ N(-1.1, 2.0^2)``, 5,000 iterations and an EMA of the
student (constant 0.99) that samples come from (ECT evaluates its EMA too).

Measured (``benchmarks/quality.py --methods cm``, 5,000 samples, seed 0, 2 CPU cores): 1-step FD **1.225**,
accuracy 0.982, in 498 s of training; the teacher scores 0.560 with 35 evaluations and needs 25 evaluations to
match this student. The earlier setting - consistency *training* (``model.mode=ct``), 1,000 iterations, no EMA -
gave 3.49 (3.44 with the EMA, 3.42 as distillation with it): the length of training was what it lacked.

Consistency training from the same start: ``- model.mode=ct`` (no teacher is kept; the checkpoint only
initialises the student). Two-step sampling: ``- model.t_list=[80.0,0.8]``. ``ect_setting()`` is the earlier
1,000-iteration consistency-training setting (``Digits/config_tcm_digits`` builds on this recipe instead).
"""

from __future__ import annotations

from fastgen.configs.callbacks import CT_SCHEDULE_CALLBACK, EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import digits_distillation
from fastgen.configs.methods.config_cm import create_config as cm_config


def ect_setting(max_iter: int = 1000, callbacks: dict | None = None) -> BaseConfig:
    """ECT-style consistency training from the shipped teacher: a new curriculum stage every 200 steps."""
    config = digits_distillation(cm_config(), max_iter=max_iter, callbacks=callbacks or CT_SCHEDULE_CALLBACK)
    config.model.mode = "ct"
    config.model.t_mean = -1.1  # ECT's proposal ln(t) ~ N(-1.1, 2.0^2)
    config.model.t_std = 2.0
    config.model.net_optimizer.lr = 1e-4
    config.trainer.callbacks.ct_schedule.kimg_per_stage = 12.8
    return config


def create_config() -> BaseConfig:
    config = ect_setting(max_iter=5000, callbacks={**CT_SCHEDULE_CALLBACK, **EMA_CALLBACK})
    config.model.mode = "cd"
    config.model.use_ema = True
    config.trainer.callbacks.ema.beta = 0.99
    config.trainer.callbacks.ct_schedule.kimg_per_stage = 64.0  # five stages over the 5,000 steps, as over 1,000 before
    return config
