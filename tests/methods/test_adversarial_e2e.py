"""End to end on 2-D toy data: DMD2, SiD, f-distill and LADD 1-step students end measurably closer to the data
(energy distance to fresh samples) than at initialisation (a copy of the teacher used as a 1-step generator), and
within a measured factor of the teacher's own multi-step quality."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastgen.configs.config import BaseConfig
from fastgen.configs.config_utils import load_config
from fastgen.configs.instantiate import instantiate

from toy_distill import small_toy_mlp, toy_energy, toy_run_config, train


ADVERSARIAL_RECIPES = ["Toy/config_dmd2_toy", "Toy/config_sid_toy", "Toy/config_f_distill_toy", "Toy/config_ladd_toy"]


def adversarial_config(recipe: str, teacher_ckpt: Path, seed: int = 0) -> BaseConfig:
    """The recipe on the test's small network, 400 iterations, every learning rate 3e-4."""
    config = toy_run_config(load_config(recipe), recipe.split("_", 1)[1], max_iter=400)
    config.model.net = small_toy_mlp()
    config.model.teacher_ckpt = str(teacher_ckpt)
    config.model.net_optimizer.lr = 3e-4
    if hasattr(config.model, "fake_score_optimizer"):
        config.model.fake_score_optimizer.lr = 3e-4
    if hasattr(config.model, "discriminator_optimizer"):
        config.model.discriminator_optimizer.lr = 3e-4
    config.trainer.seed = seed
    return config


# 1-step student / teacher (EMA, 18 Heun steps) energy distance after 400 iterations, measured over seeds 0-5 of
# `OMP_NUM_THREADS=1 python tests/methods/measure_toy_quality.py --seeds 0 1 2 3 4 5` (teacher and student trained
# with that seed; the test runs seed 0, whose teacher scores 0.0021):
#   dmd2       7.18 6.28 3.80 5.09 6.87 5.72        (max 7.18)  -> bound 11x
#   sid        10.05 18.25 6.39 10.44 9.11 7.88     (max 18.3)  -> bound 27x
#   f_distill  7.53 7.41 5.68 3.66 9.90 5.82        (max 9.90)  -> bound 15x
#   ladd       21.36 11.80 10.29 5.39 16.14 13.83   (max 21.4)  -> bound 32x
# (each bound is 1.5x the worst seed). At initialisation (the teacher copied, used as a 1-step generator) every
# student scores 0.70-0.81, 150-360x the teacher; 400 iterations do not reach the teacher, but come within these
# factors of it.
TEACHER_FACTOR = {"Toy/config_dmd2_toy": 11.0, "Toy/config_sid_toy": 27.0, "Toy/config_f_distill_toy": 15.0,
                  "Toy/config_ladd_toy": 32.0}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ADVERSARIAL_RECIPES)
def test_student_gets_close_to_the_teachers_multi_step_quality(recipe: str, toy_teacher_ckpt: Path,
                                                               toy_teacher_energy: float) -> None:
    config = adversarial_config(recipe, toy_teacher_ckpt)
    initial = instantiate(config.model_class, config=config.model)
    initial.init_weights()
    before = toy_energy(initial)
    after = toy_energy(train(config))
    print(f"{recipe}: energy distance {before:.4f} -> {after:.4f} (teacher {toy_teacher_energy:.4f})")
    assert after < 0.5 * before
    assert after < TEACHER_FACTOR[recipe] * toy_teacher_energy
