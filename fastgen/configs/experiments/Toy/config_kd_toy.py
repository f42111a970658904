"""KD on 2-D toy data: regress a 1-step MLP onto an SFT toy teacher's ODE samples (Luhman & Luhman 2021).

    fastgen train --config Toy/config_sft_toy - log_config.name=toy_teacher
    fastgen train --config Toy/config_kd_toy - model.teacher_ckpt=FASTGEN_OUTPUT/fastgen/toy/toy_teacher/checkpoints/0002000.pth

The first (fresh) run solves 20,000 noises with the teacher (18 Heun steps) into
``$FASTGEN_OUTPUT_ROOT/kd_cache/toy_kd_1step.pt`` and trains on those pairs; the cache remembers the teacher and
the student times and refuses to serve another one. For a 2-step student add ``model.t_list=[80.0,1.0]`` and point
both ``model.kd_data_path`` and ``dataloader_train.dataset.path`` at a new file.
"""

from __future__ import annotations

import os


from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Toy.common import toy_setting
from fastgen.configs.methods.config_kd import create_config as kd_config
from fastgen.configs.methods.config_kd import kd_pairs_loader


def kd_cache_path(name: str) -> str:
    """``$FASTGEN_OUTPUT_ROOT/kd_cache/<name>`` (resolved when the config is created)."""
    return os.path.join(os.environ.get("FASTGEN_OUTPUT_ROOT", "./FASTGEN_OUTPUT"), "kd_cache", name)


def create_config() -> BaseConfig:
    config = toy_setting(kd_config())
    config.model.net_optimizer.lr = 5e-4
    config.model.kd_num_samples = 20_000
    path = kd_cache_path("toy_kd_1step.pt")
    config.model.kd_data_path = path
    config.dataloader_train = kd_pairs_loader(path, batch_size=256)
    return config
