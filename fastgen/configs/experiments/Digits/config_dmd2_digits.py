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
samples (docs/experiments/dmd2-digits.md). Every learning rate decays linearly to a tenth over the run's 1,000
iterations (``MAX_ITER``), from 1.5x the constant rates the recipe had before (issue 21, second round, in
docs/experiments/digits-quality.md): with constant rates the EMA student was caught at a random point of a swing
(FD 1.25-1.90 over training seeds 0-2), with the decay it settles at the end (1.41-1.52). Change ``MAX_ITER`` here
rather than ``trainer.max_iter`` for a longer run, or the decay does not end with the run (the trainer warns);
``Digits/config_dmd2_digits_long`` is the tuned long run. This is what ``fastgen train`` runs when no ``--config``
is given.
"""

from __future__ import annotations

from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import decay_learning_rates, digits_distillation, shipped_teacher
from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config

__all__ = ["MAX_ITER", "create_config", "shipped_teacher"]

MAX_ITER = 1000


def create_config() -> BaseConfig:
    config = digits_distillation(dmd2_config(), max_iter=MAX_ITER, callbacks=EMA_CALLBACK)
    config.model.student_update_freq = 5
    config.model.gan_loss_weight_gen = 3e-2
    config.model.vsd_t_dist = "train"
    config.model.discriminator_features = "teacher"
    config.model.net_optimizer.lr = 4.5e-4
    config.model.fake_score_optimizer.lr = 1.2e-3
    config.model.discriminator_optimizer.lr = 6e-4
    decay_learning_rates(config, MAX_ITER)
    config.model.use_ema = True
    config.trainer.callbacks.ema.beta = 0.95
    return config
