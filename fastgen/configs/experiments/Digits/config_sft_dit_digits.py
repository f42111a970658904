"""A tiny DiT (Peebles & Xie 2023) trained with SFT on scikit-learn's 8x8 digits: the DiT backbone's smoke test
and the teacher of ``Digits/config_dmd2_dit_digits``.

``dit_digits``: patch 2 (16 tokens), hidden 96, depth 4, 4 heads, adaLN-Zero, 10 classes plus the null class
(``condition_dropout = 0.1``), EDM preconditioning with ``sigma_data = 0.5``; 0.72M parameters. Otherwise the
settings of ``Digits/config_sft_digits`` (Adam at 1e-3, batch 64, EDM2 power EMA, 18 Heun steps).
How well it learns is measured by ``tests/networks/test_dit.py::test_dit_on_digits_learns``: digits
FD of 300 samples (8 Heun steps) of the EMA network falls from ~700 untrained to 226-250 after 150 iterations
(trainer seeds 0-2), though the samples' classifier accuracy is still at chance then; the full recipe is
1,000 iterations, whose quality has not been measured.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.config_sft_digits import (
    create_config as sft_digits,
)
from fastgen.configs.net_dit import dit_digits


def create_config() -> BaseConfig:
    config = sft_digits()
    config.model.net = dit_digits(num_classes=10)
    return config
