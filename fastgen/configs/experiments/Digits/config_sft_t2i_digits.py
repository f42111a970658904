"""Digits text to image, the teacher: a latent U-Net (``UNet2DConditionModel``, widths 32 / 64, cross-attention
to a small CLIP text encoder's tokens) on 4x4x4 VAE latents of scikit-learn's 8x8 digits, SD's discrete VP
schedule (epsilon prediction), trained with SFT on ``fastgen encode-data`` shards of the digits captioned "a
handwritten seven", "the digit 7", ... (``scripts/build_digits_t2i.py`` builds the VAE, the text encoder, the
shards and runs this recipe; its result ships as ``fastgen/assets/digits_t2i``).

    fastgen encode-data digits_captioned/ data/digits_t2i_latents --weights fastgen/assets/digits_t2i --resolution 8
    fastgen train -c Digits/config_sft_t2i_digits

Captions are dropped (zero embeddings) for 10% of the samples, for classifier-free guidance; the W&B grid shows
the ten prompts "a handwritten zero" ... "nine" (the folder's ``prompts.safetensors``), decoded by its VAE.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig

from fastgen.configs.callbacks import EMA_CALLBACK, GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import data_root, webdataset_loader
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_diffusers import sd_unet

TEACHER_UNET: dict[str, Any] = {
    "sample_size": 4, "in_channels": 4, "out_channels": 4, "layers_per_block": 1, "block_out_channels": [32, 64],
    "attention_head_dim": 8, "cross_attention_dim": 32, "norm_num_groups": 32,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
}
PROMPT_TOKENS = 24


def shipped_pipeline() -> str:
    """The digits text-to-image pipeline folder that ships with fastgen."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "assets", "digits_t2i")


def t2i_net(folder: str) -> DictConfig:
    """The teacher's architecture with the folder's ten digit prompts as the prompt bank (labels 0-9 pick them)."""
    return sd_unet(TEACHER_UNET, prompt_embeddings=os.path.join(folder, "prompts.safetensors"), num_prompts=10,
                   prompt_tokens=PROMPT_TOKENS)


def create_config() -> BaseConfig:
    folder = os.path.normpath(shipped_pipeline())
    config = sft_config()
    config.model.net = t2i_net(folder)
    config.model.pretrained_model_path = folder
    config.model.input_shape = [4, 4, 4]
    config.model.num_classes = 10  # text conditions from the data; labels (the prompt bank) for sample grids
    config.model.use_ema = True
    config.model.net_optimizer.lr = 5e-4
    config.model.sample_steps = 25
    config.model.condition_dropout = 0.1
    config.dataloader_train = webdataset_loader([f"WDS:{os.path.join(data_root(), 'digits_t2i_latents')}"],
                                                batch_size=128, fields={"real": "latent.npy", "condition": "text.npy"})
    config.trainer.max_iter = 6000
    config.trainer.logging_iter = 200
    config.trainer.save_ckpt_iter = 2000
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.ema.beta = 0.999
    config.trainer.callbacks.wandb.sample_iter = 2000
    config.trainer.callbacks.wandb.num_samples = 100
    config.log_config.group = "digits"
    return config
