"""Helpers for tests: tiny configs that train in a fraction of a second, and a hook recorder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from fastgen.callbacks.callback import HOOKS, Callback
from fastgen.configs.callbacks import EMA_CALLBACK, GradClip_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import toy_loader
from fastgen.configs.methods.config_sft import create_config as sft_config
from fastgen.configs.net import toy_mlp

FASTGEN = str(Path(sys.executable).parent / "fastgen")


def tiny_toy_config(name: str = "tiny", max_iter: int = 6, **trainer: Any) -> BaseConfig:
    """An MLP on eight Gaussians: ~3k parameters, milliseconds per step."""
    config = sft_config()
    config.model.net = toy_mlp(hidden_dim=32, num_layers=1)
    config.model.input_shape = [2]
    config.model.use_ema = True
    config.dataloader_train = toy_loader("eight_gaussians", batch_size=16, num_samples=256)
    config.dataloader_val = toy_loader("eight_gaussians", batch_size=16, num_samples=64, seed=1)
    config.trainer.max_iter = max_iter
    config.trainer.logging_iter = 2
    config.trainer.save_ckpt_iter = 3
    config.trainer.validation_iter = None
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK})
    config.log_config.name = name
    config.log_config.wandb_mode = "disabled"
    for key, value in trainer.items():
        setattr(config.trainer, key, value)
    return config


class HookRecorder(Callback):
    """Records ``(hook, iteration)`` for every hook call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []

    def state_dict(self) -> dict[str, Any]:
        return {"n_calls": len(self.calls)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.restored = state_dict


class SecretHolder(Callback):
    """A callback configured with a secret (like a judge's API key)."""

    def __init__(self, api_key: str | None = None, note: str = "") -> None:
        self.api_key = api_key
        self.note = note


def _recorder(hook: str):
    def method(self: HookRecorder, *args: Any, **kwargs: Any) -> None:
        self.calls.append((hook, kwargs.get("iteration")))

    method.__name__ = hook
    return method


for _hook in HOOKS:
    setattr(HookRecorder, _hook, _recorder(_hook))


def state_tensors(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's model and optimizer state, flattened by path."""
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, torch.Tensor):
            flat[prefix] = node
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}", value)
        elif isinstance(node, (list, tuple)):
            for i, value in enumerate(node):
                walk(f"{prefix}.{i}", value)

    walk("model", checkpoint["model"])
    walk("optimizers", checkpoint["optimizers"])
    return flat


def assert_same_weights(path_a: Path, path_b: Path) -> None:
    """Two checkpoints hold bit-identical model and optimizer tensors."""
    from fastgen.utils.checkpointer import load_checkpoint

    a, b = state_tensors(load_checkpoint(path_a)), state_tensors(load_checkpoint(path_b))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run the installed ``fastgen`` command and capture its output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([FASTGEN, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    """A free TCP port on loopback, for a test's process group rendezvous."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shutdown_gloo() -> None:
    """Leave a test process group cleanly: a barrier first, so no rank tears down its connections while another
    is still using them (that race aborts the slower process with 'terminate called without an active
    exception')."""
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def join_ranks(context: Any, timeout: float = 90.0) -> None:
    """Wait for ``torch.multiprocessing.start_processes(..., join=False)`` workers; kill them on timeout."""
    import time

    import pytest

    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"the ranks did not finish within {timeout:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


def exit_rank() -> None:
    """End a spawned test rank at once, after its results are written.

    Interpreter teardown would otherwise destroy leftover distributed objects (a DeviceMesh, DTensor
    parameters) in arbitrary order after the process group is gone, which sometimes aborts the process.
    """
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
