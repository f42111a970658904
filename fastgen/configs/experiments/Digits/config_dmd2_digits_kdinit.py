"""The long DMD2 recipe started from a KD student instead of a copy of the teacher.

``Digits/config_dmd2_digits_long`` starts the student as a copy of the teacher evaluated at ``sigma_max``, so DMD's
gradient has to build the whole noise-to-digit map itself, and reverse KL, being mode-seeking, builds one that
sharpens each class and loses part of its spread. A KD student (Luhman & Luhman 2021; ``Digits/config_kd_digits``)
already follows the teacher's ODE map from noise to digit - blurred, but with the teacher's variety in it - and
DMD2 then only has to sharpen it. The fake score still starts as the teacher's copy (DMD Sec. 3.2). Two commands,
the first writes the KD run this recipe reads by default::

    fastgen train --config Digits/config_kd_digits                 # 10,000 teacher ODE pairs, 2,000 iterations
    fastgen train --config Digits/config_dmd2_digits_kdinit        # model.student_ckpt=... to start from another run

Everything else is the long recipe's (three-level GAN heads with R1, learning rates decaying to a tenth, power-function
EMA), over ``MAX_ITER`` iterations. FD at 20,000 samples over four sampling seeds, two training seeds, against the
teacher's mean (README, "Quick start"): 1.16x and 1.07x over 4,000 iterations (13-14 minutes on one CPU thread), the
level the teacher-copy recipe needs 15,000 for; decayed over 15,000 from the KD student, 1.08x and 1.05x - the same
plateau as the teacher-copy start (1.05x, 1.13x), so the KD start saves time but does not lower it.
"""

from __future__ import annotations

from fastgen.configs.config import BaseConfig
from fastgen.configs.experiments.Digits import config_dmd2_digits_long as long_recipe
from fastgen.utils.env import output_root

MAX_ITER = 4000


def kd_run_dir() -> str:
    """Where ``fastgen train --config Digits/config_kd_digits`` writes its run (its newest checkpoint is read)."""
    return str(output_root() / "fastgen" / "digits" / "config_kd_digits")


def create_config() -> BaseConfig:
    config = long_recipe.create_config(max_iter=MAX_ITER)
    config.model.student_ckpt = kd_run_dir()
    config.model.student_ckpt_key = "net"
    return config
