"""FLUX.1-dev (black-forest-labs, 12B rectified-flow MM-DiT) distilled into a 1-step 1024x1024 generator with
DMD2 - see ``fastgen.configs.experiments.diffusers_common`` for the weights, data and prompt files it reads.

Teacher, student and fake score are ``FluxTransformer2DModel`` at FLUX.1-dev's size (``FLUX1_DEV``), on 16x128x128
latents (1024x1024 images through Flux's VAE), flow schedule with sampling shift 3. FLUX.1-dev is
guidance-distilled: its guidance input is set to 3.5 (``flux_transformer(guidance=...)``) and classifier-free
guidance on top is off (``model.guidance_scale=null``). Text: T5-XXL token embeddings (4096 wide) with the
pooled CLIP vector packed in row 0 (``pack_flux_condition``); 8 sample-grid prompts of 512 tokens.

    fastgen train --nnodes 4 --nproc-per-node 8 --config Flux/config_dmd2_flux - model.pretrained_model_path=/weights/FLUX.1-dev

Low precision is FSDP2's mixed-precision policy (parameters all-gathered in bfloat16, gradients reduced in
float32, float32 master weights), not autocast: it halves the gathered blocks as well as the compute.

Memory per rank, an **estimate** (``fastgen dryrun`` with 1-sample fake shards of these shapes; not measured - no
GPU was lent to this project): on 4 nodes x 8 ranks, 12.7 GiB of state (weights, gradients, Adam) and a traced
training peak of 80.7 GiB at batch 1 per rank. On one node of 8 ranks the state alone is 50.1 GiB: plan 32 ranks.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.diffusers_common import diffusers_dmd2_setting, prompts_path
from fastgen.configs.net_diffusers import FLUX1_DEV, flux_transformer

NAME = "flux1_dev"
PROMPTS = 8


def create_config() -> BaseConfig:
    net = flux_transformer(FLUX1_DEV, guidance=3.5, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS,
                           prompt_tokens=512, shift=3.0)
    config = diffusers_dmd2_setting(NAME, net, [16, 128, 128], PROMPTS)
    config.model.guidance_scale = None
    config.model.precision_amp = None
    config.trainer.fsdp_param_dtype = "bfloat16"
    config.trainer.fsdp_reduce_dtype = "float32"
    return config
