"""Where a distillation student starts: ``model.student_ckpt`` (another run's network, e.g. a KD student that DMD2
refines) and ``trainer.checkpointer.pretrained_ckpt_path`` (an EMA the checkpoint lacks starts from the loaded
net). Real runs of the real Trainer write the checkpoints that are loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig
from test_dmd2 import build, toy_dmd2

from fastgen.checkpoint.checkpointer import load_checkpoint
from fastgen.configs.instantiate import LazyCall
from fastgen.configs.net import toy_mlp
from fastgen.trainer import Trainer
from fastgen.utils.errors import CheckpointError, UsageError


def trained_run(name: str, max_iter: int = 4) -> Path:
    """A few DMD2 iterations with an EMA (beta 0.5, so the EMA differs from the net; the GAN term moves the
    student even though the fake score starts equal to the teacher): the run directory."""
    config = toy_dmd2(gan=True, use_ema=True)
    config.trainer.callbacks = DictConfig({"ema": LazyCall("fastgen.callbacks.ema.EMACallback")(ema_name="ema", beta=0.5)})
    config.trainer.max_iter = max_iter
    config.trainer.save_ckpt_iter = 2
    config.log_config.name = name
    trainer = Trainer(config)
    trainer.run()
    return trainer.run_dir


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[key], b[key]) for key in a)


def same(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> bool:
    return same_weights(module.state_dict(), state)


def test_student_starts_from_another_runs_network() -> None:
    run_dir = trained_run("source")
    payload = load_checkpoint(run_dir / "checkpoints" / "0000004.pth")
    newest = payload["model"]
    assert not same_weights(newest["net"], newest["ema"])
    assert "teacher" not in newest  # frozen: rebuilt from its source, recorded by its fingerprint
    from fastgen.distributed.fingerprint import network_fingerprint

    for source in (run_dir, run_dir / "checkpoints", run_dir / "checkpoints" / "0000004.pth"):
        model = build(toy_dmd2(use_ema=True, student_ckpt=str(source)))  # auto: the source's EMA network
        assert same(model.net, newest["ema"]) and same(model.ema_nets["ema"], newest["ema"])
        assert network_fingerprint(model.teacher) == payload["frozen_fingerprints"]["teacher"]
        assert same(model.fake_score, model.teacher.state_dict())
    model = build(toy_dmd2(student_ckpt=str(run_dir), student_ckpt_key="net"))
    assert same(model.net, newest["net"])
    older = load_checkpoint(run_dir / "checkpoints" / "0000002.pth")["model"]
    model = build(toy_dmd2(student_ckpt=str(run_dir / "checkpoints" / "0000002.pth"), student_ckpt_key="net"))
    assert same(model.net, older["net"])


def test_student_ckpt_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"model\.student_ckpt: checkpoint not found"):
        build(toy_dmd2(student_ckpt=str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"model\.student_ckpt: no valid checkpoint"):
        build(toy_dmd2(student_ckpt=str(tmp_path / "empty")))
    run_dir = trained_run("other_width")
    with pytest.raises(CheckpointError, match="do not fit model.net"):
        build(toy_dmd2(student_ckpt=str(run_dir), net=toy_mlp(hidden_dim=48, num_layers=2)))
    with pytest.raises(CheckpointError, match="has no module 'ema_missing'"):
        build(toy_dmd2(student_ckpt=str(run_dir), student_ckpt_key="ema_missing"))


def test_a_missing_student_ckpt_leaves_no_run_directory(tmp_path: Path) -> None:
    config = toy_dmd2(student_ckpt=str(tmp_path / "missing"))
    config.log_config.name = "no_run"
    trainer = Trainer(config)
    with pytest.raises(UsageError):
        trainer.run()
    assert not trainer.run_dir.exists()


@pytest.mark.parametrize("field", ["student_ckpt", "teacher_ckpt"])
def test_weights_that_do_not_fit_leave_no_run_directory(field: str) -> None:
    """A fresh run whose student or teacher checkpoint does not fit the configured network stops before its first
    iteration (a one-line CheckpointError) and, like a typo, leaves no config.yaml of a run that never happened."""
    source = trained_run("wider_source")
    checkpoint = source / "checkpoints" / "0000004.pth"
    config = toy_dmd2(net=toy_mlp(hidden_dim=48, num_layers=2), **{field: str(checkpoint)})
    config.log_config.name = "does_not_fit"
    trainer = Trainer(config)
    with pytest.raises(CheckpointError, match="do not fit model"):
        trainer.run()
    assert not trainer.run_dir.exists() and source.exists()


def test_pretrained_checkpoint_without_an_ema_starts_the_ema_from_the_loaded_net(tmp_path: Path) -> None:
    source = build(toy_dmd2())
    with torch.no_grad():
        for p in source.net.parameters():
            p.add_(1.0)
    path = tmp_path / "net_only.pth"
    torch.save(source.net.state_dict(), path)  # a bare state dict: the weights of `net`
    config = toy_dmd2(use_ema=True)
    config.trainer.callbacks = DictConfig({"ema": LazyCall("fastgen.callbacks.ema.EMACallback")(ema_name="ema", beta=0.5)})
    config.trainer.max_iter = 0
    config.trainer.checkpointer.pretrained_ckpt_path = str(path)
    config.log_config.name = "pretrained"
    model = Trainer(config).run()
    state = source.net.state_dict()
    assert same(model.net, state) and same(model.ema_nets["ema"], state)


def test_the_start_checks_take_a_run_directory_as_the_student_but_not_as_the_teacher(tmp_path: Path) -> None:
    """``fastgen train``'s path checks (``data_path_problems``) let ``model.student_ckpt`` name a run directory or
    checkpoints folder (its newest checkpoint, as documented) and still refuse a folder as ``model.teacher_ckpt``."""
    from fastgen.configs.checks import data_path_problems
    from fastgen.configs.config_utils import load_config

    config = load_config("Toy/config_dmd2_toy")
    config.model.student_ckpt = str(tmp_path)
    config.model.teacher_ckpt = None
    assert not [p for p in data_path_problems(config) if "ckpt" in p]
    config.model.teacher_ckpt = str(tmp_path)
    assert [p for p in data_path_problems(config) if "ckpt" in p] == [
        f"model.teacher_ckpt: {tmp_path} is a folder; name the checkpoint file in it (a .pth, e.g. a run's "
        "checkpoints/NNNNNNN.pth; for a sharded one its marker .pth), or set model.teacher_ckpt=<file>"]
