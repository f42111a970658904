"""SFT of a small Wan network (diffusers' ``WanTransformer3DModel``, the Wan 2.1 video family) on moving digits:
8-frame videos of one digit gliding across an 8x16 canvas (``fastgen.datasets.moving_digits``), in pixel space,
rectified flow (Wan's schedule, unshifted), labels through a fixed bank of 10 random prompt embeddings, 10% label
dropout for guidance. The video family's CPU check: the run's per-frame digits FD falls from its initialisation
(``benchmarks/moving_digits.py``, measured in ``docs/experiments/moving-digits.md``), and its EMA network is the
bidirectional teacher for causal video students.

``WAN_MOVING_DIGITS``: patches ``(1, 2, 2)`` (256 tokens per video), 4 blocks of 4 heads x 16, FFN 256; 0.31M
parameters. Adam at 1e-3, batch 32, EDM2 power EMA, 25 Euler-Heun steps for samples.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import moving_digits_teacher
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_diffusers import WAN_MOVING_DIGITS, wan_transformer


def create_config() -> BaseConfig:
    return moving_digits_teacher(sft_config(), wan_transformer(WAN_MOVING_DIGITS, num_prompts=10, shift=1.0))
