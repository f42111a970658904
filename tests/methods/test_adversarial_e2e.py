"""End to end on 2-D toy data: DMD2, f-distill and LADD students end measurably closer to the data (energy
distance to fresh samples) than at initialisation (a copy of the teacher used as a 1-step generator)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastgen.configs.config_utils import load_config
from fastgen.configs.instantiate import instantiate

from toy_distill import small_toy_mlp, toy_energy, toy_run_config, train


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["Toy/config_dmd2_toy", "Toy/config_sid_toy", "Toy/config_f_distill_toy",
                                    "Toy/config_ladd_toy"])
def test_student_gets_closer_to_the_data(recipe: str, toy_teacher_ckpt: Path) -> None:
    config = toy_run_config(load_config(recipe), recipe.split("_", 1)[1], max_iter=400)
    config.model.net = small_toy_mlp()
    config.model.teacher_ckpt = str(toy_teacher_ckpt)
    config.model.net_optimizer.lr = 3e-4
    if hasattr(config.model, "fake_score_optimizer"):
        config.model.fake_score_optimizer.lr = 3e-4
    if hasattr(config.model, "discriminator_optimizer"):
        config.model.discriminator_optimizer.lr = 3e-4
    initial = instantiate(config.model_class, config=config.model)
    initial.init_weights()
    before = toy_energy(initial)
    torch.manual_seed(0)
    after = toy_energy(train(config))
    print(f"{recipe}: energy distance {before:.4f} -> {after:.4f}")
    assert after < 0.5 * before
