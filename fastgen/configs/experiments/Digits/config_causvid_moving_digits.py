"""CausVid (Yin et al. 2025) on moving digits: a 2-step block-causal student (4 chunks of 2 frames, KV cache)
trained with DMD2 on diffusion-forcing inputs - data videos noised to an independent student time per chunk -
against the bidirectional teacher of ``Digits/config_sft_video_dit_moving_digits`` (teacher and fake score
bidirectional). The student starts as the teacher's copy, or from the ODE initialisation
(``Digits/config_causal_kd_moving_digits``) as CausVid does::

    fastgen train --config Digits/config_causvid_moving_digits - model.teacher_ckpt=video_teacher.pth \\
        model.student_ckpt=FASTGEN_OUTPUT/fastgen/moving_digits/config_causal_kd_moving_digits

Sampling goes chunk by chunk over ``t_list = [1.0, 0.5]`` (x0, re-noise, x0), finished chunks cached clean. The
DMD2 settings of ``Digits/config_self_forcing_moving_digits``; only the student's training inputs differ.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import moving_digits_student
from fastgen.configs.methods.config_causvid import create_config as causvid_config


def create_config() -> BaseConfig:
    config = moving_digits_student(causvid_config())
    config.model.student_update_freq = 5
    config.model.fake_score_optimizer.lr = 1e-4
    return config
