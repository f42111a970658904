"""Truncated consistency model on digits (Lee et al. 2025), two runs of this recipe:

    fastgen train --config Digits/config_tcm_digits - log_config.name=tcm_stage1
    fastgen train --config Digits/config_tcm_digits - log_config.name=tcm_stage2 model.tcm_stage=2 \\
        model.stage1_ckpt=FASTGEN_OUTPUT/fastgen/digits/tcm_stage1/checkpoints/0003000.pth \\
        trainer.max_iter=2000 trainer.callbacks.ct_schedule.kimg_per_stage=25.6

Stage 1 is the consistency-distillation recipe (``Digits/config_cm_digits``: one Heun step of the teacher, ECT's
curriculum and time proposal, an EMA of 0.99) run for 3,000 iterations instead of 5,000, with its five curriculum
stages spread over them; stage 2 retrains on ``sigma in [t', 80]`` with ``t' = 1`` and the frozen stage-1 EMA
network as the boundary (Sec. 4), both stages within the 10-minute budget (261 s + 214 s here).

**Experimental**: stage 1 is a consistency model and meets fastgen's bar (1-step FD 1.44, 2-step 1.00, against the
35-evaluation teacher's 0.56; 5,000 samples, stop 30), but stage 2, what TCM adds, does not improve on it here:
1-step 2.84 (accuracy 0.958), 2-step 0.97. Earlier, stage 1 as 1,000 iterations of consistency *training*
(``config_cm_digits.ect_setting``) scored 3.49 / 1.85 (commit d20d9e8). docs/experiments/digits-quality.md has both
rounds.
"""

from __future__ import annotations

import attrs

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.config_cm_digits import create_config as cm_recipe
from fastgen.configs.methods.config_tcm import TCMModelConfig, _tcm_class

MAX_ITER = 3000


def create_config() -> BaseConfig:
    config = cm_recipe()
    # The CM recipe's curriculum stages, squeezed into this run: as many stages, each proportionally shorter.
    config.trainer.callbacks.ct_schedule.kimg_per_stage *= MAX_ITER / config.trainer.max_iter
    config.trainer.max_iter = MAX_ITER
    model = TCMModelConfig()
    for field in attrs.fields(type(config.model)):  # every CM setting; TCM's own fields keep their defaults
        setattr(model, field.name, getattr(config.model, field.name))
    model.t_prime = 1.0
    config.model = model
    config.model_class = _tcm_class()
    return config
