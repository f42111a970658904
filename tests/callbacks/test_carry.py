"""CarryCallback: commits after completed steps only, all or nothing, validation opt-in, exact resume."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import torch
from fastgen_testing import assert_same_weights, tiny_toy_config
from omegaconf import DictConfig

from fastgen.callbacks.callback import Callback
from fastgen.callbacks.carry import CarryCallback
from fastgen.checkpoint.checkpointer import load_checkpoint
from fastgen.configs.callbacks import CARRY_CALLBACK
from fastgen.configs.instantiate import LazyCall, instantiate
from fastgen.methods.sft import SFTModel
from fastgen.trainer import Trainer


class CarrySFT(SFTModel):
    """SFT whose loss is divided by a running scale carried across iterations, so the carried state changes the
    weights; it also counts the iterations it has seen and records what it read."""

    nan_aux_at: int | None = None  # propose a non-finite "aux" entry at this iteration

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.carry_state = {"scale": torch.ones(()), "steps": torch.zeros((), dtype=torch.int64), "aux": torch.zeros(3)}
        self.reads: list[tuple[bool, int]] = []  # (training, carried steps) at each single_train_step

    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        loss_dict, outputs = super().single_train_step(data, iteration)
        state = self.carry_state
        raw = loss_dict["total_loss"]
        self.reads.append((torch.is_grad_enabled(), int(state["steps"])))
        aux = state["aux"] + raw.detach()
        if iteration == self.nan_aux_at and torch.is_grad_enabled():
            aux = aux * float("nan")
        self.propose_carry({"scale": 0.5 * state["scale"] + 0.5 * raw, "steps": state["steps"] + 1, "aux": aux})
        return {**loss_dict, "total_loss": raw / state["scale"]}, outputs


class NanAuxAtTwo(CarrySFT):
    nan_aux_at = 2


class Watch(Callback):
    """Runs after the carry callback: what the committed state is at step ends and around validation."""

    def __init__(self) -> None:
        self.after_step: dict[int, tuple[dict[str, torch.Tensor], bool]] = {}
        self.validation: list[tuple[int, dict[str, torch.Tensor], dict[str, torch.Tensor]]] = []

    def on_training_step_end(self, model, data_batch, output_batch, loss_dict, iteration=0):
        self.after_step[iteration] = (model.carry_state, self.trainer.step_skipped)

    def on_validation_begin(self, model, iteration=0):
        self._before = (model.carry_state, {k: v.clone() for k, v in model.carry_state.items()})

    def on_validation_end(self, model, loss_dict=None, iteration=0):
        self.validation.append((iteration, self._before, model.carry_state))


class PoisonGradAt(Callback):
    """Makes the gradient of one iteration non-finite, so GradClipCallback skips that optimizer step."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def on_backward_begin(self, model, data_batch, output_batch, loss_dict, iteration=0, accum_iter=0):
        if iteration == self.iteration:
            loss_dict["total_loss"] = loss_dict["total_loss"] * float("nan")


def _config(name: str, max_iter: int, model_class: type = CarrySFT, through_validation: bool = False, **trainer: Any):
    config = tiny_toy_config(name, max_iter=max_iter, **trainer)
    config.model_class = LazyCall(model_class)()
    config.trainer.callbacks = DictConfig({**config.trainer.callbacks, **CARRY_CALLBACK})
    config.trainer.callbacks.carry.carry_through_validation = through_validation
    return config


def _run(config, **extra: Callback) -> tuple[Trainer, Any]:
    trainer = Trainer(config, extra_callbacks={**extra, "watch": Watch()})
    model = trainer.run()
    return trainer, model


def test_each_completed_step_commits_its_proposal() -> None:
    trainer, model = _run(_config("carry_commit", max_iter=4))
    watch = trainer.callbacks["watch"]
    for it in range(1, 5):
        state, skipped = watch.after_step[it]
        assert not skipped and int(state["steps"]) == it
        assert not state["scale"].requires_grad  # committed values are detached: no graph kept across steps
    assert [steps for _, steps in model.reads] == [0, 1, 2, 3]  # each step read the previous step's commit
    assert trainer.callbacks["carry"].commits == 4


def test_a_skipped_step_keeps_the_old_state() -> None:
    trainer, model = _run(_config("carry_skip", max_iter=4), poison=PoisonGradAt(iteration=2))
    watch = trainer.callbacks["watch"]
    assert trainer.callbacks["grad_clip"].nonfinite_total == 1  # the real skip path ran
    kept, skipped = watch.after_step[3]  # the step of iteration index 2 completes as count 3
    assert skipped
    assert kept is watch.after_step[2][0] and int(kept["steps"]) == 2
    assert [steps for _, steps in model.reads] == [0, 1, 2, 2]  # the step after the skip reads the old state
    assert int(model.carry_state["steps"]) == 3
    assert trainer.callbacks["carry"].commits == 3


def test_a_proposal_with_a_bad_entry_leaves_the_whole_old_state(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fastgen"):
        trainer, model = _run(_config("carry_bad", max_iter=4, model_class=NanAuxAtTwo))
    watch = trainer.callbacks["watch"]
    old, new = watch.after_step[2][0], watch.after_step[3][0]
    assert new is old  # neither "scale" nor "steps" moved although they were finite
    assert int(new["steps"]) == 2 and torch.isfinite(new["aux"]).all()
    assert trainer.callbacks["carry"].rejected == 1
    assert any("non-finite values in aux" in r.getMessage() for r in caplog.records)
    assert int(model.carry_state["steps"]) == 3


def test_proposals_must_be_tensors() -> None:
    config = _config("carry_types", max_iter=0)
    model = instantiate(config.model_class, config=config.model)
    with pytest.raises(TypeError, match="'steps' is a int"):
        model.propose_carry({"scale": torch.ones(()), "steps": 3})
    assert model.take_carry_proposal() is None


def test_validation_leaves_the_state_untouched_by_default() -> None:
    trainer, model = _run(_config("carry_val", max_iter=4, validation_iter=2, max_val_iter=2))
    validations = trainer.callbacks["watch"].validation
    assert [it for it, _, _ in validations] == [2, 4]
    for _, (before, values), after in validations:
        assert after is before
        assert all(torch.equal(after[k], values[k]) for k in values)
    assert (False, 2) in model.reads  # validation did read the state (and proposed) ...
    assert int(model.carry_state["steps"]) == 4  # ... but only the 4 training steps were committed


def test_validation_carries_when_switched_on() -> None:
    trainer, model = _run(_config("carry_val_on", max_iter=4, through_validation=True, validation_iter=2, max_val_iter=2))
    reads = model.reads
    # train 0, 1 | validate 2, 3 | train 4, 5 | validate 6, 7: each validation step reads the previous commit.
    assert reads == [(True, 0), (True, 1), (False, 2), (False, 3), (True, 4), (True, 5), (False, 6), (False, 7)]
    assert int(model.carry_state["steps"]) == 8


def test_the_state_survives_checkpoint_and_resume() -> None:
    def config(name: str, max_iter: int):
        return _config(name, max_iter=max_iter, through_validation=True, save_ckpt_iter=2, validation_iter=3,
                       max_val_iter=1)

    straight, straight_model = _run(config("carry_straight", 6))
    _run(config("carry_resumed", 4))
    resumed, resumed_model = _run(config("carry_resumed", 6))
    assert resumed.start_iteration == 4
    assert resumed_model.reads[0] == (True, 5)  # 4 steps + 1 validation step, restored - not started over
    assert_same_weights(straight.checkpointer.path_for(6), resumed.checkpointer.path_for(6))
    a = load_checkpoint(straight.checkpointer.path_for(6))["callbacks"]["carry"]
    b = load_checkpoint(resumed.checkpointer.path_for(6))["callbacks"]["carry"]
    assert a["state"].keys() == b["state"].keys() == {"scale", "steps", "aux"}
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
    assert a["commits"] == b["commits"] == 6 + 2
    for key, value in straight_model.carry_state.items():
        assert torch.equal(value, resumed_model.carry_state[key])


def test_a_method_without_carry_state_makes_it_a_no_op(caplog: pytest.LogCaptureFixture) -> None:
    config = tiny_toy_config("carry_none", max_iter=2)
    config.trainer.callbacks = DictConfig({**config.trainer.callbacks, **CARRY_CALLBACK})
    with caplog.at_level(logging.INFO, logger="fastgen"):
        trainer = Trainer(config)
        trainer.run()
    assert sum("carries no state" in r.getMessage() for r in caplog.records) == 1
    assert trainer.callbacks["carry"].state_dict() == {}
    assert "carry" not in load_checkpoint(trainer.checkpointer.path_for(2))["callbacks"]


def test_a_state_loaded_before_the_method_exists_is_applied_later() -> None:
    saved = {"state": {"steps": torch.tensor(7), "scale": torch.tensor(2.0)}, "on_cpu": ["scale", "steps"],
             "commits": 7, "rejected": 0}
    callback = CarryCallback()
    callback.load_state_dict(saved)
    again = callback.state_dict()  # round trip without a method
    assert again.keys() == saved.keys() and again["on_cpu"] == saved["on_cpu"] and again["commits"] == 7
    assert all(torch.equal(again["state"][k], v) for k, v in saved["state"].items())
    config = _config("carry_late", max_iter=0)
    model = instantiate(config.model_class, config=config.model)
    callback.on_model_init_end(model)
    assert int(model.carry_state["steps"]) == 7 and math.isclose(float(model.carry_state["scale"]), 2.0)
    assert callback.commits == 7
