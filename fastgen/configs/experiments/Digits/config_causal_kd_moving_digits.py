"""CausalKD on moving digits (CausVid Sec. 3.3, the ODE initialisation): a 2-step block-causal student (4 chunks of
2 frames, KV cache) regresses the bidirectional teacher's ODE trajectories of ``Digits/config_sft_video_dit_moving_digits``,
every chunk at its own point of the trajectory. Make the teacher first (commands in that recipe's docstring), then::

    fastgen train --config Digits/config_causal_kd_moving_digits - model.teacher_ckpt=video_teacher.pth

The first (fresh) run solves 4,000 noises with balanced random labels through the teacher (25 Heun steps) into
``$FASTGEN_OUTPUT_ROOT/kd_cache/moving_digits_causal_kd_2step.pt`` and trains on those trajectories. The student
then starts CausVid or Self-Forcing (``model.student_ckpt=<this run's checkpoint>``). Student times ``[1.0, 0.5]``
(rectified flow), deterministic DDIM steps between them, finished chunks cached clean.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits.common import moving_digits_student
from fastgen.configs.experiments.Toy.config_kd_toy import kd_cache_path
from fastgen.configs.methods.config_causal_kd import create_config as causal_kd_config
from fastgen.configs.methods.config_kd import kd_pairs_loader


def create_config() -> BaseConfig:
    config = moving_digits_student(causal_kd_config())
    config.model.kd_num_samples = 4000
    config.model.kd_build_batch_size = 250
    path = kd_cache_path("moving_digits_causal_kd_2step.pt")
    config.model.kd_data_path = path
    config.dataloader_train = kd_pairs_loader(path, batch_size=32)
    return config
