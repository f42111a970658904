"""Contract test for every callback class fastgen ships, discovered automatically.

For each ``Callback`` subclass defined in ``fastgen.callbacks``: a preset in ``fastgen.configs.callbacks``
builds it; it survives every hook of a real CPU run (validation and checkpoints included); its ``state_dict``
round-trips through a real checkpoint file; and a run with it, stopped and resumed, ends bit-identical to an
uninterrupted run.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch
from fastgen_testing import assert_same_weights, tiny_toy_config
from omegaconf import DictConfig

import fastgen.callbacks
import fastgen.configs.callbacks as presets
from fastgen.callbacks.callback import Callback
from fastgen.checkpoint.checkpointer import load_checkpoint
from fastgen.configs.instantiate import instantiate
from fastgen.trainer import Trainer


def shipped_callback_classes() -> list[type[Callback]]:
    found = {}
    for info in pkgutil.iter_modules(fastgen.callbacks.__path__):
        module = importlib.import_module(f"fastgen.callbacks.{info.name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Callback) and obj is not Callback and obj.__module__ == module.__name__:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def preset_for(cls: type[Callback]) -> dict[str, DictConfig]:
    path = f"{cls.__module__}.{cls.__qualname__}"
    for name, value in vars(presets).items():
        if name.isupper() and isinstance(value, dict):
            for key, node in value.items():
                if isinstance(node, DictConfig) and node.get("_target_") == path:
                    return {key: node}
    raise AssertionError(f"no preset in fastgen/configs/callbacks.py builds {path}")


CLASSES = shipped_callback_classes()


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_discovery_finds_the_core_callbacks() -> None:
    names = {c.__name__ for c in CLASSES}
    assert {"EMACallback", "GradClipCallback", "WandbCallback"} <= names


def _config(cls: type[Callback], name: str, max_iter: int):
    config = tiny_toy_config(name, max_iter=max_iter, save_ckpt_iter=2, validation_iter=2, max_val_iter=1)
    config.trainer.callbacks = DictConfig({**config.trainer.callbacks, **preset_for(cls)})
    if cls.__name__ == "LossScaleCallback":
        config.model.precision_amp = "float16"  # the only setting it is accepted with
    return config


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_callback_contract(cls: type[Callback]) -> None:
    preset = preset_for(cls)
    assert isinstance(instantiate(next(iter(preset.values()))), cls)

    straight = Trainer(_config(cls, f"{cls.__name__}_straight", max_iter=6))
    straight.run()

    first = Trainer(_config(cls, f"{cls.__name__}_resumed", max_iter=4))
    first.run()
    name = next(iter(preset))
    saved = load_checkpoint(first.checkpointer.path_for(4))
    state = saved["callbacks"].get(name, {})
    fresh = instantiate(next(iter(preset.values())))
    fresh.load_state_dict(state)  # the saved state loads into a new instance and reads back the same
    assert _same(fresh.state_dict(), state)

    resumed = Trainer(_config(cls, f"{cls.__name__}_resumed", max_iter=6))
    resumed.run()
    assert resumed.start_iteration == 4
    assert_same_weights(straight.checkpointer.path_for(6), resumed.checkpointer.path_for(6))
