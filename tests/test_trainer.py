"""The training loop: hook order (fresh and resumed), step counting, accumulation, validation, checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastgen_testing import HookRecorder, tiny_toy_config

from fastgen.callbacks.callback import Callback, CallbackDict
from fastgen.checkpoint.checkpointer import load_checkpoint
from fastgen.configs.instantiate import LazyCall
from fastgen.trainer import Trainer
from fastgen.utils.errors import CheckpointError, ConfigError, UsageError

SETUP = [
    ("on_app_begin", None),
    ("on_model_init_start", None),
    ("on_model_init_end", None),
    ("on_optimizer_init_start", None),
    ("on_optimizer_init_end", None),
    ("on_load_checkpoint_start", None),
]


def documented_order(start: int, end: int, rounds: int, val_every: int, ckpt_every: int) -> list[tuple[str, int | None]]:
    """The sequence the Trainer docstring promises, written out independently of the trainer's code."""
    calls = [*SETUP, ("on_load_checkpoint_end", start), ("on_dataloader_init_start", None),
             ("on_dataloader_init_end", None), ("on_train_begin", start)]
    for it in range(start, end):
        calls.append(("on_training_step_begin", it))
        for _ in range(rounds):
            calls += [("on_training_accum_step_begin", it), ("on_backward_begin", it), ("on_training_accum_step_end", it)]
        calls += [("on_optimizer_step_begin", it), ("on_training_step_end", it + 1)]
        if (it + 1) % val_every == 0:
            calls += [("on_validation_begin", it + 1), ("on_validation_step_begin", it + 1),
                      ("on_validation_step_end", it + 1), ("on_validation_end", it + 1)]
        if (it + 1) % ckpt_every == 0 or it + 1 == end:
            calls += [("on_save_checkpoint_start", it + 1), ("on_save_checkpoint_success", it + 1),
                      ("on_save_checkpoint_end", it + 1)]
    calls += [("on_train_end", end), ("on_app_end", None)]
    return calls


def _recorded_config(max_iter: int):
    config = tiny_toy_config("hooks", max_iter=max_iter, save_ckpt_iter=2, validation_iter=2, max_val_iter=1,
                             batch_size_global=32)  # per-rank batch 16 -> 2 accumulation rounds
    config.trainer.callbacks["recorder"] = LazyCall(HookRecorder)()
    return config


def test_hook_order_is_the_documented_one_fresh_and_after_resume() -> None:
    first = Trainer(_recorded_config(max_iter=4))
    first.run()
    recorder = first.callbacks["recorder"]
    assert recorder.calls == documented_order(0, 4, rounds=2, val_every=2, ckpt_every=2)

    resumed = Trainer(_recorded_config(max_iter=6))
    resumed.run()
    recorder = resumed.callbacks["recorder"]
    assert recorder.calls == documented_order(4, 6, rounds=2, val_every=2, ckpt_every=2)
    # The callback's own state came back from the checkpoint saved at iteration 4, under its name: it was taken
    # after on_save_checkpoint_start, before ..._success, ..._end, on_train_end and on_app_end.
    assert recorder.restored == {"n_calls": len(documented_order(0, 4, 2, 2, 2)) - 4}


def test_every_hook_is_documented_in_the_order_test() -> None:
    from fastgen.callbacks.callback import HOOKS

    covered = {name for name, _ in documented_order(0, 2, 1, 1, 1)}
    assert covered == set(HOOKS)


def test_exactly_max_iter_optimizer_steps_counting_restored_ones() -> None:
    config = tiny_toy_config("steps", max_iter=5, save_ckpt_iter=2)
    model = Trainer(config).run()
    state = model.optimizer_dict["net"].state_dict()["state"]
    assert all(int(s["step"]) == 5 for s in state.values())

    config = tiny_toy_config("steps", max_iter=7, save_ckpt_iter=2)
    trainer = Trainer(config)
    model = trainer.run()
    assert trainer.start_iteration == 5
    state = model.optimizer_dict["net"].state_dict()["state"]
    assert all(int(s["step"]) == 7 for s in state.values())

    # Asking for fewer iterations than already done trains nothing and keeps the weights.
    again = Trainer(tiny_toy_config("steps", max_iter=3))
    again.run()
    assert again.iteration == 7


def test_gradient_accumulation_rounds_follow_the_global_batch() -> None:
    trainer = Trainer(tiny_toy_config("accum", max_iter=2, batch_size_global=64))
    trainer.run()
    assert trainer.accum_rounds == 4 and trainer.global_batch_size == 64
    assert trainer.dataloader_train.position == 2 * 4 * 16

    with pytest.raises(ConfigError, match="batch_size_global=40"):
        Trainer(tiny_toy_config("accum_bad", max_iter=1, batch_size_global=40)).run()


def _first_step_gradient(label: str, batch_global: int, skip_batches: int = 0) -> list[torch.Tensor]:
    """Gradients of the first optimizer step; the noise of accumulation round k is seeded with 100 + k + skip."""
    config = tiny_toy_config(label, max_iter=1, batch_size_global=batch_global)
    config.model.use_ema = False
    config.trainer.callbacks = {}
    captured: list[torch.Tensor] = []

    class Control(Callback):
        def on_dataloader_init_end(self, model, dataloader_train=None, dataloader_val=None):
            for _ in range(skip_batches):
                next(dataloader_train)

        def on_training_accum_step_begin(self, model, data_batch, iteration=0, accum_iter=0):
            torch.manual_seed(100 + skip_batches + accum_iter)

        def on_optimizer_step_begin(self, model, iteration=0):
            captured.extend(p.grad.clone() for p in model.net.parameters())

    Trainer(config, extra_callbacks={"control": Control()}).run()
    return captured


def test_accumulated_gradient_is_the_mean_over_the_global_batch() -> None:
    """Two rounds of 16 give the mean of the two half-batch gradients (same samples, same noise)."""
    accumulated = _first_step_gradient("two_rounds", batch_global=32)
    first_half = _first_step_gradient("first_half", batch_global=16)
    second_half = _first_step_gradient("second_half", batch_global=16, skip_batches=1)
    for g, a, b in zip(accumulated, first_half, second_half, strict=True):
        torch.testing.assert_close(g, (a + b) / 2, rtol=1e-5, atol=1e-7)


def test_validation_runs_with_networks_in_eval_mode() -> None:
    seen = []

    class ModeProbe(Callback):
        def on_training_step_begin(self, model, iteration=0):
            seen.append(("train", model.net.training))

        def on_validation_step_begin(self, model, data_batch, iteration=0):
            seen.append(("val", model.net.training, torch.is_grad_enabled()))

        def on_validation_end(self, model, loss_dict=None, iteration=0):
            seen.append(("val_loss", sorted(loss_dict)))

    Trainer(tiny_toy_config("val", max_iter=4, validation_iter=2, max_val_iter=2),
            extra_callbacks={"probe": ModeProbe()}).run()
    assert ("val", False, False) in seen
    assert all(entry[1] for entry in seen if entry[0] == "train")
    assert ("val_loss", ["denoising_loss", "total_loss"]) in seen


def test_checkpoints_are_written_at_the_interval_and_at_the_end(output_root: Path) -> None:
    trainer = Trainer(tiny_toy_config("ckpt", max_iter=7, save_ckpt_iter=3))
    trainer.run()
    names = sorted(p.name for p in trainer.checkpointer.save_dir.iterdir())
    assert names == ["0000003.pth", "0000006.pth", "0000007.pth"]
    payload = load_checkpoint(trainer.checkpointer.save_dir / "0000007.pth")
    assert payload["iteration"] == 7
    assert set(payload["model"]) == {"net", "ema"}
    assert (trainer.run_dir / "config.yaml").is_file()
    assert trainer.run_dir == output_root / "fastgen" / "default" / "ckpt"


def test_keep_last_n_prunes_old_checkpoints() -> None:
    config = tiny_toy_config("prune", max_iter=9, save_ckpt_iter=2)
    config.trainer.checkpointer.keep_last_n = 2
    trainer = Trainer(config)
    trainer.run()
    assert sorted(p.name for p in trainer.checkpointer.save_dir.iterdir()) == ["0000008.pth", "0000009.pth"]


def test_a_corrupt_latest_checkpoint_is_a_clear_error() -> None:
    trainer = Trainer(tiny_toy_config("corrupt", max_iter=3))
    trainer.run()
    latest = trainer.checkpointer.latest()
    data = latest.read_bytes()
    latest.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        Trainer(tiny_toy_config("corrupt", max_iter=5)).run()
    latest.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="0000003.pth"):
        Trainer(tiny_toy_config("corrupt", max_iter=5)).run()


@pytest.mark.parametrize("entry", ["optimizers", "schedulers"])
@pytest.mark.parametrize("how", ["whole entry", "one module"])
def test_resuming_from_a_checkpoint_without_optimizer_or_scheduler_state_is_an_error(entry: str, how: str) -> None:
    """Resuming without a module's optimizer or scheduler state would silently restart it (Adam's moments at
    zero, the learning rate schedule at its start) - not the exact resume the trainer promises."""
    def config():  # noqa: ANN202
        c = tiny_toy_config("no_state", max_iter=5)
        c.model.net_scheduler = LazyCall("torch.optim.lr_scheduler.LinearLR")(start_factor=1.0, end_factor=0.5,
                                                                              total_iters=5)
        return c

    first = Trainer(config())
    first.run()
    latest = first.checkpointer.latest()
    payload = load_checkpoint(latest)
    assert set(payload[entry]) == {"net"}
    if how == "whole entry":
        del payload[entry]
    else:
        del payload[entry]["net"]
    torch.save(payload, latest)
    with pytest.raises(CheckpointError) as error:
        Trainer(config()).run()
    message = str(error.value)
    assert str(latest) in message and f"no {entry} entry for net" in message


def test_leftover_temporary_files_are_ignored_and_cleaned() -> None:
    trainer = Trainer(tiny_toy_config("tmpfile", max_iter=3))
    trainer.run()
    stale = trainer.checkpointer.save_dir / ".0000004.pth.abcd.tmp"
    stale.write_bytes(b"half a checkpoint")
    resumed = Trainer(tiny_toy_config("tmpfile", max_iter=5))
    resumed.run()
    assert resumed.start_iteration == 3
    assert not stale.exists()


def test_resume_false_starts_over_and_pretrained_path_loads_weights() -> None:
    first = Trainer(tiny_toy_config("pre", max_iter=3))
    first.run()
    # a run directory holds one run: a fresh start over another run's checkpoints is refused, nothing deleted
    with pytest.raises(UsageError, match=r"already holds another run's checkpoints \(newest 0000003.pth\)"):
        Trainer(tiny_toy_config("pre", max_iter=2, resume=False)).run()
    assert first.checkpointer.path_for(3).is_file()
    fresh = Trainer(tiny_toy_config("pre_again", max_iter=2, resume=False))
    fresh.run()
    assert fresh.start_iteration == 0

    config = tiny_toy_config("from_pretrained", max_iter=0)
    config.trainer.checkpointer.pretrained_ckpt_path = str(first.checkpointer.path_for(3))
    model = Trainer(config).run()
    weights = load_checkpoint(first.checkpointer.path_for(3))["model"]["net"]
    for key, value in model.net.state_dict().items():
        assert torch.equal(value, weights[key])


def test_unwritable_output_directory_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(blocker / "sub"))
    with pytest.raises(UsageError, match="cannot write to output directory"):
        Trainer(tiny_toy_config("nowrite", max_iter=1)).run()


def test_callback_names_are_unique() -> None:
    callbacks = CallbackDict({"a": Callback()})
    with pytest.raises(ValueError, match="unique"):
        callbacks.add("a", Callback())
    config = tiny_toy_config("dup", max_iter=1)
    with pytest.raises(ValueError, match="unique"):
        Trainer(config, extra_callbacks={"ema": Callback()})


def test_non_finite_gradients_skip_the_step_then_stop_training() -> None:
    """Iterations 2, 3 and 4 get a NaN loss: each step is skipped, and the third in a row stops training. A skipped
    step leaves everything an optimizer step would change exactly as it was after iteration 2: the network, the
    EMA, Adam's moments and ``step``, and the scheduler's ``last_epoch`` (compared at the end, after the skips)."""
    from fastgen.utils.errors import FastGenRuntimeError

    class PoisonLoss(Callback):
        def on_backward_begin(self, model, data_batch, output_batch, loss_dict, iteration=0, accum_iter=0):
            if iteration >= 2:
                loss_dict["total_loss"] = loss_dict["total_loss"] * float("nan")

    config = tiny_toy_config("nan", max_iter=20, save_ckpt_iter=100)
    config.trainer.callbacks.grad_clip.max_consecutive_nonfinite = 3
    config.model.net_scheduler = LazyCall("torch.optim.lr_scheduler.LinearLR")(start_factor=1.0, end_factor=0.5,
                                                                               total_iters=20)
    trainer = Trainer(config, extra_callbacks={"poison": PoisonLoss()})
    before: dict[str, object] = {}
    seen: dict[str, object] = {}

    def snapshot(model) -> dict[str, object]:  # noqa: ANN001
        optimizer = model.optimizer_dict["net"]
        return {
            "modules": {name: {k: v.clone() for k, v in module.state_dict().items()}
                        for name, module in model.model_dict.items()},
            "adam_steps": [float(s["step"]) for s in optimizer.state.values()],
            "adam_moments": [(s["exp_avg"].clone(), s["exp_avg_sq"].clone()) for s in optimizer.state.values()],
            "last_epoch": {name: s.last_epoch for name, s in model.scheduler_dict.items()},
            "lr": [group["lr"] for group in optimizer.param_groups],
        }

    class Snapshot(Callback):
        def on_training_step_end(self, model, data_batch, output_batch, loss_dict, iteration=0):
            seen["model"] = model
            if iteration == 2:
                before.update(snapshot(model))

    trainer.callbacks.add("snap", Snapshot())
    trainer.callbacks.bind(config, trainer)
    with pytest.raises(FastGenRuntimeError, match="3 consecutive"):
        trainer.run()
    clip = trainer.callbacks["grad_clip"]
    assert clip.nonfinite_total == 3
    assert trainer.iteration == 4
    after = snapshot(seen["model"])
    assert set(after["modules"]) == {"net", "ema"}
    assert before["adam_steps"] and all(step == 2.0 for step in before["adam_steps"])
    assert before["last_epoch"] == {"net": 2}
    assert after["adam_steps"] == before["adam_steps"]
    assert after["last_epoch"] == before["last_epoch"]
    assert after["lr"] == before["lr"]
    for (m_after, v_after), (m_before, v_before) in zip(after["adam_moments"], before["adam_moments"], strict=True):
        assert torch.equal(m_after, m_before) and torch.equal(v_after, v_before)
    for name, state in before["modules"].items():
        for key, value in state.items():
            assert torch.isfinite(value).all(), f"{name}.{key} is not finite before the poisoned steps"
            assert torch.equal(after["modules"][name][key], value), f"{name}.{key} changed during a skipped step"


class BadInputBeforeTraining(Callback):
    """Raises a ``UsageError`` before the first iteration (a stand-in for a config value the data rejects)."""

    def on_dataloader_init_start(self, *args: object, **kwargs: object) -> None:
        raise UsageError("model.some_option must be >= 1")


class BadInputAfterAStep(Callback):
    def on_training_step_end(self, *args: object, **kwargs: object) -> None:
        raise UsageError("model.some_option must be >= 1")


def _failing_config(name: str, callback: type[Callback], max_iter: int = 2):
    config = tiny_toy_config(name, max_iter=max_iter)
    config.trainer.callbacks["fail"] = LazyCall(callback)()
    return config


def test_bad_input_before_the_first_iteration_leaves_no_run_directory(output_root: Path) -> None:
    trainer = Trainer(_failing_config("badinput", BadInputBeforeTraining))
    with pytest.raises(UsageError, match="some_option"):
        trainer.run()
    assert not trainer.run_dir.exists()
    assert list(output_root.iterdir()) == []  # nor the project and group folders made for it


def test_bad_input_keeps_the_folders_above_the_run_that_were_there_before(output_root: Path) -> None:
    trainer = Trainer(_failing_config("badinput", BadInputBeforeTraining))
    trainer.run_dir.parent.mkdir(parents=True)
    (trainer.run_dir.parent / "other_run").mkdir()
    with pytest.raises(UsageError):
        trainer.run()
    assert not trainer.run_dir.exists() and (trainer.run_dir.parent / "other_run").is_dir()


def test_bad_input_keeps_a_run_directory_it_did_not_create_or_that_trained() -> None:
    first = Trainer(tiny_toy_config("badinput_resumed", max_iter=2))
    first.run()
    resumed = Trainer(_failing_config("badinput_resumed", BadInputBeforeTraining, max_iter=4))
    with pytest.raises(UsageError):
        resumed.run()
    assert (first.run_dir / "config.yaml").is_file() and first.checkpointer.latest() is not None

    trained = Trainer(_failing_config("badinput_late", BadInputAfterAStep))
    with pytest.raises(UsageError):
        trained.run()
    assert trained.iteration == 1 and (trained.run_dir / "config.yaml").is_file()


class SlowWrites(Callback):
    """Holds up the background writer of the save at ``iteration`` until training has taken ``steps`` more steps,
    so an asynchronous save's tensors are written after training changed the live ones."""

    def __init__(self, iteration: int = 3, steps: int = 2) -> None:
        self.iteration, self.steps = iteration, steps
        import threading

        self.release = threading.Event()

    def on_save_checkpoint_start(self, model, iteration: int = 0) -> None:  # noqa: ANN001
        if iteration == self.iteration:
            import fastgen.checkpoint.stores as store

            original, release = store.torch_save_to, self.release

            def held(payload):  # noqa: ANN001, ANN202
                write = original(payload)
                return lambda handle: (release.wait(30), write(handle))

            store.torch_save_to = held  # for this save only: restored below
            self._restore = (store, original)

    def on_save_checkpoint_end(self, model, iteration: int = 0) -> None:  # noqa: ANN001
        if iteration == self.iteration:
            store, original = self._restore
            store.torch_save_to = original

    def on_training_step_end(self, model, data_batch, output_batch, loss_dict, iteration: int = 0) -> None:  # noqa: ANN001
        if iteration == self.iteration + self.steps:
            self.release.set()


def test_an_async_monolithic_save_writes_the_state_of_its_iteration(fastgen_records) -> None:
    """The background writer gets its own host copy of every tensor (one, ``full_state_dict(copy=True)``): its
    file equals a synchronous save of the same iteration even when training moved on before it was written. The
    log says "saving" when it starts and "saved" once it is on disk."""
    sync = Trainer(tiny_toy_config("sync_save", max_iter=6))
    sync.run()
    config = tiny_toy_config("async_save", max_iter=6)
    config.trainer.checkpointer.async_save = True
    held = Trainer(config, extra_callbacks={"slow_writes": SlowWrites(iteration=3, steps=2)})
    held.run()
    messages = [r.getMessage() for r in fastgen_records.records]
    for iteration in (3, 6):
        path = str(held.checkpointer.path_for(iteration))
        assert f"saving checkpoint {path}" in messages and f"saved checkpoint {path}" in messages, messages
    from fastgen_testing import assert_same_tree, state_tensors

    assert_same_tree(state_tensors(load_checkpoint(held.checkpointer.path_for(3))),
                     state_tensors(load_checkpoint(sync.checkpointer.path_for(3))))
