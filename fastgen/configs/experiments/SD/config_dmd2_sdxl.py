"""SDXL 1.0 base (a 2.6B epsilon-prediction latent U-Net with text-time micro-conditioning; Podell et al. 2023)
distilled into a 1-step 1024x1024 generator with DMD2 (Yin et al. 2024, Sec. 5.3 trains SDXL 1-/4-step students) -
see ``fastgen.configs.experiments.diffusers_common`` for the weights, data and prompt files it reads.

Teacher, student and fake score are ``UNet2DConditionModel`` at SDXL base's size (``SDXL_UNET``) on 4x128x128
latents, SD's discrete VP schedule; the condition is the two CLIP encoders' concatenated states (77 tokens, 2048
wide) with row 0 holding the pooled vector and the size-and-crop time ids (``pack_sdxl_condition``; ``fastgen
encode-data`` writes them per image); 16 sample-grid prompts; guidance 8 in the teacher's score (DMD2's SDXL
setting).

    fastgen encode-data photos/ $DATA_ROOT_DIR/sdxl_latents --weights /weights/sdxl --resolution 1024
    fastgen train --nproc-per-node 8 --config SD/config_dmd2_sdxl - model.pretrained_model_path=/weights/sdxl

Memory per rank, an **estimate** (``fastgen dryrun --nproc-per-node 8 -c SD/config_dmd2_sdxl``; not measured - no
GPU was lent to this project): 2,567,463,684 parameters per network (SDXL base's U-Net exactly), 10.8 GiB of state
per rank on 8 ranks (weights of net, teacher and fake score, gradients and Adam of the two trained ones); the
training peak needs the data to trace.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.diffusers_common import diffusers_dmd2_setting, prompts_path
from fastgen.configs.net_diffusers import SDXL_UNET, sdxl_unet

NAME = "sdxl"
PROMPTS = 16


def create_config() -> BaseConfig:
    net = sdxl_unet(SDXL_UNET, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS, prompt_tokens=77)
    config = diffusers_dmd2_setting(NAME, net, [4, 128, 128], PROMPTS, batch_size=2)
    config.model.guidance_scale = 8.0
    return config
