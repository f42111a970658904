"""PDD (Parallel Decoding Distillation, ``fastgen.methods.pdd``) on 2-D toy data: an MLP student with one velocity
head per interval of an 8-interval grid, distilled from an SFT toy teacher; it samples with 1, 2, 4 or 8
evaluations from one set of weights (``fastgen sample RUN --steps K``).

    fastgen train --config Toy/config_sft_toy - log_config.name=toy_teacher
    fastgen train --config Toy/config_pdd_toy - model.teacher_ckpt=FASTGEN_OUTPUT/fastgen/toy/toy_teacher/checkpoints/0002000.pth

Checked to train (and to be world-size invariant, ``tests/methods/test_keyed_noise_ranks.py``), not tuned for a
quality: the tuned PDD recipe is ``Digits/config_pdd_digits``.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Toy.common import toy_setting
from fastgen.configs.methods.config_pdd import create_config as pdd_config


def create_config() -> BaseConfig:
    config = toy_setting(pdd_config())
    config.model.net_optimizer.lr = 5e-4
    config.model.grid_size = 8
    config.model.teacher_integrator = "midpoint"
    config.model.inference_blocks = [2, 2, 2, 2]
    return config
