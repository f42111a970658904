"""Fine-tune CogVideoX-5b on your own captioned videos (supervised diffusion training on its v-prediction
schedule, the SFT method) - the teacher a DMD2 run (``CogVideoX/config_dmd2_cogvideox``) then distills.

    fastgen encode-data clips/ $DATA_ROOT_DIR/cogvideox_5b_latents --weights /weights/CogVideoX-5b --resolution 480 --frames 49
    fastgen train --nnodes 2 --nproc-per-node 8 --config CogVideoX/config_sft_cogvideox - model.pretrained_model_path=/weights/CogVideoX-5b
    fastgen convert-ckpt RUN cogvideox_finetuned --to diffusers --only ema --steps 50

The network starts from the weights folder (``model.pretrained_model_path``; its ``transformer/config.json``
decides the architecture - CogVideoX-2b's folder trains 2b, but pass its schedule, ``COGVIDEOX_2B_SCHEDULER``) and
trains on ``encode-data`` shards: 16x13x60x90 latents (49 frames of 480x720; ``- model.input_shape=[16,13,60,60]``
for encode-data's square 480x480 clips) and T5's states of the prompt padded to 226 tokens. 10% of the captions
are dropped for classifier-free guidance (the null condition: zero states); an EMA (beta 0.9999) is what ``--only
ema`` exports, sampled by the pipeline's own ``CogVideoXDDIMScheduler`` (a step count that divides 1000). FSDP2 on
a meta-device build, bfloat16 autocast, activation checkpointing; AdamW at 1e-5 (as the SDXL fine-tune).

Memory per rank, an **estimate** (``fastgen dryrun``; not measured on a GPU): 13.0 GiB of state per rank on 8 ranks
(the network and its EMA, gradients, Adam) and 1.65 GiB on 64; the training peak needs the data to trace.
"""

from __future__ import annotations

from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.diffusers_common import (
    large_model_setting,
    prompts_path,
)
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_diffusers import COGVIDEOX_5B, cogvideox_transformer

NAME = "cogvideox_5b"
PROMPTS = 4


def create_config() -> BaseConfig:
    net = cogvideox_transformer(COGVIDEOX_5B, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS,
                                prompt_tokens=226)
    config = large_model_setting(sft_config(), NAME, net, [16, 13, 60, 90], PROMPTS)
    config.model.use_ema = True
    config.model.condition_dropout = 0.1
    config.model.net_optimizer.lr = 1e-5
    config.trainer.callbacks.update(EMA_CALLBACK)
    config.trainer.callbacks.ema.beta = 0.9999
    return config
