"""Fine-tune SDXL 1.0 base on your own captioned images (supervised diffusion training, the SFT method) - the
teacher a DMD2 run (``SD/config_dmd2_sdxl``) then distills.

    fastgen encode-data photos/ $DATA_ROOT_DIR/sdxl_latents --weights /weights/sdxl --resolution 1024
    fastgen train --nproc-per-node 8 --config SD/config_sft_sdxl - model.pretrained_model_path=/weights/sdxl
    fastgen convert-ckpt RUN sdxl_finetuned --to diffusers --only ema

The network starts from the weights folder (``model.pretrained_model_path``; its ``unet/config.json`` decides the
architecture) and trains on ``encode-data`` shards: SDXL's latents and its packed condition (two CLIP encoders'
states, the pooled vector and each image's size-and-crop time ids). 10% of the captions are dropped for
classifier-free guidance; an EMA (beta 0.9999) is what ``--only ema`` exports. FSDP2 on a meta-device build,
bfloat16 autocast, activation checkpointing; AdamW at 1e-5 (diffusers' SDXL fine-tuning default).

Memory per rank, an **estimate** (``fastgen dryrun --nproc-per-node 8 -c SD/config_sft_sdxl``; not measured - no
GPU was lent to this project): 6.00 GiB of state per rank on 8 ranks (the network and its EMA, gradients, Adam)
and 785 MiB on 64; the training peak needs the data to trace.
"""

from __future__ import annotations

from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.diffusers_common import large_model_setting, prompts_path
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_diffusers import SDXL_UNET, sdxl_unet

NAME = "sdxl"
PROMPTS = 16


def create_config() -> BaseConfig:
    net = sdxl_unet(SDXL_UNET, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS, prompt_tokens=77)
    config = large_model_setting(sft_config(), NAME, net, [4, 128, 128], PROMPTS, batch_size=2)
    config.model.use_ema = True
    config.model.condition_dropout = 0.1
    config.model.net_optimizer.lr = 1e-5
    config.trainer.callbacks.update(EMA_CALLBACK)
    config.trainer.callbacks.ema.beta = 0.9999
    return config
