"""DMD2 (Yin et al. 2024) on digits with DiT networks: a 1-step DiT student distilled from a DiT teacher.

The teacher is the EMA network of ``Digits/config_sft_dit_digits``; make it with::

    fastgen train --config Digits/config_sft_dit_digits - trainer.max_iter=4000 log_config.name=dit_teacher
    fastgen convert-ckpt FASTGEN_OUTPUT/fastgen/digits/dit_teacher/checkpoints/0004000.pth dit_teacher.pth --only ema
    fastgen train --config Digits/config_dmd2_dit_digits - model.teacher_ckpt=dit_teacher.pth

(``model.teacher_ckpt`` defaults to ``dit_teacher.pth`` in the working directory.) Student and fake score start
as copies of the teacher; the GAN head reads the frozen teacher's middle-block tokens as a ``(96, 4, 4)`` map
(``DiT.bottleneck_feature_index``). The method settings are those of ``Digits/config_dmd2_digits``, which were
tuned for the U-Net; they are not re-tuned for DiT (this recipe is checked to train, not to reach a quality).
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.config_dmd2_digits import (
    create_config as dmd2_digits,
)
from fastgen.configs.net_dit import dit_digits


def create_config() -> BaseConfig:
    config = dmd2_digits()
    config.model.net = dit_digits(num_classes=10)
    config.model.teacher_ckpt = "dit_teacher.pth"
    return config
