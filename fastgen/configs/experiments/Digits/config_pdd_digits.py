"""PDD (Parallel Decoding Distillation, arXiv 2607.26004) on digits: a student with one velocity head per interval
of an 8-interval rectified-flow grid, distilled from the shipped digits teacher, that samples with 1, 2, 4 or 8
evaluations without retraining (``fastgen sample RUN --steps K``; the recipe's own sampler is 4 blocks of 2).

The teacher is the shipped EDM U-Net, read as a flow teacher: its velocity at the RF state ``(x, t)`` is
``(x - D(x', sigma)) / t`` at the EDM state of equal signal-to-noise ratio (``sigma = t / (1 - t)``), the same
probability-flow ODE reparametrised. The grid runs from ``t = 80 / 81`` (EDM's ``sigma_max = 80``) to 0,
unshifted; head ``k`` is regressed on the teacher's *midpoint* velocity at the state the student's own heads reach,
so the student follows the teacher's 8-step midpoint solution (FD 0.88 at 2,000 samples, 16 teacher evaluations;
Euler: 1.90). Adam at 1e-4, batch 64, 2,000 iterations, EDM2 power EMA (gamma 6.94). Measured quality is in
``docs/experiments/pdd-digits.md``.
"""

from __future__ import annotations

from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import digits_distillation
from fastgen.configs.methods.config_pdd import create_config as pdd_config


def create_config() -> BaseConfig:
    config = digits_distillation(pdd_config(), max_iter=2000, save_ckpt_iter=1000, callbacks=EMA_CALLBACK)
    config.model.grid_size = 8
    config.model.grid_shift = 1.0
    config.model.teacher_integrator = "midpoint"
    config.model.inference_blocks = [2, 2, 2, 2]
    config.model.net_optimizer.lr = 1e-4
    config.model.use_ema = True
    config.trainer.callbacks.ema.type = "power"
    config.trainer.callbacks.ema.gamma = 6.94
    return config
