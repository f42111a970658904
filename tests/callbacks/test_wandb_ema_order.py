"""The samples W&B logs at iteration k come from the EMA network *after* EMA update k, whatever the callback order."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from fastgen.callbacks.callback import Callback
from fastgen.callbacks.log_modules.base import LogModule, MediaEntry
from fastgen.configs.callbacks import EMA_CALLBACK, GradClip_CALLBACK
from fastgen.configs.instantiate import LazyCall
from fastgen.trainer import Trainer
from fastgen_testing import tiny_toy_config

NUM_SAMPLES = 16


class EMASnapshot(Callback):
    """A copy of the EMA network's state at this callback's ``on_training_step_end``, by iteration."""

    def __init__(self) -> None:
        self.states: dict[int, dict[str, torch.Tensor]] = {}

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0) -> None:
        self.states[iteration] = {k: v.detach().clone() for k, v in model.ema_nets["ema"].state_dict().items()}


class SampleRecorder(LogModule):
    def __init__(self) -> None:
        self.samples: dict[int, torch.Tensor] = {}

    def process(self, entries: list[MediaEntry], iteration: int) -> None:
        self.samples[iteration] = torch.stack([e.data for e in entries])


def _samples_with(model: Any, state: dict[str, torch.Tensor]) -> torch.Tensor:
    net = copy.deepcopy(model.sampling_net())
    net.load_state_dict(state)
    samples, _ = model.sample(NUM_SAMPLES, generator=torch.Generator().manual_seed(0), net=net)
    return samples.cpu()


@pytest.mark.parametrize("order", [["before", "wandb", "ema", "after"], ["before", "ema", "after", "wandb"]],
                         ids=["wandb_before_ema", "ema_before_wandb"])
def test_samples_use_the_ema_after_this_steps_update(order: list[str]) -> None:
    ema = copy.deepcopy(EMA_CALLBACK["ema"])
    ema.beta = 0.5  # a large step per update, so the EMA before and after an update give different samples
    nodes = {
        "before": LazyCall(EMASnapshot)(),
        "after": LazyCall(EMASnapshot)(),
        "ema": ema,
        "wandb": LazyCall("fastgen.callbacks.wandb.WandbCallback")(sample_iter=2, num_samples=NUM_SAMPLES),
    }
    config = tiny_toy_config("ema_order_" + order[1], max_iter=5, save_ckpt_iter=100, logging_iter=1)
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **{name: nodes[name] for name in order}})
    recorder = SampleRecorder()
    trainer = Trainer(config)
    trainer.callbacks["wandb"].log_modules["rec"] = recorder
    model = trainer.run()
    before, after = trainer.callbacks["before"].states, trainer.callbacks["after"].states
    assert sorted(recorder.samples) == [2, 4, 5]  # every sample_iter, and at the end of training
    for k, logged in recorder.samples.items():
        assert torch.equal(logged, _samples_with(model, after[k])), f"iteration {k}: not the updated EMA"
        assert not torch.equal(logged, _samples_with(model, before[k])), f"iteration {k}: the stale EMA"
