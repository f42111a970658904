"""A small toy diffusion teacher, trained once per test session with the real Trainer (SFT, EDM, eight
Gaussians), for the distillation tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastgen.configs.methods.config_sft import create_config as sft_config
from toy_distill import TEACHER_ITERS, small_toy_mlp, toy_run_config


@pytest.fixture(scope="session")
def toy_teacher_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final checkpoint of a toy SFT run (the teacher of the distillation tests)."""
    from fastgen.trainer import Trainer

    root = tmp_path_factory.mktemp("toy_teacher")
    config = toy_run_config(sft_config(), "teacher", TEACHER_ITERS)
    config.model.net = small_toy_mlp()
    config.model.net_optimizer.lr = 2e-3
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTGEN_OUTPUT_ROOT", str(root))
        mp.setenv("WANDB_MODE", "disabled")
        mp.setenv("FASTGEN_NO_PROGRESS", "1")
        torch.manual_seed(0)
        trainer = Trainer(config)
        trainer.run()
    assert trainer.last_checkpoint is not None
    return Path(trainer.last_checkpoint)
