"""f-distill (Jensen-Shannon weighting) on 2-D toy data; same teacher and schedule as ``Toy/config_dmd2_toy``."""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Toy.config_dmd2_toy import create_config as dmd2_toy
from fastgen.configs.instantiate import LazyCall


def create_config() -> BaseConfig:
    config = dmd2_toy()
    config.model_class = LazyCall("fastgen.methods.f_distill.FDistillModel")()
    config.model.gan_loss_weight_gen = 1e-2
    config.model.f_divergence = "js"
    return config
