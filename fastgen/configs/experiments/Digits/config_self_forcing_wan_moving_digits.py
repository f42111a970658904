"""Self-Forcing (Huang et al. 2025) with Wan networks on moving digits: a 2-step block-causal Wan student
(``causal_wan_transformer``: diffusers' ``WanTransformer3DModel`` with block-causal self-attention over 4 chunks of
2 frames and a KV cache; Yin et al. 2025, Sec. 3.1) trained on its own chunk-by-chunk rollouts with DMD2 against
the bidirectional Wan teacher of ``Digits/config_sft_wan_moving_digits`` (teacher and fake score the stock
``wan_transformer``; the student starts as the teacher's copy - same parameter names - its attention made
block-causal). Make the teacher first::

    fastgen train --config Digits/config_sft_wan_moving_digits - log_config.name=wan_video_teacher
    fastgen convert-ckpt FASTGEN_OUTPUT/fastgen/moving_digits/wan_video_teacher wan_video_teacher.pth --only ema
    fastgen train --config Digits/config_self_forcing_wan_moving_digits - model.teacher_ckpt=wan_video_teacher.pth

``WAN_MOVING_DIGITS`` (0.31M parameters, pixel space, labels through 10 stand-in prompts), rectified flow
unshifted as the teacher was trained. Otherwise the settings of ``Digits/config_self_forcing_moving_digits``:
student times ``[1.0, 0.5]``, finished chunks cached clean, ``student_update_freq`` 5, student and fake score at
1e-4, no GAN.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.config_self_forcing_moving_digits import create_config as dit_self_forcing
from fastgen.configs.net_diffusers import WAN_MOVING_DIGITS, causal_wan_transformer, wan_transformer


def create_config() -> BaseConfig:
    config = dit_self_forcing()
    config.model.net = causal_wan_transformer(WAN_MOVING_DIGITS, chunk_frames=2, num_prompts=10, shift=1.0)
    config.model.teacher = wan_transformer(WAN_MOVING_DIGITS, num_prompts=10, shift=1.0)
    config.model.fake_score = wan_transformer(WAN_MOVING_DIGITS, num_prompts=10, shift=1.0)
    config.model.teacher_ckpt = "wan_video_teacher.pth"
    return config
