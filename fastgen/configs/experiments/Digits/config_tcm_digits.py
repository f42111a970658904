"""Truncated consistency model on digits (Lee et al. 2025), two runs of this recipe:

    fastgen train --config Digits/config_tcm_digits - log_config.name=tcm_stage1
    fastgen train --config Digits/config_tcm_digits - log_config.name=tcm_stage2 model.tcm_stage=2 \\
        model.stage1_ckpt=FASTGEN_OUTPUT/fastgen/digits/tcm_stage1/checkpoints/0001000.pth

Stage 1 is ECT-style consistency training from the shipped digits teacher (``config_cm_digits.ect_setting``); stage
2 retrains on ``sigma in [t', 80]`` with ``t' = 1`` and the frozen stage-1 model as the boundary.

**Experimental**: its student does not reach fastgen's bar for a shipped recipe (1-step FD at most 3x the
35-evaluation teacher's 0.56). Measured at 5,000 samples (``benchmarks/quality.py``, commit d20d9e8): stage 1
scores FD 3.49, 1.85 in two steps (5.31 before training noise was keyed by sample index). Not yet tried: stage 1 as the
consistency-distillation recipe that now meets the bar (``Digits/config_cm_digits``, FD 1.225 in 498 s), which
leaves too little of a 10-minute budget for stage 2 at its length.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.config_cm_digits import ect_setting
from fastgen.configs.methods.config_tcm import TCMModelConfig, _tcm_class


def create_config() -> BaseConfig:
    config = ect_setting()
    model = TCMModelConfig()
    for field in ("net", "teacher_ckpt", "input_shape", "num_classes", "sample_steps", "mode", "t_mean", "t_std",
                  "net_optimizer"):
        setattr(model, field, getattr(config.model, field))
    model.t_prime = 1.0
    config.model = model
    config.model_class = _tcm_class()
    return config
