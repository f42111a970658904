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


# Energy distance of the 1-step students after 400 iterations over seeds 0-5 of
# `OMP_NUM_THREADS=1 python tests/methods/measure_toy_quality.py --seeds 0 1 2 3 4 5` (teacher and student trained with
# that seed; the test runs seed 0), against the teacher (EMA, 18 Heun steps): 0.0021 0.0031 0.0044 0.0046 0.0026 0.0033.
#   dmd2       0.0152 0.0196 0.0167 0.0234 0.0180 0.0191  worst / best teacher 11.0 -> bound 14x
#   sid        0.0213 0.0569 0.0280 0.0480 0.0238 0.0263  26.8 -> 34x
#   f_distill  0.0160 0.0231 0.0249 0.0168 0.0259 0.0194  12.2 -> 16x
#   ladd       0.0453 0.0368 0.0451 0.0248 0.0422 0.0462  21.8 -> 28x
# Each bound is 1.25x the worst student over the best teacher, so that the teacher's and the student's random
# streams may change independently. At initialisation (the teacher copied, used as a 1-step generator) every student
# scores 0.70-0.81; 400 iterations do not reach the teacher, but come within these factors of it.
TEACHER_FACTOR = {"Toy/config_dmd2_toy": 14.0, "Toy/config_sid_toy": 34.0, "Toy/config_f_distill_toy": 16.0,
                  "Toy/config_ladd_toy": 28.0}


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
