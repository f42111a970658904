"""Cosmos3-Nano's generator (NVIDIA 2026) distilled into a few-step 93-frame 480x832 text-to-video student with
DMD2 - see ``fastgen.configs.experiments.diffusers_common`` for the weights, data and prompt files it reads, and
``Cosmos3/config_sft_cosmos3`` for the data's layout.

    fastgen train --nnodes 8 --nproc-per-node 8 --config Cosmos3/config_dmd2_cosmos3 - model.pretrained_model_path=/weights/Cosmos3-Nano

Teacher, student and fake score are ``Cosmos3OmniTransformer`` at Nano's size (``COSMOS3_NANO``) on
``48 x 24 x 30 x 52`` latents, rectified flow with the pipeline's shift 5; the teacher is guided with scale 6 (the
pipeline's default ``guidance_scale``; plain CFG) against the null condition, which is the pipeline's negative
prompt tokenised from the folder's ``text_tokenizer/`` (``fastgen.networks.cosmos3``).

Memory per rank, an **estimate** (``fastgen dryrun``; not measured - no GPU was lent to this project; the
architecture checked against public sources, ``fastgen.configs.net_cosmos3``): 15,173,669,120 parameters per
network, 13,727,537,280 of them trained in the student and the fake score; 59.6 GiB of state per rank on 8 ranks
(weights of net, teacher and fake score, gradients and Adam of the two trained ones) and 7.54 GiB on 64. The
training peak needs the data to trace.
"""

from __future__ import annotations

import os

from fastgen.configs.config import BaseConfig
from fastgen.configs.data import data_root
from fastgen.configs.experiments.diffusers_common import diffusers_dmd2_setting, prompts_path
from fastgen.configs.net_cosmos3 import COSMOS3_NANO, cosmos3_latent_shape, cosmos3_transformer

NAME = "cosmos3_nano"
PROMPTS = 4


def create_config() -> BaseConfig:
    net = cosmos3_transformer(COSMOS3_NANO, tokenizer=os.path.join(data_root(), "weights", NAME),
                              prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS, prompt_tokens=512)
    config = diffusers_dmd2_setting(NAME, net, cosmos3_latent_shape(93, 480, 832), PROMPTS)
    config.model.guidance_scale = 6.0
    return config
