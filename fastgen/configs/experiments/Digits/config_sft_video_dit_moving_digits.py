"""SFT of a bidirectional video DiT on moving digits: the teacher of the causal students
(``Digits/config_self_forcing_moving_digits``). The network is ``causal_video_dit(causal=False)`` - the class and
parameter names of the causal students, so a student starts as its copy - on rectified flow; the settings of
``Digits/config_causal_sft_moving_digits`` otherwise (Adam 1e-3, batch 32, power EMA, 10% label dropout,
2,000 iterations). Make the teacher file with::

    fastgen train --config Digits/config_sft_video_dit_moving_digits - log_config.name=video_teacher
    fastgen convert-ckpt FASTGEN_OUTPUT/fastgen/moving_digits/video_teacher video_teacher.pth --only ema
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.config_causal_sft_moving_digits import create_config as causal_sft
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_dit import causal_video_dit


def create_config() -> BaseConfig:
    base = causal_sft()
    config = sft_config()
    config.model.net = causal_video_dit(causal=False)
    for key in ("input_shape", "num_classes", "use_ema", "sample_steps", "condition_dropout"):
        setattr(config.model, key, getattr(base.model, key))
    config.model.net_optimizer.lr = 1e-3
    config.dataloader_train = base.dataloader_train
    config.trainer = base.trainer
    config.log_config.group = "moving_digits"
    return config
