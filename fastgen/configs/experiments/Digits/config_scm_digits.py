"""sCM on digits: continuous-time consistency distillation (sCD, Lu & Song 2024) of the shipped digits teacher
into a 1-step student. TrigFlow time runs on the teacher's own EDM parameterisation (no weight conversion); the
tangent ``d/dt F`` comes from forward-mode AD (``torch.func.jvp``), warmed up over the first 200 steps.

**Experimental**: its student does not reach fastgen's bar for a shipped recipe (1-step FD at most 3x the
35-evaluation teacher's 0.56). Measured at 5,000 samples (``benchmarks/quality.py``, commit d20d9e8): FD 3.43,
2.45 in two steps (accuracy 0.97) after these 1,000 iterations (2.24 before training noise was keyed by sample
index). Two rounds of experiments (docs/experiments/digits-quality.md): 2,500 iterations with an EMA of 0.99
plateau near 3 (3.01 at 5,000 samples); along 1,000 iterations the raw student swings more between checkpoints
250 iterations apart (2,000 samples: 3.27 -> 3.37, 2-step 1.56 -> 2.76) than a tangent warm-up over the whole run
or dropping the adaptive weighting moves it.

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
