"""The config every distillation method shares: where the teacher comes from and how the student starts.

Distillation methods (``config_dmd2.py``, ``config_kd.py``, ``config_cm.py``, ...) subclass
``DistillModelConfig``. The teacher network is ``teacher`` (default: the same architecture as ``net``) with
weights from ``teacher_ckpt`` - a fastgen checkpoint (``.pth``) or a file holding a bare state dict. The student
``net`` starts as a copy of the teacher unless ``student_init_from_teacher`` is off, or from ``student_ckpt``: the
network of another run (a fastgen checkpoint, its checkpoints folder or run directory - the newest checkpoint -
or a bare state-dict file), e.g. a KD student that DMD2 then refines (``Digits/config_dmd2_digits_kdinit``).
"""

from __future__ import annotations

from typing import Optional

from omegaconf import DictConfig

from fastgen.configs.config import BaseModelConfig
from fastgen.configs.schema import config_class


@config_class
class DistillModelConfig(BaseModelConfig):
    teacher: Optional[DictConfig] = None  # LazyCall of the teacher network; None: same as `net`
    teacher_ckpt: Optional[str] = None  # fastgen checkpoint / state-dict file with the teacher's weights
    teacher_ckpt_key: str = "auto"  # which module of a fastgen checkpoint: auto = first EMA network, else net
    student_init_from_teacher: bool = True
    # Start the student from another run's network instead (fresh runs only; it wins over the teacher's copy):
    # a checkpoint file, a checkpoints folder or a run directory (its newest checkpoint), or a bare state dict.
    student_ckpt: Optional[str] = None
    student_ckpt_key: str = "auto"  # which module of that checkpoint: auto = first EMA network, else net
    # Student sampling times, from t_max down (the final 0 is implied): None = one step from t_max. A k-entry
    # list gives a k-step student that denoises, re-noises to the next time and denoises again.
    t_list: Optional[list[float]] = None


__all__ = ["DistillModelConfig"]
