"""Self-Forcing (Huang et al. 2025) on moving digits: a 2-step block-causal student (4 chunks of 2 frames, KV
cache) trained on its own chunk-by-chunk rollouts with DMD2 against the bidirectional teacher of
``Digits/config_sft_video_dit_moving_digits`` (teacher and fake score bidirectional; the student starts as the
teacher's copy, its attention made block-causal). Make the teacher first (commands in that recipe's docstring),
then::

    fastgen train --config Digits/config_self_forcing_moving_digits - model.teacher_ckpt=video_teacher.pth

Student times ``[1.0, 0.5]`` (rectified flow): each chunk is x0 at t = 1, re-noised to 0.5, x0 again; the
finished chunk enters the cache clean. DMD2 settings of the digits recipe (``student_update_freq`` 5, fake score
and student at 1e-4 after the teacher's copy; no GAN). Measured in ``docs/experiments/moving-digits.md``.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import moving_digits_student
from fastgen.configs.methods.config_self_forcing import create_config as self_forcing_config


def create_config() -> BaseConfig:
    config = moving_digits_student(self_forcing_config())
    config.model.student_update_freq = 5
    config.model.fake_score_optimizer.lr = 1e-4
    return config
