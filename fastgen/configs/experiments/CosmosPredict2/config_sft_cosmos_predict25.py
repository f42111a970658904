"""Fine-tune Cosmos-Predict2.5-2B (NVIDIA 2025; diffusers' ``CosmosTransformer3DModel`` with its Qwen2.5-VL text
projection, ``fastgen.networks.cosmos_predict25``) on your own captioned videos: 93 frames at 704x1280, text to
world, supervised on the model's rectified-flow schedule (the SFT method).

    fastgen encode-data clips/ $DATA_ROOT_DIR/cosmos_predict25_2b_latents --weights /weights/Cosmos-Predict2.5-2B --resolution 704 --frames 93
    fastgen train --nnodes 4 --nproc-per-node 8 --config CosmosPredict2/config_sft_cosmos_predict25 - model.pretrained_model_path=/weights/Cosmos-Predict2.5-2B
    fastgen convert-ckpt RUN cosmos_predict25_finetuned --to diffusers --only ema --steps 36

**Captions are encoded every step** (``model.encode_batches = True``): the model's text condition is every
Qwen2.5-VL-7B layer's normalised state of the 512-token chat-templated prompt, concatenated - 512 x 100,352 values,
about 98 MiB a caption in bfloat16 - which no shard format can hold per caption. ``encode-data`` therefore writes
the Wan 2.1 latents (``16 x 24 x 88 x 160`` for 93 frames; ``- model.input_shape=[16,24,88,88]`` for its square
crops) and the captions only (``CosmosPredict25Codec.text_in_shards``), and each rank's batch of captions goes
through the folder's text encoder (sharded with FSDP2 like a teacher; its memory is below).

The network starts from the pipeline folder (``model.pretrained_model_path``; ``transformer/config.json`` decides
the architecture: Cosmos-Predict2.5-14B's folder trains 14B). Schedule: rectified flow at the model's ``timestep =
sigma``, logit-normal training times, sampling shift 5 (the Predict 2.5 training config's; an ODE export needs
``shift=1.0``, ``fastgen.configs.net_cosmos_predict25``). 20% of the captions are dropped for classifier-free
guidance (the Predict 2.5 training config's text dropout; fastgen's null condition is zero states, the pipeline
guides against an encoded negative prompt). Each step draws text to world (every latent
frame generated), image to world (the first latent frame given clean at the pipeline's ``conditional_frame_timestep``
1e-4) or video to world (the first two), the same on every rank (``model.conditioning_frames = [0, 1, 2]``), as the
released model was trained on a mix of the three; ``- model.conditioning_frames=0`` trains text to world alone.
The EMA (beta 0.9999) is what ``--only ema`` exports to ``Cosmos2_5_PredictBasePipeline``. FSDP2 on a meta-device
build, bfloat16 autocast, activation checkpointing over the 28 blocks; AdamW at 1e-5. One prompt in the label bank
(``$DATA_ROOT_DIR/cosmos_predict25_2b_prompts.safetensors``, ``(1, 512, 100352)``: 196 MiB in float32, held whole
by every rank) for the W&B samples.

Memory per rank, an **estimate** (``fastgen dryrun --nproc-per-node 8`` and ``--nnodes 8 --nproc-per-node 8``; not
measured - no GPU was lent to this project; the architecture verified, ``fastgen.configs.net_cosmos_predict25``):
2,059,174,912 parameters (Predict2-2B's blocks and the 100,352 -> 1024 text projection, 102,761,472); 5.18 GiB of
state per rank on 8 ranks (the network and its EMA, gradients, Adam, and each copy's 196 MiB prompt bank, held whole)
and 1006 MiB on 64. The codec's sharded Qwen2.5-VL-7B (about 8.3B parameters in bfloat16) adds about 1.9 GiB on 8
ranks and 250 MiB on 64 - a hand estimate, not dryrun's. The 84,480 tokens of a 93-frame clip make activations the
larger part: the training peak needs the data to trace.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.data import data_root, webdataset_loader
from fastgen.configs.experiments.CosmosPredict2.config_sft_cosmos_predict2 import fine_tune
from fastgen.configs.experiments.diffusers_common import large_model_setting, prompts_path
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_cosmos_predict25 import (
    COSMOS_PREDICT25_2B,
    cosmos_predict25_latent_shape,
    cosmos_predict25_transformer,
)

NAME = "cosmos_predict25_2b"
PROMPTS = 1
SHAPE = cosmos_predict25_latent_shape(93, 704, 1280)  # [16, 24, 88, 160]


def on_the_fly_captions(config: BaseConfig, name: str) -> BaseConfig:
    """``encode-data``'s latents of ``$DATA_ROOT_DIR/<name>_latents`` with their captions (``txt``), the captions
    encoded each step by the weights folder's codec (``model.encode_batches``; the module docstring says why)."""
    import os

    config.model.encode_batches = True
    config.dataloader_train = webdataset_loader([f"WDS:{os.path.join(data_root(), name + '_latents')}"],
                                                batch_size=config.dataloader_train.batch_size,
                                                fields={"real": "latent.npy", "condition": "txt"})
    return config


def create_config() -> BaseConfig:
    net = cosmos_predict25_transformer(COSMOS_PREDICT25_2B, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS)
    config = on_the_fly_captions(large_model_setting(sft_config(), NAME, net, SHAPE, PROMPTS), NAME)
    config = fine_tune(config, dropout=0.2, sample_steps=36)
    config.model.conditioning_frames = [0, 1, 2]  # text, image and video to world, one drawn per step
    return config
