"""DMD2 on 2-D toy data: distill an SFT toy teacher (``Toy/config_sft_toy``) into a 1-step MLP generator.

    fastgen train --config Toy/config_sft_toy - log_config.name=toy_teacher
    fastgen train --config Toy/config_dmd2_toy - model.teacher_ckpt=FASTGEN_OUTPUT/fastgen/toy/toy_teacher/checkpoints/0002000.pth
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Toy.common import toy_setting
from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config


def create_config() -> BaseConfig:
    config = toy_setting(dmd2_config())
    config.model.student_update_freq = 5
    config.model.net_optimizer.lr = 3e-4
    config.model.fake_score_optimizer.lr = 3e-4
    return config
