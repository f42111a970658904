"""Training on an image zip read by DataLoader worker processes: a run SIGKILLed mid-epoch and started again with the
same command ends bit-identical to an uninterrupted one (the loader's state names the next batch not yet used,
whatever the workers had prefetched)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from fastgen_testing import assert_same_checkpoint, run_cli

CONFIG = '''
import os
import signal

from omegaconf import DictConfig

from fastgen.callbacks.callback import Callback
from fastgen.configs.callbacks import EMA_CALLBACK
from fastgen.configs.data import image_zip_loader
from fastgen.configs.experiments.Digits.config_sft_digits import create_config as digits_teacher
from fastgen.configs.instantiate import LazyCall


class KillAt(Callback):
    def on_backward_begin(self, model, data_batch, output_batch, loss_dict, iteration=0, accum_iter=0):
        if os.environ.get("KILL_AT") == str(iteration):
            os.kill(os.getpid(), signal.SIGKILL)


def create_config():
    config = digits_teacher()
    config.model.net.backbone.model_channels = 8
    config.dataloader_train = image_zip_loader(os.environ["DIGITS_ZIP"], batch_size=32, xflip=True, num_workers=2)
    config.dataloader_train.persistent_workers = True
    config.dataloader_train.prefetch_factor = 4
    config.dataloader_val = None
    config.trainer.max_iter = 10
    config.trainer.save_ckpt_iter = 4
    config.trainer.logging_iter = 5
    config.trainer.callbacks = DictConfig({**EMA_CALLBACK})
    config.trainer.callbacks.ema.type = "power"
    config.trainer.callbacks["kill"] = LazyCall(KillAt)()
    config.log_config.wandb_mode = "disabled"
    return config
'''


@pytest.mark.slow
def test_sigkill_with_loader_workers_then_same_command_is_bit_identical(output_root: Path, tmp_path: Path) -> None:
    """Measured ~45 s on the 2-core CPU machine (three runs of a small digits U-Net, 10 iterations each)."""
    from fastgen.datasets.prepare import prepare

    prepare("digits", tmp_path / "data")
    env = {"DIGITS_ZIP": str(tmp_path / "data" / "digits" / "digits-8x8.zip")}
    config = tmp_path / "zip_workers.py"
    config.write_text(CONFIG)
    straight = run_cli("train", f"--config={config}", "-", "log_config.name=straight", cwd=tmp_path, env=env)
    assert straight.returncode == 0, straight.stderr
    command = ("train", f"--config={config}", "-", "log_config.name=killed")
    killed = run_cli(*command, cwd=tmp_path, env={**env, "KILL_AT": "6"})  # after the checkpoint at 4
    assert killed.returncode == -signal.SIGKILL
    resumed = run_cli(*command, cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr
    final = "fastgen/digits/{}/checkpoints/0000010.pth"
    assert_same_checkpoint(output_root / final.format("straight"), output_root / final.format("killed"))
