"""Wan 2.1 text-to-video 1.3B (a rectified-flow video DiT) distilled into a few-step 480p generator with DMD2 -
see ``fastgen.configs.experiments.diffusers_common`` for the weights, data and prompt files it reads.

Teacher, student and fake score are ``WanTransformer3DModel`` at Wan2.1-T2V-1.3B's size (``WAN21_T2V_1_3B``), on
16x21x60x104 latents (81 frames of 480x832 through Wan's VAE), flow schedule with sampling shift 5; umT5 text
embeddings (4096 wide), 4 sample-grid prompts of 512 tokens; classifier-free guidance 5 in the teacher's score
(Wan's default).

    fastgen train --nproc-per-node 8 --config Wan/config_dmd2_wan - model.pretrained_model_path=/weights/Wan2.1-T2V-1.3B-Diffusers

Memory per rank, an **estimate** (``fastgen dryrun --nproc-per-node 8`` with 1-sample fake shards of these
shapes; not measured - no GPU was lent to this project): 6.05 GiB of state (weights, gradients, Adam) and a traced
training peak of 34.0 GiB at batch 1 per rank on 8 ranks.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.diffusers_common import diffusers_dmd2_setting, prompts_path
from fastgen.configs.net_diffusers import WAN21_T2V_1_3B, wan_transformer

NAME = "wan21_t2v_1_3b"
PROMPTS = 4


def create_config() -> BaseConfig:
    net = wan_transformer(WAN21_T2V_1_3B, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS,
                          prompt_tokens=512, shift=5.0)
    config = diffusers_dmd2_setting(NAME, net, [16, 21, 60, 104], PROMPTS)
    config.model.guidance_scale = 5.0
    return config
