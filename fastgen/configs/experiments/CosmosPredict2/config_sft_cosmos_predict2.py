"""Fine-tune Cosmos-Predict2-2B-Text2Image (NVIDIA 2025; diffusers' ``CosmosTransformer3DModel``) on your own
captioned images at its pipeline's default 768x1360: supervised training on its own schedule (the SFT method) - the
teacher a DMD2 run (``CosmosPredict2/config_dmd2_cosmos_predict2``) then distils.

    fastgen encode-data photos/ $DATA_ROOT_DIR/cosmos_predict2_2b_latents --weights /weights/Cosmos-Predict2-2B-Text2Image --resolution 768
    fastgen train --nnodes 2 --nproc-per-node 8 --config CosmosPredict2/config_sft_cosmos_predict2 - model.pretrained_model_path=/weights/Cosmos-Predict2-2B-Text2Image
    fastgen convert-ckpt RUN cosmos_predict2_finetuned --to diffusers --only ema --steps 35

The network starts from the pipeline folder (``model.pretrained_model_path``: its ``transformer/config.json``
decides the architecture - Cosmos-Predict2-14B-Text2Image's folder trains 14B) and trains on ``encode-data`` shards:
Wan 2.1's normalised ``16 x 96 x 170`` latents (one frame, dropped: ``- model.input_shape=[16,96,96]`` for
encode-data's square 768x768 crops) and T5-11B's states of the caption, zero past its tokens, 512 rows. The schedule
is the model's (``EDMFlowScheduler``: EDM's ``sigma`` with rectified-flow preconditioning). 10% of the captions are
dropped for classifier-free guidance (the null condition: zero states); an EMA (beta 0.9999) is what ``--only ema``
exports, sampled by the pipeline's own scheduler (Karras sigmas; ``--steps`` is its ``num_inference_steps``, 35 by
default). FSDP2 on a meta-device build, bfloat16 autocast, activation checkpointing over the 28 blocks; AdamW at
1e-5 (as the other fine-tunes).

Memory per rank, an **estimate** (``fastgen dryrun``; not measured - no GPU was lent to this project; the
architecture verified, ``fastgen.configs.net_cosmos_predict2``): 1,956,405,248 parameters; 4.57 GiB of state
per rank on 8 ranks (the network and its EMA, gradients, Adam) and 599 MiB on 64; with ``COSMOS_PREDICT2_14B_T2I``
(14,265,265,152 parameters) 33.2 GiB and 4.17 GiB. The training peak needs the data to trace.
"""

from __future__ import annotations

from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.diffusers_common import large_model_setting, prompts_path
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_cosmos_predict2 import (
    COSMOS_PREDICT2_2B_T2I,
    cosmos_predict2_latent_shape,
    cosmos_predict2_transformer,
)

NAME = "cosmos_predict2_2b"
PROMPTS = 4
SHAPE = cosmos_predict2_latent_shape(1, 768, 1360)  # [16, 96, 170]


def fine_tune(config: BaseConfig, dropout: float = 0.1, sample_steps: int = 35) -> BaseConfig:
    """What the Cosmos Predict2 / 2.5 fine-tunes share: an EMA at beta 0.9999 (what ``--only ema`` exports),
    ``dropout`` of the captions for guidance, the learning rate 1e-5, ``sample_steps`` (the pipeline's default)."""
    config.model.use_ema = True
    config.model.condition_dropout = dropout
    config.model.net_optimizer.lr = 1e-5
    config.model.sample_steps = sample_steps
    config.trainer.callbacks.update(EMA_CALLBACK)
    config.trainer.callbacks.ema.beta = 0.9999
    return config


def create_config() -> BaseConfig:
    net = cosmos_predict2_transformer(COSMOS_PREDICT2_2B_T2I, prompt_embeddings=prompts_path(NAME),
                                      num_prompts=PROMPTS)
    return fine_tune(large_model_setting(sft_config(), NAME, net, SHAPE, PROMPTS))
