"""SiD on digits: the quick-start DMD2 recipe (``Digits/config_dmd2_digits``: shipped teacher, fake score with four
critic steps per student step, GAN head on the teacher's features, same decaying learning rates and EMA) with SiD's
generator loss in place of DMD's (``fastgen.methods.sid``), at ``alpha = 1`` rather than the paper's 1.2.
Scored beside the other methods in docs/experiments/digits-quality.md: over training seeds 0 / 1 / 2 (5,000
samples) alpha 1 gives FD 1.62 / 1.67 / 1.60 and alpha 1.2 1.80 / 2.38 / 1.57 on the same recipe (issue 21, second
round)."""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.config_dmd2_digits import create_config as dmd2_digits
from fastgen.configs.methods.config_sid import create_config as sid_config


def create_config() -> BaseConfig:
    config = dmd2_digits()
    config.model_class = sid_config().model_class
    config.model.sid_alpha = 1.0
    return config
