"""Fine-tune Cosmos-Predict2-2B-Video2World (NVIDIA 2025; diffusers' ``CosmosTransformer3DModel`` with a
condition-mask channel) on your own captioned videos: 93 frames at 704x1280 continued from their first frame, as
``Cosmos2VideoToWorldPipeline`` continues an image or a clip - supervised training on the model's schedule (the SFT
method) with the first latent frame, or the first two, of every video given clean (``model.conditioning_frames =
[1, 2]``: one drawn per step, the same on every rank; ``fastgen.networks.conditioning_frames``).

    fastgen encode-data clips/ $DATA_ROOT_DIR/cosmos_predict2_2b_v2w_latents --weights /weights/Cosmos-Predict2-2B-Video2World --resolution 704 --frames 93
    fastgen train --nnodes 4 --nproc-per-node 8 --config CosmosPredict2/config_sft_cosmos_predict2_video2world - model.pretrained_model_path=/weights/Cosmos-Predict2-2B-Video2World
    fastgen sample RUN --prompt "a robot arm stacks blocks" --image first_frame.png
    fastgen convert-ckpt RUN cosmos_predict2_v2w_finetuned --to diffusers --only ema --steps 35

The network starts from the pipeline folder (``model.pretrained_model_path``; ``transformer/config.json`` decides
the architecture: Cosmos-Predict2-14B-Video2World's folder trains 14B) and trains on ``encode-data`` shards: Wan
2.1's normalised ``16 x 24 x 88 x 160`` latents of 93 frames (``- model.input_shape=[16,24,88,88]`` for
encode-data's square crops) and T5-11B's states of the caption, 512 rows. The first latent frame - the clip's first
pixel frame, which the causal VAE encodes alone; the second: the next four - is given clean at the pipeline's
``sigma_conditioning`` (1e-4) and flagged in the condition mask; the others are noised on the model's schedule
(``EDMFlowScheduler``) and carry the loss. 10% of the captions are dropped for classifier-free guidance (the null
condition); the frames stay given, as the pipeline's negative pass keeps them. The EMA (beta 0.9999) is what ``--only ema`` exports to ``Cosmos2VideoToWorldPipeline``
(call it with ``image=`` or ``video=``); ``fastgen sample --image`` / ``--video`` samples the same way in fastgen.
FSDP2 on a meta-device build, bfloat16 autocast, activation checkpointing over the 28 blocks; AdamW at 1e-5. W&B
samples during training are text-to-world (no given frame: an all-zero condition mask).

Memory per rank, an **estimate** (``fastgen dryrun``; not measured - no GPU was lent to this project; the
architecture verified, ``fastgen.configs.net_cosmos_predict2``): 1,956,413,440 parameters (the text-to-image
model's and 8,192 patch-embedding weights for the mask channel); 4.57 GiB of state per rank on 8 ranks (the
network and its EMA, gradients, Adam) and 599 MiB on 64. The 84,480 tokens of a 93-frame clip (24 x 44 x 80 patches) make activations
the larger part: the training peak needs the data to trace.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.CosmosPredict2.config_sft_cosmos_predict2 import fine_tune
from fastgen.configs.experiments.diffusers_common import large_model_setting, prompts_path
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_cosmos_predict2 import (
    COSMOS_PREDICT2_2B_V2W,
    cosmos_predict2_latent_shape,
    cosmos_predict2_transformer,
)

NAME = "cosmos_predict2_2b_v2w"
PROMPTS = 4
SHAPE = cosmos_predict2_latent_shape(93, 704, 1280)  # [16, 24, 88, 160]


def create_config() -> BaseConfig:
    net = cosmos_predict2_transformer(COSMOS_PREDICT2_2B_V2W, prompt_embeddings=prompts_path(NAME),
                                      num_prompts=PROMPTS)
    config = fine_tune(large_model_setting(sft_config(), NAME, net, SHAPE, PROMPTS))
    config.model.conditioning_frames = [1, 2]  # an image or a 5-frame clip, one drawn per step
    return config
