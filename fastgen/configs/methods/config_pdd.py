"""Method config for PDD - Parallel Decoding Distillation (arXiv 2607.26004). See ``fastgen.methods.pdd``.

The student is the teacher with its output projection widened into ``grid_size`` heads, one per interval of a
shifted rectified-flow grid; one evaluation from ``x_n`` gives every later interval's velocity, and at sampling
time contiguous intervals fuse into one evaluation (``inference_blocks``), so the step count changes without
retraining (``fastgen sample --steps K`` uses ``K`` near-equal blocks). The grid is stored with the student's
weights, and a checkpoint trained on another grid refuses to load.

Typical use (see ``fastgen/configs/experiments/Digits/config_pdd_digits.py``)::

    from fastgen.configs.methods.config_pdd import create_config
    config = create_config()
    config.model.net = ...
    config.model.teacher_ckpt = "teacher.pth"
    config.model.grid_size = 8                  # 8 intervals: 1, 2, 4 or 8 evaluations from one student
    config.model.inference_blocks = [2, 2, 2, 2]
"""

from __future__ import annotations

from typing import Literal, Optional

from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_distill import DistillModelConfig
from fastgen.configs.schema import config_class


@config_class
class PDDModelConfig(DistillModelConfig):
    grid_size: int = 8  # N: intervals of the time grid, and the student's output heads
    grid_shift: float = 1.0  # time shift s of the grid, t = s u / (1 + (s - 1) u) (Esser et al. 2024, Eq. 23)
    grid_max_t: Optional[float] = None  # RF time of the grid's first point; None: the student schedule's t_max
    block_size_min: int = 1  # the start interval n is a multiple of this
    block_size_max: Optional[int] = None  # the target k is below n + this; None: grid_size (any later interval)
    inference_blocks: Optional[list[int]] = None  # sampling blocks summing to grid_size; None: one per interval
    teacher_integrator: Literal["euler", "midpoint"] = "euler"  # the teacher's target velocity at x̄_k


def _pdd_class() -> DictConfig:
    return LazyCall("fastgen.methods.pdd.PDDModel")()


def create_config() -> BaseConfig:
    """A base PDD config; experiment configs fill in the networks, the teacher checkpoint and the data."""
    return BaseConfig(model=PDDModelConfig(), model_class=_pdd_class())


__all__ = ["PDDModelConfig", "create_config"]
