"""f-distill on digits: the quick-start DMD2 recipe with the VSD gradient weighted for the Jensen-Shannon
divergence by the discriminator's density-ratio estimate (see ``fastgen.methods.f_distill``)."""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.config_dmd2_digits import create_config as dmd2_digits
from fastgen.configs.instantiate import LazyCall


def create_config() -> BaseConfig:
    config = dmd2_digits()
    config.model_class = LazyCall("fastgen.methods.f_distill.FDistillModel")()
    config.model.f_divergence = "js"
    return config
