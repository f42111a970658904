"""Fine-tune LTX-2 (19B; HaCohen et al. 2026, "LTX-2: Efficient Joint Audio-Visual Foundation Model") on your own
captioned clips with sound: supervised diffusion training of both streams at once (the SFT method on a multimodal
sample, ``model.modality_shapes``), the teacher a DMD2 run then distills.

    fastgen train --nnodes 8 --nproc-per-node 8 --config LTX2/config_sft_ltx2 - model.pretrained_model_path=/weights/LTX-2
    fastgen convert-ckpt RUN ltx2_finetuned --to diffusers --only ema --steps 30

The network starts from the weights folder (``model.pretrained_model_path``; its ``transformer/config.json``
decides the architecture) and trains on WebDataset shards of LTX-2's latents - per clip a ``latent.npy`` (the video
VAE's normalised ``128 x 16 x 16 x 24`` latents of 121 frames of 512x768), an ``audio_latent.npy`` (the audio VAE's
normalised ``8 x 126 x 16``: 121 / 24 s of 16 kHz sound) and a ``text.npy`` (Gemma-3 through the text connectors,
1024 tokens, the video and audio embeddings side by side: ``fastgen.networks.ltx2_codec``); the two latents nest
into one sample (``real.video`` / ``real.audio`` fields). ``fastgen encode-data`` writes them from captioned clips
with sound (``--resolution 768x512 --frames 121``; the log-mel front end and audio VAE: ``fastgen.datasets.encode``). Both streams share each sample's time (``model.modality_times
= "independent"`` trains each at its own). Sampling: LTX-2's shift for 6144 video tokens, its terminal time 0.1.
10% of the captions are dropped for classifier-free guidance (the null condition: zero embeddings); an EMA (beta
0.9999) is what ``--only ema`` exports. Sampling (``fastgen sample``) and the export guide as ``LTX2Pipeline`` does by
default: guidance 3 for video, 7 for audio, modality-isolation guidance 3 and guidance rescale 0.7 (the run's
``model.guidance_scale``, ``modality_guidance_scales``, ``modality_isolation_scale``, ``guidance_rescale``); its STG
(scale 1 at block 28, arXiv 2411.18664) is off, as LTX-2.0's blocks (``LTX2_19B``, no ``perturbed_attn``) ignore it -
with an LTX-2.3 folder add ``model.stg_scale=1.0 model.stg_blocks=[28]``. FSDP2 on a meta-device build, bfloat16 autocast, activation checkpointing;
AdamW at 1e-5.

Memory per rank, an **estimate** (``fastgen dryrun``; not measured on a GPU): 18,876,174,592 parameters per network
(``LTX2_19B``, checked against public sources); 44.2 GiB of state per rank on 8 ranks (the network and
its EMA, gradients, Adam) and 5.74 GiB on 64; the training peak needs the data to trace.
"""

from __future__ import annotations

import os

from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import data_root, webdataset_loader
from fastgen.configs.experiments.diffusers_common import large_model_setting, prompts_path
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net_ltx2 import LTX2_19B, ltx2_modality_shapes, ltx2_transformer

NAME = "ltx2_19b"
PROMPTS = 4
SHAPES = ltx2_modality_shapes(512, 768, 121, 24.0)  # video [128, 16, 16, 24], audio [8, 126, 16]


def create_config() -> BaseConfig:
    net = ltx2_transformer(LTX2_19B, fps=24.0, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS,
                           prompt_tokens=1024, video_seq_len=16 * 16 * 24)
    config = large_model_setting(sft_config(), NAME, net, SHAPES["video"], PROMPTS)
    config.model.modality_shapes = SHAPES
    config.dataloader_train = webdataset_loader(
        [f"WDS:{os.path.join(data_root(), NAME + '_latents')}"], batch_size=1,
        fields={"real.video": "latent.npy", "real.audio": "audio_latent.npy", "condition": "text.npy"})
    config.model.use_ema = True
    config.model.guidance_scale = 3.0  # LTX2Pipeline's default guidance (module docstring), STG aside
    config.model.modality_guidance_scales = {"audio": 7.0}
    config.model.modality_isolation_scale = 3.0
    config.model.guidance_rescale = 0.7
    config.model.condition_dropout = 0.1
    config.model.net_optimizer.lr = 1e-5
    config.trainer.callbacks.update(EMA_CALLBACK)
    config.trainer.callbacks.ema.beta = 0.9999
    return config
