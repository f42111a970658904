"""CausalSFT (diffusion forcing) of a block-causal video DiT on moving digits: 8-frame videos in 4 chunks of 2
frames, every chunk trained at its own noise level, so the network denoises a chunk given earlier chunks at any
level - the initialisation of chunk-by-chunk students (CausVid, Self-Forcing). Otherwise the settings of
``Digits/config_sft_wan_moving_digits`` (rectified flow, Adam 1e-3, batch 32, power EMA, 10% label dropout).

``causal_video_dit()``: patch 2 (32 tokens per frame), hidden 96, depth 4, 4 heads; 0.72M parameters.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import moving_digits_teacher
from fastgen.configs.methods.config_causal_sft import create_config as causal_sft_config
from fastgen.configs.net_dit import causal_video_dit


def create_config() -> BaseConfig:
    return moving_digits_teacher(causal_sft_config(), causal_video_dit())
