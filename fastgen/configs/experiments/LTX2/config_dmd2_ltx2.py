"""LTX-2 (19B; HaCohen et al. 2026) distilled into a few-step audio-visual generator with DMD2 on multimodal samples
(``fastgen.methods.dmd2``: the distribution-matching gradient per stream, each normalised by its own denoising
gap, the streams' losses summed; ``model.modality_loss_weights`` weighs them). Teacher, student and fake score are
``LTX2VideoTransformer3DModel`` at LTX-2's size (``LTX2_19B``) on 121 frames of 512x768 with 5 s of 16 kHz sound
(video latents ``128 x 16 x 16 x 24``, audio ``8 x 126 x 16``); the shards and prompts of ``LTX2/config_sft_ltx2``.
The teacher's score is guided as ``LTX2Pipeline`` guides by default (``teacher_x0``, combined as the pipeline combines
the passes: ``fastgen.methods.multimodal.pipeline_guided_x0``), so the student learns what the pipeline renders:
classifier-free guidance 3 for video and 7 for audio (``model.guidance_scale``, ``model.modality_guidance_scales``),
modality-isolation guidance 3 (``model.modality_isolation_scale``: one more teacher pass without the audio-video
cross-attention) and guidance rescale 0.7 (``model.guidance_rescale``; Lin et al. 2024). The pipeline's STG (scale
1 at block 28; arXiv 2411.18664) is off: ``LTX2_19B`` is LTX-2.0, whose blocks ignore it (no ``perturbed_attn``);
with an LTX-2.3 folder add ``model.stg_scale=1.0 model.stg_blocks=[28]`` (a fourth teacher pass). The teacher thus
runs 3 passes per score (4 with STG) instead of plain guidance's 2. DMD2's text-to-image settings otherwise
(``diffusers_dmd2_setting``).

    fastgen train --nnodes 8 --nproc-per-node 8 --config LTX2/config_dmd2_ltx2 - model.pretrained_model_path=/weights/LTX-2

Memory per rank, an **estimate** (``fastgen dryrun``; not measured on a GPU): 18,876,174,592 parameters per
network; 79.5 GiB of state per rank on 8 ranks (weights of net, teacher and fake score, gradients and Adam of the two
trained ones) and 10.3 GiB on 64; the training peak needs the data to trace.
"""

from __future__ import annotations

import os

from fastgen.configs.config import BaseConfig
from fastgen.configs.data import data_root, webdataset_loader
from fastgen.configs.experiments.diffusers_common import diffusers_dmd2_setting, prompts_path
from fastgen.configs.experiments.LTX2.config_sft_ltx2 import NAME, PROMPTS, SHAPES
from fastgen.configs.net_ltx2 import LTX2_19B, ltx2_transformer


def create_config() -> BaseConfig:
    net = ltx2_transformer(LTX2_19B, fps=24.0, prompt_embeddings=prompts_path(NAME), num_prompts=PROMPTS,
                           prompt_tokens=1024, video_seq_len=16 * 16 * 24)
    config = diffusers_dmd2_setting(NAME, net, SHAPES["video"], PROMPTS)
    config.model.modality_shapes = dict(SHAPES)
    config.model.guidance_scale = 3.0  # LTX2Pipeline's defaults (module docstring), STG aside
    config.model.modality_guidance_scales = {"audio": 7.0}
    config.model.modality_isolation_scale = 3.0
    config.model.guidance_rescale = 0.7
    config.dataloader_train = webdataset_loader(
        [f"WDS:{os.path.join(data_root(), NAME + '_latents')}"], batch_size=1,
        fields={"real.video": "latent.npy", "real.audio": "audio_latent.npy", "condition": "text.npy"})
    return config
