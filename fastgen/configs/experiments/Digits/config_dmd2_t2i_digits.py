"""Digits text to image, distilled: DMD2 (Yin et al. 2024) turns the shipped digits text-to-image teacher
(``fastgen/assets/digits_t2i``, a ``StableDiffusionPipeline`` folder built by ``scripts/build_digits_t2i.py``; see
``Digits/config_sft_t2i_digits``) into a 1-step student on a CPU, then ``convert-ckpt --to diffusers`` makes it a
pipeline diffusers runs:

    fastgen train -c Digits/config_dmd2_t2i_digits
    fastgen sample FASTGEN_OUTPUT/fastgen/digits/config_dmd2_t2i_digits --ema --prompt "a handwritten seven"
    fastgen convert-ckpt FASTGEN_OUTPUT/fastgen/digits/config_dmd2_t2i_digits digits_1step --to diffusers

The student is conditioned like the teacher, on the text encoder's tokens; it trains on the digits' labels, each
picking its prompt "a handwritten <digit>" from the folder's ``prompts.safetensors`` (the prompt bank), so no
encoded data set is needed. No GAN branch: it would need real latents. Guidance 2 in the teacher's score (against
the zero embedding the teacher was trained to drop captions to).
"""

from __future__ import annotations

import os

from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import (
    decay_learning_rates,
    digits_distillation,
)
from fastgen.configs.experiments.Digits.config_sft_t2i_digits import (
    shipped_pipeline,
    t2i_net,
)
from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config

MAX_ITER = 1000


def create_config() -> BaseConfig:
    folder = os.path.normpath(shipped_pipeline())
    config = digits_distillation(dmd2_config(), max_iter=MAX_ITER, callbacks=EMA_CALLBACK, net=t2i_net(folder))
    config.model.teacher_ckpt = None
    config.model.pretrained_model_path = folder
    config.model.input_shape = [4, 4, 4]
    config.model.sample_steps = 25
    config.model.guidance_scale = 2.0
    config.model.gan_loss_weight_gen = 0.0
    config.model.student_update_freq = 5
    config.model.net_optimizer.lr = 2e-4
    config.model.fake_score_optimizer.lr = 5e-4
    decay_learning_rates(config, MAX_ITER)
    config.model.use_ema = True
    config.trainer.callbacks.ema.beta = 0.95
    return config
