"""Cosmos-Predict2.5-2B (NVIDIA 2025) distilled into a few-step 93-frame 704x1280 text-to-world generator with DMD2 -
see ``fastgen.configs.experiments.diffusers_common`` for the weights and prompt files it reads, and
``CosmosPredict2/config_sft_cosmos_predict25`` for the data: ``encode-data``'s latents and captions, the captions
encoded every step (``model.encode_batches``: the 100,352-wide text condition is not stored in shards).

    fastgen encode-data clips/ $DATA_ROOT_DIR/cosmos_predict25_2b_latents --weights /weights/Cosmos-Predict2.5-2B --resolution 704 --frames 93
    fastgen train --nnodes 8 --nproc-per-node 8 --config CosmosPredict2/config_dmd2_cosmos_predict25 - model.pretrained_model_path=/weights/Cosmos-Predict2.5-2B
    fastgen convert-ckpt RUN cosmos_predict25_dmd2 --to diffusers

Teacher, student and fake score are Predict 2.5's ``CosmosTransformer3DModel`` at the 2B size
(``COSMOS_PREDICT25_2B``) on ``16 x 24 x 88 x 160`` latents, on rectified flow with sampling shift 5; the teacher
is guided with the pipeline's default ``guidance_scale`` 7, which in fastgen's ``u + s (c - u)`` is ``s = 8`` (the
pipeline adds ``g (v_c - v_u)`` to ``v_c``), against the null condition (zero states). The student generates every
frame (text to world). Its export to ``Cosmos2_5_PredictBasePipeline`` needs times the exported
``FlowMatchEulerDiscreteScheduler`` reproduces (a uniform grid from 1: one step always; more steps with ``shift=1.0``).

Memory per rank, an **estimate** (``fastgen dryrun --nproc-per-node 8`` and ``--nnodes 8 --nproc-per-node 8``; not
measured - no GPU was lent to this project; the architecture verified, ``fastgen.configs.net_cosmos_predict25``):
2,059,174,912 parameters per network; 9.20 GiB of state per rank on 8 ranks (weights of net, teacher and fake score,
gradients and Adam of the two trained ones, the prompt banks) and 1.65 GiB on 64; the codec's sharded Qwen2.5-VL-7B
adds about 1.9 GiB and 250 MiB (a hand estimate). The training peak needs the data to trace.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.CosmosPredict2.config_sft_cosmos_predict25 import (
    NAME,
    PROMPTS,
    SHAPE,
    on_the_fly_captions,
)
from fastgen.configs.experiments.diffusers_common import diffusers_dmd2_setting, prompts_path
from fastgen.configs.net_cosmos_predict25 import COSMOS_PREDICT25_2B, cosmos_predict25_transformer


def create_config() -> BaseConfig:
    net = cosmos_predict25_transformer(COSMOS_PREDICT25_2B, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS)
    config = on_the_fly_captions(diffusers_dmd2_setting(NAME, net, SHAPE, PROMPTS), NAME)
    config.model.guidance_scale = 8.0
    return config
