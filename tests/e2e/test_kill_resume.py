"""A run killed with SIGKILL and started again with the same command ends bit-identical to an uninterrupted one.

The run uses everything that carries state across a restart: Adam moments, the EMA network, gradient
accumulation, validation (which consumes random numbers), label dropout, a data loader mid-epoch, and a
callback with its own state.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from fastgen.utils.checkpointer import load_checkpoint
from fastgen_testing import assert_same_weights, run_cli

CONFIG = '''
import os
import signal

from omegaconf import DictConfig

from fastgen.callbacks.callback import Callback
from fastgen.configs.callbacks import EMA_CALLBACK, GradClip_CALLBACK
from fastgen.configs.data import toy_loader
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net import toy_mlp


class KillSwitch(Callback):
    """Signals this process at the place named by KILL_AT: 'backward:<iteration>' or 'save:<iteration>' send
    SIGKILL, 'term:<iteration>' sends SIGTERM (a pre-empted cluster job)."""

    def __init__(self):
        self.seen = 0

    def _maybe_die(self, where, iteration):
        if os.environ.get("KILL_AT") == f"{where}:{iteration}":
            os.kill(os.getpid(), signal.SIGKILL)

    def on_backward_begin(self, model, data_batch, output_batch, loss_dict, iteration=0, accum_iter=0):
        self.seen += 1
        if accum_iter == 1:
            self._maybe_die("backward", iteration)
        if accum_iter == 0 and os.environ.get("KILL_AT") == f"term:{iteration}":
            os.kill(os.getpid(), signal.SIGTERM)

    def on_save_checkpoint_start(self, model, iteration=0):
        self._maybe_die("save", iteration)

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state_dict):
        self.seen = state_dict["seen"]


def create_config():
    config = sft_config()
    config.model.net = toy_mlp(hidden_dim=32, num_layers=2)
    config.model.input_shape = [2]
    config.model.use_ema = True
    config.dataloader_train = toy_loader("two_moons", batch_size=16, num_samples=200)
    config.dataloader_val = toy_loader("two_moons", batch_size=16, num_samples=64, seed=3)
    config.trainer.max_iter = 14
    config.trainer.batch_size_global = 32
    config.trainer.logging_iter = 3
    config.trainer.save_ckpt_iter = 4
    config.trainer.validation_iter = 3
    config.trainer.max_val_iter = 2
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK})
    config.trainer.callbacks.ema.type = "power"
    config.trainer.callbacks["kill"] = LazyCall(KillSwitch)()
    config.log_config.wandb_mode = "disabled"
    return config
'''


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "kill_cfg.py"
    path.write_text(CONFIG)
    return path


def _final(output_root: Path, name: str) -> Path:
    return output_root / "fastgen" / "default" / name / "checkpoints" / "0000014.pth"


def _assert_identical(path_a: Path, path_b: Path) -> None:
    assert_same_weights(path_a, path_b)
    a, b = load_checkpoint(path_a), load_checkpoint(path_b)
    assert torch.equal(a["rng"][0]["torch"], b["rng"][0]["torch"])
    assert a["callbacks"] == b["callbacks"]
    assert a["dataloaders"] == b["dataloaders"]


@pytest.mark.slow
def test_sigkill_then_same_command_is_bit_identical(config_file: Path, output_root: Path, tmp_path: Path) -> None:
    straight = run_cli("train", f"--config={config_file}", "-", "log_config.name=straight", cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr

    command = ("train", f"--config={config_file}", "-", "log_config.name=killed")
    # Killed mid-step (between the two accumulation rounds of iteration 9), after the checkpoint at 8.
    first = run_cli(*command, cwd=tmp_path, env={"KILL_AT": "backward:9"})
    assert first.returncode == -signal.SIGKILL
    ckpts = output_root / "fastgen" / "default" / "killed" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("*.pth")) == ["0000004.pth", "0000008.pth"]
    # Killed again, this time as the checkpoint at 12 is about to be written.
    second = run_cli(*command, cwd=tmp_path, env={"KILL_AT": "save:12"})
    assert second.returncode == -signal.SIGKILL
    assert not (ckpts / "0000012.pth").exists()
    # The same command once more, undisturbed.
    third = run_cli(*command, cwd=tmp_path)
    assert third.returncode == 0, third.stderr
    assert "resumed from" in third.stderr

    _assert_identical(_final(output_root, "straight"), _final(output_root, "killed"))


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_the_same_command_resumes(config_file: Path, output_root: Path, tmp_path: Path) -> None:
    straight = run_cli("train", f"--config={config_file}", "-", "log_config.name=straight", cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr
    command = ("train", f"--config={config_file}", "-", "log_config.name=preempted")
    stopped = run_cli(*command, cwd=tmp_path, env={"KILL_AT": "term:5"})
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    assert "stopped by SIGTERM at iteration 6" in stopped.stderr and "Traceback" not in stopped.stderr
    ckpts = output_root / "fastgen" / "default" / "preempted" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("*.pth")) == ["0000004.pth", "0000006.pth"]
    resumed = run_cli(*command, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    _assert_identical(_final(output_root, "straight"), _final(output_root, "preempted"))
