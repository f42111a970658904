"""SiD on digits: the quick-start DMD2 recipe (``Digits/config_dmd2_digits``: shipped teacher, fake score with four
critic steps per student step, GAN head on the teacher's features, same learning rates and EMA) with SiD's
generator loss (alpha 1.2) in place of DMD's (``fastgen.methods.sid``). Scored beside the other methods in the
README's "Sample quality per method" table."""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.config_dmd2_digits import create_config as dmd2_digits
from fastgen.configs.methods.config_sid import create_config as sid_config


def create_config() -> BaseConfig:
    config = dmd2_digits()
    config.model_class = sid_config().model_class
    config.model.sid_alpha = 1.2
    return config
