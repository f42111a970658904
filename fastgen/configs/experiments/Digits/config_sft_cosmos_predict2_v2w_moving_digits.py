"""Video to world on a CPU: SFT of a small Cosmos Predict2 Video2World network (diffusers'
``CosmosTransformer3DModel`` with its condition-mask channel, ``COSMOS_PREDICT2_V2W_MOVING_DIGITS``, 307,520 parameters)
on moving digits in pixel space, the first frame of every video given clean (``model.conditioning_frames = 1``,
``fastgen.networks.conditioning_frames``) and the 7 after it generated - the check that a video-to-world model
learns to continue what it is given. Labels through a fixed bank of 10 random prompt embeddings, dropped 20% of the
time, so the network must also continue a digit from its first frame alone (``benchmarks/video_to_world_digits.py``
samples continuations of held-out videos with and without the label and scores them;
``docs/experiments/video-to-world-digits.md``).

    fastgen train --config Digits/config_sft_cosmos_predict2_v2w_moving_digits
    python benchmarks/video_to_world_digits.py --run FASTGEN_OUTPUT/fastgen/moving_digits/config_sft_cosmos_predict2_v2w_moving_digits

The model's own schedule (``EDMFlowScheduler``: EDM's sigma from 0.002 to 80, rectified-flow preconditioning), Adam
at 1e-3, batch 32, EDM2 power EMA, 25 sampling steps.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import moving_digits_teacher
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_cosmos_predict2 import COSMOS_PREDICT2_V2W_MOVING_DIGITS, cosmos_predict2_transformer


def create_config() -> BaseConfig:
    net = cosmos_predict2_transformer(COSMOS_PREDICT2_V2W_MOVING_DIGITS, text_tokens=1, num_prompts=10)
    config = moving_digits_teacher(sft_config(), net, condition_dropout=0.2)
    config.model.conditioning_frames = 1
    return config
