"""sCM on 2-D toy data: continuous-time consistency distillation (sCD, Lu & Song 2024) of an SFT toy teacher
into a 1-step MLP, in TrigFlow time on the teacher's own EDM parameterisation.

    fastgen train --config Toy/config_sft_toy - log_config.name=toy_teacher
    fastgen train --config Toy/config_scm_toy - model.teacher_ckpt=FASTGEN_OUTPUT/fastgen/toy/toy_teacher/checkpoints/0002000.pth

``model.mode=ct`` trains without a teacher network (sCT, the checkpoint only initialises the student);
``model.jvp=finite_difference`` replaces forward-mode AD by finite differences.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Toy.common import toy_setting
from fastgen.configs.methods.config_scm import create_config as scm_config


def create_config() -> BaseConfig:
    config = toy_setting(scm_config())
    config.model.mode = "cd"
    config.model.tangent_warmup_iters = 500
    config.model.net_optimizer.lr = 1e-4
    return config
