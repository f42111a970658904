"""CogVideoX-5b (THUDM, a 5B text-to-video expert-adaptive-LayerNorm DiT with T5-XXL text states; Yang et al. 2024)
distilled into a few-step 49-frame 480x720 generator with DMD2 - see
``fastgen.configs.experiments.diffusers_common`` for the weights, data and prompt files it reads.

Teacher, student and fake score are ``CogVideoXTransformer3DModel`` at CogVideoX-5b's size (``COGVIDEOX_5B``), on
16x13x60x90 latents (49 frames of 480x720 through its VAE: ``(49 - 1) / 4 + 1`` latent frames), on its own
discrete schedule (``cogvideox_schedule``: scaled-linear betas, v prediction, zero terminal SNR, no SNR shift -
CogVideoX-5b's ``scheduler_config.json``); 3-D rotary positions computed as its pipeline computes them. Text: T5's
last hidden states (4096 wide) of the prompt padded to 226 tokens (``fastgen encode-data`` writes them); 4
sample-grid prompts of 226 tokens. Classifier-free guidance 6 in the teacher's score (the pipeline's default
``guidance_scale``; plain CFG, ``use_dynamic_cfg`` off).

    fastgen encode-data clips/ $DATA_ROOT_DIR/cogvideox_5b_latents --weights /weights/CogVideoX-5b --resolution 480 --frames 49
    fastgen train --nnodes 8 --nproc-per-node 8 --config CogVideoX/config_dmd2_cogvideox - model.pretrained_model_path=/weights/CogVideoX-5b

``encode-data`` writes square clips (centre crop): train on them with ``- model.input_shape=[16,13,60,60]`` (the
rotary tables follow the latent size), or bring 480x720 shards of your own.

Memory per rank, an **estimate** (``fastgen dryrun``; not measured on a GPU): 5,570,283,072 parameters per network
(CogVideoX-5b's transformer); 23.4 GiB of state per rank on 8 ranks (weights of net, teacher and fake score,
gradients and Adam of the two trained ones) and 2.96 GiB on 64 (the command above). The training peak needs the
data to trace.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.diffusers_common import (
    diffusers_dmd2_setting,
    prompts_path,
)
from fastgen.configs.net_diffusers import COGVIDEOX_5B, cogvideox_transformer

NAME = "cogvideox_5b"
PROMPTS = 4


def create_config() -> BaseConfig:
    net = cogvideox_transformer(COGVIDEOX_5B, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS,
                                prompt_tokens=226)
    config = diffusers_dmd2_setting(NAME, net, [16, 13, 60, 90], PROMPTS)
    config.model.guidance_scale = 6.0
    return config
