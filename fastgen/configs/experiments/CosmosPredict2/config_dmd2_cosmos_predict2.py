"""Cosmos-Predict2-2B-Text2Image (NVIDIA 2025) distilled into a one-step 768x1360 text-to-image student with DMD2 -
see ``fastgen.configs.experiments.diffusers_common`` for the weights, data and prompt files it reads, and
``CosmosPredict2/config_sft_cosmos_predict2`` for the data's layout.

    fastgen train --nnodes 8 --nproc-per-node 8 --config CosmosPredict2/config_dmd2_cosmos_predict2 - model.pretrained_model_path=/weights/Cosmos-Predict2-2B-Text2Image
    fastgen convert-ckpt RUN cosmos_predict2_dmd2 --to diffusers

Teacher, student and fake score are ``CosmosTransformer3DModel`` at the 2B size (``COSMOS_PREDICT2_2B_T2I``) on
``16 x 96 x 170`` latents, on the model's schedule (``EDMFlowScheduler``); the teacher is guided with the pipeline's
default ``guidance_scale`` 7, which in fastgen's ``u + s (c - u)`` is ``s = 8`` (the pipeline adds ``g (c - u)`` to
``c``), against the null condition (zero states). The student samples in one step from ``sigma_max = 80``; its
export to ``Cosmos2TextToImagePipeline`` takes that step and stops at ``sigma_min`` as the pipeline always does
(``x0 + 0.002 (x_T - x0) / 80``: within a level of 8-bit pixels of fastgen's sample). A multi-step student
(``model.t_list``) trains and samples in fastgen, but the pipeline's scheduler cannot re-noise between its steps.

Memory per rank, an **estimate** (``fastgen dryrun``; not measured - no GPU was lent to this project; the
architecture verified, ``fastgen.configs.net_cosmos_predict2``): 1,956,405,248 parameters per network; 8.22
GiB of state per rank on 8 ranks (weights of net, teacher and fake score, gradients and Adam of the two trained ones)
and 1.05 GiB on 64; with ``COSMOS_PREDICT2_14B_T2I`` (14,265,265,152 parameters) 59.8 GiB and 7.50 GiB. The training
peak needs the data to trace.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.diffusers_common import diffusers_dmd2_setting, prompts_path
from fastgen.configs.net_cosmos_predict2 import (
    COSMOS_PREDICT2_2B_T2I,
    cosmos_predict2_latent_shape,
    cosmos_predict2_transformer,
)

NAME = "cosmos_predict2_2b"
PROMPTS = 4


def create_config() -> BaseConfig:
    net = cosmos_predict2_transformer(COSMOS_PREDICT2_2B_T2I, prompt_embeddings=prompts_path(NAME),
                                      num_prompts=PROMPTS)
    config = diffusers_dmd2_setting(NAME, net, cosmos_predict2_latent_shape(1, 768, 1360), PROMPTS)
    config.model.guidance_scale = 8.0
    return config
