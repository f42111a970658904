"""Stable Diffusion 1.5 (an 860M epsilon-prediction latent U-Net) distilled into a 1-step 512x512 generator with
DMD2, DMD2's own text-to-image setting (Yin et al. 2024, Sec. 5.3) - see
``fastgen.configs.experiments.diffusers_common`` for the weights, data and prompt files it reads.

Teacher, student and fake score are ``UNet2DConditionModel`` at SD 1.5's size (``SD15_UNET``, 859,520,964
parameters), on 4x64x64 latents, SD's discrete VP schedule (1000 steps, scaled-linear betas, epsilon prediction);
CLIP ViT-L text embeddings (77 tokens, 768 wide), 16 sample-grid prompts; guidance 1.75 in the teacher's score
(DMD2's SD 1.5 setting).

    fastgen train --nproc-per-node 8 --config SD/config_dmd2_sd15 - model.pretrained_model_path=/weights/stable-diffusion-v1-5

Memory per rank, an **estimate** (``fastgen dryrun --nproc-per-node 8`` with fake shards of these shapes; not
measured - no GPU was lent to this project): 3.61 GiB of state (weights, gradients, Adam) and a traced training
peak of 15.4 GiB at batch 4 per rank on 8 ranks (19.8 GiB without activation checkpointing).
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.diffusers_common import diffusers_dmd2_setting, prompts_path
from fastgen.configs.net_diffusers import SD15_UNET, sd_unet

NAME = "sd15"
PROMPTS = 16


def create_config() -> BaseConfig:
    net = sd_unet(SD15_UNET, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS, prompt_tokens=77)
    config = diffusers_dmd2_setting(NAME, net, [4, 64, 64], PROMPTS, batch_size=4)
    config.model.guidance_scale = 1.75
    return config
