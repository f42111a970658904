"""Quick-start: distill the shipped digits teacher into a 1-step student with DMD2.

The teacher (``fastgen/assets/digits_teacher.pth``) is the EMA network of ``Digits/config_sft_digits`` trained
for 4,000 iterations; reproduce it with::

    fastgen train --config Digits/config_sft_digits - trainer.max_iter=4000 log_config.name=teacher
    fastgen convert-ckpt FASTGEN_OUTPUT/fastgen/digits/teacher/checkpoints/0004000.pth teacher.pth --only ema

The student and the fake score start as copies of the teacher; the fake score and the GAN head (on the frozen
teacher's bottleneck features, as the reference implementation attaches it; trained on real digits) take four
steps for each student step. Samples come from an EMA of the student (beta 0.95 per student update). The
settings were chosen by sweeping learning rates, GAN weight and features, critic steps, noise-level
distribution, DMD's regression loss, several noisings per sample, batch size and iterations, scored with 5,000
samples (README, "Quick start"). They are tuned for 1,000 iterations: with these constant learning rates a longer
run (``trainer.max_iter=4000``) does not improve and drifts towards sharper, less varied digits. This is what
``fastgen train`` runs when no ``--config`` is given.
"""

from __future__ import annotations

from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import digits_distillation, shipped_teacher
from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config

__all__ = ["create_config", "shipped_teacher"]


def create_config() -> BaseConfig:
    config = digits_distillation(dmd2_config(), callbacks=EMA_CALLBACK)
    config.model.student_update_freq = 5
    config.model.gan_loss_weight_gen = 3e-2
    config.model.vsd_t_dist = "train"
    config.model.discriminator_features = "teacher"
    config.model.net_optimizer.lr = 3e-4
    config.model.fake_score_optimizer.lr = 8e-4
    config.model.discriminator_optimizer.lr = 4e-4
    config.model.use_ema = True
    config.trainer.callbacks.ema.beta = 0.95
    return config
