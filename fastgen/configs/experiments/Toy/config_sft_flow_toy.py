"""2-D checkerboard with an MLP trained by flow matching (rectified-flow schedule, velocity prediction)."""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.data import toy_loader
from fastgen.configs.experiments.Toy.config_sft_toy import create_config as toy_config
from fastgen.configs.net import flow_schedule, toy_mlp


def create_config() -> BaseConfig:
    config = toy_config()
    config.model.net = toy_mlp(schedule=flow_schedule())
    config.dataloader_train = toy_loader("checkerboard", batch_size=256)
    config.dataloader_val = toy_loader("checkerboard", batch_size=256, num_samples=4096, seed=1)
    return config
