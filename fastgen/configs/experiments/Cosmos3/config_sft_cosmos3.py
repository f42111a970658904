"""Fine-tune Cosmos3-Nano's generator (NVIDIA 2026; the ``Cosmos3OmniTransformer`` of ``nvidia/Cosmos3-Nano``, 8B
understanding + 8B generation streams) on your own captioned videos: supervised flow matching (the SFT method) of
text-to-video at 480x832, 93 frames - the teacher a DMD2 run (``Cosmos3/config_dmd2_cosmos3``) then distils.

    fastgen train --nnodes 2 --nproc-per-node 8 --config Cosmos3/config_sft_cosmos3 - model.pretrained_model_path=/weights/Cosmos3-Nano

The network starts from the pipeline folder (``model.pretrained_model_path``: its ``transformer/config.json``
decides the architecture, its ``text_tokenizer/`` makes the null condition) and trains on WebDataset shards of
``latent.npy`` (Wan 2.2's normalised ``48 x 24 x 30 x 52`` latents: ``fastgen.networks.cosmos3_codec``) and
``text.npy`` (the prompt's ids in the pipeline's templates for 93 frames of 480x832 at 24 fps, through the model's
token embedding table, zero-padded to 512 tokens: ``Cosmos3Codec(num_frames=93, height=480, width=832)``). 10% of
the captions are dropped for classifier-free guidance: the null condition is the pipeline's negative prompt
(``""`` with the inverse templates), tokenised for the sample's size (``fastgen.networks.cosmos3``). Video only:
the model's sound stream trains too with ``model.modality_shapes = {"video": [48, 24, 30, 52], "audio": [64, 97]}``
and shards holding the sound latents (``real.audio``: ``audio_latent.npy``, which ``fastgen encode-data`` writes from
clips with sound when the folder has a sound tokenizer). An EMA (beta 0.9999);
FSDP2 on a meta-device build, bfloat16 autocast, activation checkpointing over the 36 decoder layers; AdamW at
1e-5. The reasoner's parts no video prediction depends on (LM head, token table, the last layer's text-only
parts, the action heads: 1.45B parameters) are frozen.

Memory per rank, an **estimate** (``fastgen dryrun``; not measured - no GPU was lent to this project; the
architecture checked against public sources, ``fastgen.configs.net_cosmos3``): 15,173,669,120 parameters,
13,727,537,280 of them trained; 33.4 GiB of state per rank on 8 ranks (the network and its EMA, gradients, Adam)
and 4.23 GiB on 64. The training peak needs the data to trace.
"""

from __future__ import annotations

import os

from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import data_root
from fastgen.configs.experiments.diffusers_common import large_model_setting, prompts_path
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_cosmos3 import COSMOS3_NANO, cosmos3_latent_shape, cosmos3_transformer

NAME = "cosmos3_nano"
PROMPTS = 4
SHAPE = cosmos3_latent_shape(93, 480, 832)  # [48, 24, 30, 52]


def create_config() -> BaseConfig:
    net = cosmos3_transformer(COSMOS3_NANO, tokenizer=os.path.join(data_root(), "weights", NAME),
                              prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS, prompt_tokens=512)
    config = large_model_setting(sft_config(), NAME, net, SHAPE, PROMPTS)
    config.model.use_ema = True
    config.model.condition_dropout = 0.1
    config.model.net_optimizer.lr = 1e-5
    config.trainer.callbacks.update(EMA_CALLBACK)
    config.trainer.callbacks.ema.beta = 0.9999
    return config
