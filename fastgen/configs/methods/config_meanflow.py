"""Method config for MeanFlow (Geng et al. 2025, "Mean Flows for one-step generative modeling"). See
``fastgen.methods.meanflow``.

MeanFlow trains from data by default (``mode="data"``): no teacher is built or checkpointed; with
``student_init_from_teacher=True`` a ``teacher_ckpt`` initialises the network (e.g. a flow-matching model with the
same ``use_r`` backbone).
``mode="distill"`` takes the instantaneous velocity from the teacher instead of ``eps - x0``. The network must use
the rectified-flow schedule and a backbone built with ``use_r=True`` (``UNet``, ``MLPDenoiser``, ``EDM2UNet``).

Typical use (see ``fastgen/configs/experiments/Toy/config_meanflow_toy.py``)::

    from fastgen.configs.methods.config_meanflow import create_config
    config = create_config()
    config.model.net = ...  # DiffusionNet(backbone=...(use_r=True), noise_scheduler=flow_schedule())
"""

from __future__ import annotations

from typing import Literal, Optional

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_distill import DistillModelConfig
from fastgen.configs.schema import config_class


@config_class
class MeanFlowModelConfig(DistillModelConfig):
    mode: Literal["data", "distill"] = "data"
    student_init_from_teacher: bool = False  # distill mode: a flow teacher is rarely a use_r network
    # (t, r) ~ logit-normal(t_mean, t_std) each, sorted so that t >= r (Geng et al. 2025, Sec. 4 / Table 1).
    t_mean: float = -0.4
    t_std: float = 1.0
    # Fraction of the batch with r != t (the rest has r = t: plain flow matching); the paper's best is 25%.
    ratio_r_neq_t: float = 0.25
    # Adaptive loss weight w = 1 / (||Delta||^2 + c)^p (Sec. 4.3); p = 0 gives the plain squared error.
    adaptive_p: float = 1.0
    adaptive_c: float = 1e-3
    # How du/dt is computed: forward-mode AD (torch.func.jvp), central finite differences, or auto = forward AD
    # with a permanent switch to finite differences when the network's ops do not support it.
    jvp: Literal["auto", "forward_ad", "finite_difference"] = "auto"
    fd_step: float = 1e-3
    # Student sampling times from 1 down (0 implied); None: one step, x0 = x1 - u(x1, 0, 1).
    t_list: Optional[list[float]] = None


def _meanflow_class() -> DictConfig:
    return LazyCall("fastgen.methods.meanflow.MeanFlowModel")()


def create_config() -> BaseConfig:
    """A base MeanFlow config; experiment configs fill in the network and the data."""
    return BaseConfig(model=MeanFlowModelConfig(), model_class=_meanflow_class())


__all__ = ["MeanFlowModelConfig", "create_config"]
