"""A distillation's frozen teacher is not written into checkpoints (issue 32, point 3): they hold what trains, its
EMA, the optimizers and a fingerprint of the teacher; a resume and ``sample --teacher`` rebuild the teacher from
``model.teacher_ckpt`` and refuse one that differs from the checkpoint's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastgen_testing import assert_same_tree, state_tensors
from test_dmd2 import toy_dmd2

from fastgen.checkpoint.checkpointer import load_checkpoint
from fastgen.trainer import Trainer
from fastgen.utils.errors import CheckpointError


def teacher_file(tmp_path: Path, seed: int = 7) -> Path:
    """A bare state dict of the toy network, as ``model.teacher_ckpt`` takes it."""
    from fastgen.configs.instantiate import instantiate

    torch.manual_seed(seed)
    net = instantiate(toy_dmd2().model.net)
    path = tmp_path / f"teacher{seed}.pth"
    torch.save(net.state_dict(), path)
    return path


def run(name: str, teacher: Path, max_iter: int) -> Trainer:
    config = toy_dmd2(gan=True, use_ema=True, teacher_ckpt=str(teacher))
    config.trainer.callbacks = {"ema": {"_target_": "fastgen.callbacks.ema.EMACallback", "ema_name": "ema",
                                        "beta": 0.5}}
    config.trainer.max_iter = max_iter
    config.trainer.save_ckpt_iter = 2
    config.log_config.name = name
    trainer = Trainer(config)
    trainer.model = trainer.run()
    return trainer


def test_checkpoints_hold_what_trains_and_a_resume_rebuilds_the_teacher(tmp_path: Path) -> None:
    teacher = teacher_file(tmp_path)
    whole = run("whole", teacher, max_iter=6)
    payload = load_checkpoint(whole.checkpointer.path_for(6))
    assert set(payload["model"]) == set(whole.model.saved_modules) == {"net", "ema", "fake_score", "discriminator"}
    assert set(payload["frozen_fingerprints"]) == {"teacher"}

    run("halves", teacher, max_iter=4)
    resumed = run("halves", teacher, max_iter=6)  # resumes from iteration 4, the teacher rebuilt from its file
    assert resumed.start_iteration == 4
    assert_same_tree(state_tensors(load_checkpoint(resumed.checkpointer.path_for(6))), state_tensors(payload))


def test_a_resume_with_another_teacher_is_refused(tmp_path: Path) -> None:
    teacher = teacher_file(tmp_path)
    run("swap", teacher, max_iter=2)
    state = torch.load(teacher, weights_only=True)
    first = next(iter(state))
    state[first] = state[first] + 1e-3  # a teacher that differs in one tensor
    torch.save(state, teacher)
    with pytest.raises(CheckpointError, match=r"trained with another teacher than the one rebuilt from "
                                              r"model\.teacher_ckpt=.*teacher7\.pth"):
        run("swap", teacher, max_iter=4)


def test_sample_teacher_rebuilds_it_from_its_source(tmp_path: Path) -> None:
    from fastgen.evaluation.sampling import load_run, select_net

    teacher = teacher_file(tmp_path)
    trained = run("sampled", teacher, max_iter=2)
    loaded = load_run(trained.run_dir)
    assert "teacher" not in loaded.loaded  # not read unless asked for: its source may be out of reach
    net = select_net(loaded, "teacher")
    expected = torch.load(teacher, weights_only=True)
    assert all(torch.equal(net.state_dict()[k], expected[k]) for k in expected)

    expected[next(iter(expected))].add_(1.0)
    torch.save(expected, teacher)
    with pytest.raises(CheckpointError, match="is not the one checkpoint .* was trained with"):
        select_net(load_run(trained.run_dir), "teacher")
