"""Truncated consistency model on 2-D toy data (Lee et al. 2025): two runs of this recipe.

    fastgen train --config Toy/config_tcm_toy - model.teacher_ckpt=TEACHER log_config.name=tcm_stage1
    fastgen train --config Toy/config_tcm_toy - model.teacher_ckpt=TEACHER log_config.name=tcm_stage2 \\
        model.tcm_stage=2 model.stage1_ckpt=FASTGEN_OUTPUT/fastgen/toy/tcm_stage1/checkpoints/0002000.pth

``TEACHER`` is an SFT toy checkpoint (``fastgen train --config Toy/config_sft_toy``). Stage 1 is ECT-style
consistency training from it (as ``Toy/config_cm_toy``); stage 2 retrains on ``sigma in [t', 80]`` with
``t' = 1`` and the frozen stage-1 model as the boundary.
"""

from __future__ import annotations

from fastgen.configs.callbacks import CT_SCHEDULE_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Toy.common import toy_setting
from fastgen.configs.methods.config_tcm import create_config as tcm_config


def create_config() -> BaseConfig:
    config = toy_setting(tcm_config(), callbacks=CT_SCHEDULE_CALLBACK)
    config.model.mode = "ct"
    config.model.t_mean = -1.1
    config.model.t_std = 2.0
    config.model.t_prime = 1.0
    config.model.net_optimizer.lr = 3e-4
    return config
