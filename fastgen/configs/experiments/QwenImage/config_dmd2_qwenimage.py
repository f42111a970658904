"""Qwen-Image (Qwen, a 20B rectified-flow MM-DiT with Qwen2.5-VL-7B text states; Wu et al. 2025) distilled into a
1-step 1024x1024 generator with DMD2 - see ``fastgen.configs.experiments.diffusers_common`` for the weights, data and
prompt files it reads.

Teacher, student and fake score are ``QwenImageTransformer2DModel`` at Qwen-Image's size (``QWEN_IMAGE``), on
16x128x128 latents (1024x1024 images through its VAE; 4096 packed tokens), flow schedule sampled as its pipeline
samples that size (dynamic shift e^mu = 2.0, last time stretched to 0.02; ``qwenimage_transformer``). Text:
Qwen2.5-VL's last hidden states (3584 wide) of the prompt in the pipeline's chat template, each prompt's own tokens
zero-padded to 512 (``fastgen encode-data`` writes them; the zero rows are masked out of the attention); 8
sample-grid prompts of 512 tokens. Classifier-free guidance 4 in the teacher's score (the pipeline's default
``true_cfg_scale``) against the null condition (the text fully masked); DMD2's teacher combines it linearly
(``fastgen.methods``), without the pipeline's per-token norm rescale, which ``fastgen sample --teacher`` and the
exported pipeline apply.

    fastgen encode-data photos/ $DATA_ROOT_DIR/qwen_image_latents --weights /weights/Qwen-Image --resolution 1024
    fastgen train --nnodes 8 --nproc-per-node 8 --config QwenImage/config_dmd2_qwenimage - model.pretrained_model_path=/weights/Qwen-Image

Low precision is FSDP2's mixed-precision policy (parameters all-gathered in bfloat16, gradients reduced in
float32, float32 master weights), not autocast, as for FLUX.1-dev.

Memory per rank, an **estimate** (``fastgen dryrun``; not measured - no GPU was lent to this project):
20,430,401,088 parameters per network (Qwen-Image's transformer exactly); 85.8 GiB of state per rank on 8 ranks
(weights of net, teacher and fake score, gradients and Adam of the two trained ones) - more than an 80 GB GPU holds
before any activation - and 10.9 GiB on 64 ranks (the command above). The training peak needs the data to trace.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.diffusers_common import diffusers_dmd2_setting, prompts_path
from fastgen.configs.net_diffusers import QWEN_IMAGE, qwenimage_transformer

NAME = "qwen_image"
PROMPTS = 8


def create_config() -> BaseConfig:
    net = qwenimage_transformer(QWEN_IMAGE, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS,
                                prompt_tokens=512, image_seq_len=64 * 64)
    config = diffusers_dmd2_setting(NAME, net, [16, 128, 128], PROMPTS)
    config.model.guidance_scale = 4.0
    config.model.precision_amp = None
    config.trainer.fsdp_param_dtype = "bfloat16"
    config.trainer.fsdp_reduce_dtype = "float32"
    return config
