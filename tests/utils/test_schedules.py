"""The trainer's warning when a learning-rate schedule does not end with the run (``fastgen.utils.schedules``)."""

from __future__ import annotations

import pytest
import torch

from fastgen.configs.config_utils import load_config, validate_config
from fastgen.configs.experiments.Digits.config_dmd2_digits import MAX_ITER as QUICKSTART_ITER
from fastgen.configs.experiments.Digits.config_dmd2_digits_long import MAX_ITER
from fastgen.configs.instantiate import LazyCall, instantiate
from fastgen.trainer import Trainer
from fastgen.utils.schedules import schedule_length_mismatches
from fastgen_testing import tiny_toy_config


def long_recipe_mismatches(max_iter: int, recipe: str = "Digits/config_dmd2_digits_long") -> list[str]:
    """``Digits/config_dmd2_digits_long`` (or ``recipe``) with ``trainer.max_iter`` changed after the recipe was
    built, as ``- trainer.max_iter=N`` on the command line does."""
    config = validate_config(load_config(recipe))
    model = instantiate(config.model_class, config=config.model)
    model.init_optimizers()
    return schedule_length_mismatches(model.scheduler_dict, model.get_optimizers, max_iter)


def test_the_long_recipe_as_shipped_ends_every_decay_with_the_run() -> None:
    assert long_recipe_mismatches(MAX_ITER) == []


@pytest.mark.parametrize("method", ["dmd2", "f_distill", "sid"])
def test_the_quickstart_family_decays_every_learning_rate_over_its_own_run(method: str) -> None:
    """The DMD2 quick-start and the recipes built on it decay each module's rate over exactly the updates their
    1,000 iterations give it (200 student, 800 critic), to a tenth."""
    recipe = f"Digits/config_{method}_digits"
    config = validate_config(load_config(recipe))
    assert config.trainer.max_iter == QUICKSTART_ITER
    for name in ("net_scheduler", "fake_score_scheduler", "discriminator_scheduler"):
        assert getattr(config.model, name).end_factor == pytest.approx(0.1)
    assert long_recipe_mismatches(QUICKSTART_ITER, recipe) == []
    assert len(long_recipe_mismatches(QUICKSTART_ITER + 5, recipe)) == 3


def test_a_longer_run_than_the_recipe_names_each_decay_that_finishes_early() -> None:
    messages = long_recipe_mismatches(2 * MAX_ITER)
    student, critic = MAX_ITER // 5, MAX_ITER - MAX_ITER // 5  # one student update in five iterations
    assert len(messages) == 3
    assert any(m.startswith("net's") and f"decays over {student} updates" in m and f"gives net {2 * student}" in m
               and f"the last {student} stay at the final learning rate" in m for m in messages)
    assert any(m.startswith("fake_score's") and f"decays over {critic} updates" in m
               and f"gives fake_score {2 * critic}" in m for m in messages)


def test_a_shorter_run_than_the_recipe_ends_before_the_schedule() -> None:
    messages = long_recipe_mismatches(MAX_ITER // 2)
    assert len(messages) == 3 and all("the run ends before the schedule does" in m for m in messages)
    assert any(f"runs over {MAX_ITER // 5} updates" in m and f"gives net {MAX_ITER // 10}" in m for m in messages)


def test_a_warm_up_that_ends_early_is_intended_and_not_reported() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    warm_up = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, end_factor=1.0, total_iters=10)
    assert schedule_length_mismatches({"net": warm_up}, lambda iteration: ["net"], 100) == []
    assert len(schedule_length_mismatches({"net": warm_up}, lambda iteration: ["net"], 5)) == 1
    step = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3)  # no fixed end: nothing to compare
    assert schedule_length_mismatches({"net": step}, lambda iteration: ["net"], 100) == []


def test_a_decay_to_zero_that_ends_early_says_its_last_updates_train_nothing() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    to_zero = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.0, total_iters=10)
    assert "stay at 0, so they train nothing" in schedule_length_mismatches({"net": to_zero}, lambda i: ["net"], 20)[0]


def test_the_trainer_logs_the_mismatch_before_training(caplog: pytest.LogCaptureFixture) -> None:
    config = tiny_toy_config("schedule_mismatch", max_iter=4)
    config.model.net_scheduler = LazyCall("torch.optim.lr_scheduler.CosineAnnealingLR")(T_max=100)
    with caplog.at_level("WARNING"):
        Trainer(config).run()
    assert "net's learning-rate schedule (CosineAnnealingLR) runs over 100 updates" in caplog.text
    assert "trainer.max_iter=4 gives net 4" in caplog.text
