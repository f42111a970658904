"""Cosmos-Predict2-2B-Video2World (NVIDIA 2025) distilled with DMD2 into a one-step video-to-world student: 93 frames
at 704x1280 continued from the first frame, or the first five, of a clip - see
``fastgen.configs.experiments.diffusers_common`` for the weights and prompt files it reads, and
``CosmosPredict2/config_sft_cosmos_predict2_video2world`` for the data (``encode-data --frames 93``).

    fastgen encode-data clips/ $DATA_ROOT_DIR/cosmos_predict2_2b_v2w_latents --weights /weights/Cosmos-Predict2-2B-Video2World --resolution 704 --frames 93
    fastgen train --nnodes 8 --nproc-per-node 8 --config CosmosPredict2/config_dmd2_cosmos_predict2_video2world - model.pretrained_model_path=/weights/Cosmos-Predict2-2B-Video2World
    fastgen sample RUN --prompt "a robot arm stacks blocks" --image first_frame.png
    fastgen convert-ckpt RUN cosmos_predict2_v2w_dmd2 --to diffusers

Teacher, student and fake score are ``CosmosTransformer3DModel`` at the 2B video-to-world size
(``COSMOS_PREDICT2_2B_V2W``: the condition-mask channel) on Wan 2.1's ``16 x 24 x 88 x 160`` latents, on the model's
schedule (``EDMFlowScheduler``). Every step gives all three networks the data's first latent frame, or its first two,
clean (``model.conditioning_frames = [1, 2]``: one count drawn per step, the same on every rank;
``fastgen.networks.conditioning_frames``); the distribution-matching loss and the fake score's denoising loss are
over the generated frames only. Video-to-world DMD2 has that loss alone: the GAN head and the regression loss stay
off (``DMD2Model`` refuses them with given frames). The teacher is guided with the pipeline's default
``guidance_scale`` 7 - in fastgen's ``u + s (c - u)`` ``s = 8`` - against the null condition (zero states), the
given frames kept in both halves as the pipeline's negative pass keeps them. The student generates in one step from
``sigma_max = 80``; its export to ``Cosmos2VideoToWorldPipeline`` (called with ``image=`` or ``video=``) takes that
step and stops at ``sigma_min`` as the pipeline always does. W&B samples during training are text-to-world (no
given frame).

Memory per rank, an **estimate** (``fastgen dryrun --nproc-per-node 8`` and ``--nnodes 8 --nproc-per-node 8``; not
measured - no GPU was lent to this project; the architecture verified, ``fastgen.configs.net_cosmos_predict2``):
1,956,413,440 parameters per network; 8.22 GiB of state per rank on 8 ranks (weights of net, teacher and fake score,
gradients and Adam of the two trained ones) and 1.05 GiB on 64. The 84,480 tokens of a 93-frame clip make
activations the larger part: the training peak needs the data to trace.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.CosmosPredict2.config_sft_cosmos_predict2_video2world import NAME, PROMPTS, SHAPE
from fastgen.configs.experiments.diffusers_common import diffusers_dmd2_setting, prompts_path
from fastgen.configs.net_cosmos_predict2 import COSMOS_PREDICT2_2B_V2W, cosmos_predict2_transformer


def create_config() -> BaseConfig:
    net = cosmos_predict2_transformer(COSMOS_PREDICT2_2B_V2W, prompt_embeddings=prompts_path(NAME),
                                      num_prompts=PROMPTS)
    config = diffusers_dmd2_setting(NAME, net, SHAPE, PROMPTS)
    config.model.guidance_scale = 8.0
    config.model.conditioning_frames = [1, 2]  # an image or a 5-frame clip, one drawn per step
    return config
