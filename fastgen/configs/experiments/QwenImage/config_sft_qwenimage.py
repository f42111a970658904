"""Fine-tune Qwen-Image on your own captioned images (supervised flow-matching training, the SFT method) - the
teacher a DMD2 run (``QwenImage/config_dmd2_qwenimage``) then distills.

    fastgen encode-data photos/ $DATA_ROOT_DIR/qwen_image_latents --weights /weights/Qwen-Image --resolution 1024
    fastgen train --nnodes 8 --nproc-per-node 8 --config QwenImage/config_sft_qwenimage - model.pretrained_model_path=/weights/Qwen-Image
    fastgen convert-ckpt RUN qwen_image_finetuned --to diffusers --only ema

The network starts from the weights folder (``model.pretrained_model_path``; its ``transformer/config.json``
decides the architecture) and trains on ``encode-data`` shards: Qwen-Image's 16x128x128 latents and Qwen2.5-VL's
zero-padded prompt states (the zero rows are the attention mask). 10% of the captions are dropped for
classifier-free guidance (the null condition: the text fully masked); an EMA (beta 0.9999) is what ``--only ema``
exports. FSDP2 on a meta-device build with bfloat16 mixed precision (float32 master weights), activation
checkpointing; AdamW at 1e-5 (as the SDXL fine-tune).

Memory per rank, an **estimate** (``fastgen dryrun``; not measured - no GPU was lent to this project): 47.7 GiB of
state per rank on 8 ranks (the network and its EMA, gradients, Adam) and 6.06 GiB on 64; the training peak needs
the data to trace.
"""

from __future__ import annotations

from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.diffusers_common import large_model_setting, prompts_path
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_diffusers import QWEN_IMAGE, qwenimage_transformer

NAME = "qwen_image"
PROMPTS = 8


def create_config() -> BaseConfig:
    net = qwenimage_transformer(QWEN_IMAGE, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS,
                                prompt_tokens=512, image_seq_len=64 * 64)
    config = large_model_setting(sft_config(), NAME, net, [16, 128, 128], PROMPTS)
    config.model.use_ema = True
    config.model.condition_dropout = 0.1
    config.model.net_optimizer.lr = 1e-5
    config.model.precision_amp = None
    config.trainer.fsdp_param_dtype = "bfloat16"
    config.trainer.fsdp_reduce_dtype = "float32"
    config.trainer.callbacks.update(EMA_CALLBACK)
    config.trainer.callbacks.ema.beta = 0.9999
    return config
