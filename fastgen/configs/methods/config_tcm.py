"""Method config for truncated consistency models (Lee et al. 2025). See ``fastgen.methods.tcm``.

Two runs: ``tcm_stage=1`` is a standard consistency model over the whole time range (exactly ``config_cm``);
``tcm_stage=2`` trains only on ``t in [t_prime, T]`` with a frozen copy of the stage-1 model - loaded from
``stage1_ckpt`` - as the boundary at ``t_prime``; the stage-2 network starts from the stage-1 weights too.
Everything of ``CMModelConfig`` (CT / CD, the ratio schedule, the distance) applies to both stages.

Typical use (see ``fastgen/configs/experiments/Toy/config_tcm_toy.py``)::

    fastgen train --config Toy/config_tcm_toy - model.teacher_ckpt=teacher.pth log_config.name=tcm_stage1
    fastgen train --config Toy/config_tcm_toy - model.teacher_ckpt=teacher.pth model.tcm_stage=2 \\
        model.stage1_ckpt=FASTGEN_OUTPUT/fastgen/toy/tcm_stage1/checkpoints/0002000.pth log_config.name=tcm_stage2
"""

from __future__ import annotations

from typing import Optional

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_cm import CMModelConfig
from fastgen.configs.schema import config_class


@config_class
class TCMModelConfig(CMModelConfig):
    tcm_stage: int = 1  # 1: a plain consistency model; 2: truncated training on [t_prime, T]
    stage1_ckpt: Optional[str] = None  # stage 2: the stage-1 run's checkpoint (or a bare state dict)
    stage1_ckpt_key: str = "auto"  # which module: auto = its first EMA network, else net
    t_prime: float = 1.0  # the truncation time t' (in the network's time variable: EDM sigma, RF t)
    boundary_prob: float = 0.25  # share of each stage-2 batch trained at t = t' against the stage-1 model
    boundary_weight: float = 1.0  # weight of that boundary loss


def _tcm_class() -> DictConfig:
    return LazyCall("fastgen.methods.tcm.TCMModel")()


def create_config() -> BaseConfig:
    """A base TCM config; experiment configs fill in the network, the checkpoints and the data."""
    return BaseConfig(model=TCMModelConfig(), model_class=_tcm_class())


__all__ = ["TCMModelConfig", "create_config"]
