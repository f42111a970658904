"""KD on digits: regress a 1-step student onto the shipped digits teacher's ODE samples (Luhman & Luhman 2021).

The first (fresh) run solves 10,000 noises with balanced random labels through the teacher (18 Heun steps, 35
network evaluations) into ``$FASTGEN_OUTPUT_ROOT/kd_cache/digits_kd_1step.pt`` and then trains on those pairs;
the cache remembers the teacher and the student times and refuses to serve another one. A 2-step student::

    fastgen train --config Digits/config_kd_digits - model.t_list=[80.0,1.0] log_config.name=kd_2step \\
        model.kd_data_path=FASTGEN_OUTPUT/kd_cache/digits_kd_2step.pt \\
        dataloader_train.dataset.path=FASTGEN_OUTPUT/kd_cache/digits_kd_2step.pt
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import digits_distillation
from fastgen.configs.experiments.Toy.config_kd_toy import kd_cache_path
from fastgen.configs.methods.config_kd import create_config as kd_config
from fastgen.configs.methods.config_kd import kd_pairs_loader


def create_config() -> BaseConfig:
    config = digits_distillation(kd_config(), max_iter=2000, save_ckpt_iter=1000)
    config.model.kd_num_samples = 10_000
    config.model.net_optimizer.lr = 1e-4
    path = kd_cache_path("digits_kd_1step.pt")
    config.model.kd_data_path = path
    config.dataloader_train = kd_pairs_loader(path, batch_size=64)
    return config
