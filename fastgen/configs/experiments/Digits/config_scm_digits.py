"""sCM on digits: continuous-time consistency distillation (sCD, Lu & Song 2024) of the shipped digits teacher
into a 1-step student. TrigFlow time runs on the teacher's own EDM parameterisation (no weight conversion); the
tangent ``d/dt F`` comes from forward-mode AD (``torch.func.jvp``), warmed up over the first 200 steps.

Training without a teacher network (sCT, the teacher checkpoint only initialises the student):
``- model.mode=ct``. Finite-difference tangents: ``- model.jvp=finite_difference``.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import digits_distillation
from fastgen.configs.methods.config_scm import create_config as scm_config


def create_config() -> BaseConfig:
    config = digits_distillation(scm_config())
    config.model.mode = "cd"
    config.model.tangent_warmup_iters = 200
    config.model.net_optimizer.lr = 5e-5
    return config
