"""SiD on 2-D toy data: ``Toy/config_dmd2_toy`` with SiD's generator loss (``fastgen.methods.sid``) in place of
DMD's; same teacher, fake score and alternation."""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Toy.config_dmd2_toy import create_config as dmd2_toy
from fastgen.configs.methods.config_sid import create_config as sid_config


def create_config() -> BaseConfig:
    config = dmd2_toy()
    config.model_class = sid_config().model_class
    return config
