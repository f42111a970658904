"""sCM on digits: continuous-time consistency distillation (sCD, Lu & Song 2024) of the shipped digits teacher
into a 1-step student. TrigFlow time runs on the teacher's own EDM parameterisation (no weight conversion); the
tangent ``d/dt F`` comes from forward-mode AD (``torch.func.jvp``), warmed up over the first 200 steps.

**Experimental**: its student does not reach fastgen's bar for a shipped recipe (1-step FD at most 3x the
35-evaluation teacher's 0.56). Measured at 5,000 samples: FD 2.24 (accuracy 0.98) after these 1,000 iterations.
What helped consistency distillation (``Digits/config_cm_digits``) does not help here: 2,500 iterations with an
EMA of 0.99 score 3.01, and along that run (2,000 samples) the EMA network reads 4.46, 3.07, 2.88, 3.00, 2.90
at 500-2,500 iterations: training plateaus.

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
