"""Method config for sCM, continuous-time consistency models in TrigFlow (Lu & Song 2024). See
``fastgen.methods.scm``.

``mode="cd"`` (sCD, the default) takes ``dx/dt`` from the teacher loaded from ``teacher_ckpt``; ``mode="ct"`` (sCT)
uses the data's own velocity ``cos(t) z - sin(t) x0`` and builds no teacher (``teacher_ckpt``, when set, only
initialises the student). The student ``net`` may use any schedule (EDM, rectified flow, or the TrigFlow one in
``fastgen.networks.noise_schedules.TrigFlowScheduler``): sCM works in TrigFlow time and maps every state to the
network's own coordinates.

Typical use (see ``fastgen/configs/experiments/Digits/config_scm_digits.py``)::

    from fastgen.configs.methods.config_scm import create_config
    config = create_config()
    config.model.net = ...
    config.model.teacher_ckpt = "teacher.pth"
    config.model.tangent_warmup_iters = 1000
"""

from __future__ import annotations

from typing import Literal, Optional

import attrs
from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig, default_optimizer
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_distill import DistillModelConfig
from fastgen.configs.schema import config_class


@config_class
class SCMModelConfig(DistillModelConfig):
    mode: Literal["ct", "cd"] = "cd"
    sigma_data: Optional[float] = None  # TrigFlow's sigma_d; None: the net's schedule's sigma_data (else 0.5)
    # Training times: ln(sigma_d tan t) ~ N(P_mean, P_std^2) (Lu & Song 2024, Sec. 4.1; sCT 1.0/1.4, sCD 0.8/1.6),
    # with the noise-to-signal ratio sigma_d tan t kept in [sigma_min, sigma_max] (and in the net's own range).
    P_mean: float = -0.8  # noqa: N815 - paper names
    P_std: float = 1.6  # noqa: N815
    sigma_min: float = 0.002
    sigma_max: float = 80.0
    # Tangent warm-up: the coefficient of the second tangent term rises linearly from 0 to 1 over this many
    # iterations (Sec. 4.2); 0 means no warm-up (the coefficient is 1 from the start).
    tangent_warmup_iters: int = 10_000
    tangent_norm_c: Optional[float] = 0.1  # g <- g / (||g|| + c) (Sec. 4.2); None: no normalisation
    # How d/dt F is computed: forward-mode AD (torch.func.jvp), central finite differences, or auto = forward AD
    # with a permanent switch to finite differences (and a warning) when the network's ops do not support it.
    jvp: Literal["auto", "forward_ad", "finite_difference"] = "auto"
    fd_step: float = 1e-3  # finite-difference step along the tangent
    # Adaptive weighting (Sec. 4.3): a small network w(t) trained jointly, loss e^{-w}/D ||.||^2 + w.
    adaptive_weighting: bool = True
    logvar_optimizer: DictConfig = attrs.field(factory=default_optimizer)
    logvar_scheduler: Optional[DictConfig] = None


def _scm_class() -> DictConfig:
    return LazyCall("fastgen.methods.scm.SCMModel")()


def trigflow_schedule(sigma_data: float = 0.5, sigma_max: float = 80.0, P_mean: float = -1.0,  # noqa: N803
                      P_std: float = 1.4) -> DictConfig:  # noqa: N803
    """LazyCall of ``TrigFlowScheduler`` (for a network in native TrigFlow parameterisation)."""
    return LazyCall("fastgen.networks.noise_schedules.TrigFlowScheduler")(
        sigma_data=sigma_data, sigma_max=sigma_max, P_mean=P_mean, P_std=P_std)


def create_config() -> BaseConfig:
    """A base sCM config; experiment configs fill in the networks, the teacher checkpoint and the data."""
    return BaseConfig(model=SCMModelConfig(), model_class=_scm_class())


__all__ = ["SCMModelConfig", "create_config", "trigflow_schedule"]
