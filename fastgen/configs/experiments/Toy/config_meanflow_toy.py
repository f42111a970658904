"""MeanFlow on 2-D toy data, from scratch (Geng et al. 2025): an average-velocity MLP ``u(z_t, r, t)`` on the
rectified-flow path, sampled in one step ``x0 = x1 - u(x1, 0, 1)``. No teacher.

    fastgen train --config Toy/config_meanflow_toy
    fastgen train --config Toy/config_meanflow_toy - model.t_list=[1.0,0.5]   # sample in two steps
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Toy.common import toy_setting
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_meanflow import create_config as meanflow_config
from fastgen.configs.net import flow_schedule


def meanflow_mlp(hidden_dim: int = 256, num_layers: int = 3) -> DictConfig:
    """The toy MLP with the second time input ``r`` on the rectified-flow schedule."""
    return LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall("fastgen.networks.mlp.MLPDenoiser")(data_dim=2, hidden_dim=hidden_dim,
                                                              num_layers=num_layers, use_r=True),
        noise_scheduler=flow_schedule(),
    )


def create_config() -> BaseConfig:
    config = toy_setting(meanflow_config(), max_iter=4000, save_ckpt_iter=2000, net=meanflow_mlp())
    config.model.ratio_r_neq_t = 0.5
    config.model.net_optimizer.lr = 1e-3
    return config
