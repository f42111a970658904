"""TrainProfilerCallback: keys, additivity, attribution of callback time, and that wrapping changes nothing.

No assertion depends on how fast this machine is: only on relations between the measured times (the parts add
up to the step; a callback that sleeps is the slowest callback) and on call counts.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
import torch

from fastgen.callbacks.callback import HOOKS, Callback
from fastgen.callbacks.train_profiler import TrainProfilerCallback
from fastgen.trainer import Trainer
from fastgen_testing import HookRecorder, tiny_toy_config

PARTS = ("data", "forward", "backward", "optimizer", "other")


class Slow(Callback):
    """Sleeps after every step: the one callback whose time must dominate."""

    def __init__(self) -> None:
        self.calls = 0

    def on_training_step_end(self, model, data_batch, output_batch, loss_dict, iteration=0):
        self.calls += 1
        time.sleep(0.02)


def _spy_scalars(trainer: Trainer) -> list[tuple[str, Any]]:
    logged: list[tuple[str, Any]] = []
    original = trainer.log_scalar

    def log_scalar(key: str, value: Any) -> None:
        logged.append((key, value))
        original(key, value)

    trainer.log_scalar = log_scalar  # type: ignore[method-assign]
    return logged


@pytest.mark.parametrize("slow_first", [False, True], ids=["slow_after_profiler", "slow_before_profiler"])
def test_keys_parts_add_up_and_slow_callback_is_attributed(slow_first: bool) -> None:
    profiler = TrainProfilerCallback(every_n=3)
    extra = {"slow": Slow(), "profiler": profiler} if slow_first else {"profiler": profiler, "slow": Slow()}
    trainer = Trainer(tiny_toy_config(f"prof_{slow_first}", max_iter=6, batch_size_global=32), extra_callbacks=extra)
    logged = _spy_scalars(trainer)
    trainer.run()

    assert trainer.accum_rounds == 2
    reports = [value for key, value in logged if key == "time/step_ms"]
    assert len(reports) == 2  # steps 3 and 6

    report = profiler.last_report
    for key in ("time/data_ms", "time/forward_ms", "time/backward_ms", "time/optimizer_ms", "time/step_ms",
                "time/steps_per_s", "time/callbacks_ms", "time/callbacks/slow_ms", "time/callbacks/ema_ms",
                "time/callbacks/grad_clip_ms"):
        assert report[key] > 0, key
    assert report["time/other_ms"] >= 0
    # Everything logged through the trainer, with the values of the last report.
    assert {k: v for k, v in logged[-len(report):]} == report

    parts = sum(report[f"time/{p}_ms"] for p in PARTS) + report["time/callbacks_ms"]
    assert parts == pytest.approx(report["time/step_ms"], rel=1e-6)
    callbacks = {k: v for k, v in report.items() if k.startswith("time/callbacks/")}
    assert report["time/callbacks_ms"] == pytest.approx(sum(callbacks.values()), rel=1e-9)
    assert max(callbacks, key=callbacks.get) == "time/callbacks/slow_ms"
    assert report["time/steps_per_s"] == pytest.approx(1000.0 / report["time/step_ms"], rel=1e-6)
    assert "time/callbacks/profiler_ms" not in report  # it does not time itself


def test_default_window_is_the_logging_interval() -> None:
    trainer = Trainer(tiny_toy_config("prof_window", max_iter=5), extra_callbacks={"profiler": TrainProfilerCallback()})
    logged = _spy_scalars(trainer)
    trainer.run()
    # logging_iter=2 in the tiny config: reports at 2, 4 and the last step, 5.
    assert sum(key == "time/step_ms" for key, _ in logged) == 3
    assert trainer.callbacks["profiler"].every_n == 2


def test_cached_dispatch_calls_the_wrappers_for_every_hook_but_on_app_begin() -> None:
    profiler = TrainProfilerCallback()
    trainer = Trainer(tiny_toy_config("prof_hooks", max_iter=4, validation_iter=2, max_val_iter=1),
                      extra_callbacks={"profiler": profiler, "recorder": HookRecorder()})
    # A caller cached before on_app_begin (attribute access alone caches it) must be rebuilt with the wrapper.
    trainer.callbacks.on_train_end  # noqa: B018
    trainer.run()
    recorder = trainer.callbacks["recorder"]
    seen = Counter(hook for hook, _ in recorder.calls)
    assert set(seen) == set(HOOKS)
    for hook in HOOKS:
        wrapped_calls = profiler.hook_calls.get(("recorder", hook), 0)
        assert wrapped_calls == (0 if hook == "on_app_begin" else seen[hook]), hook
    # The training-loop callbacks from the config were wrapped as well.
    assert profiler.hook_calls[("ema", "on_training_step_end")] == 4
    assert profiler.hook_calls[("grad_clip", "on_optimizer_step_begin")] == 4
    # Wrappers are gone after the run: the class methods show through again.
    for name in ("recorder", "ema", "grad_clip"):
        assert not any(hook in vars(trainer.callbacks[name]) for hook in HOOKS), name


def test_wrapping_changes_no_behaviour() -> None:
    """Same hook sequence and bit-identical weights with and without the profiler."""
    def train(label: str, profiled: bool) -> tuple[list, dict[str, torch.Tensor]]:
        extra: dict[str, Callback] = {"profiler": TrainProfilerCallback(every_n=2)} if profiled else {}
        extra["recorder"] = HookRecorder()
        trainer = Trainer(tiny_toy_config(label, max_iter=4, validation_iter=2, max_val_iter=1,
                                          batch_size_global=32), extra_callbacks=extra)
        model = trainer.run()
        return trainer.callbacks["recorder"].calls, {k: v.clone() for k, v in model.model_dict["net"].state_dict().items()}

    calls_plain, weights_plain = train("prof_plain", profiled=False)
    calls_prof, weights_prof = train("prof_profiled", profiled=True)
    assert calls_prof == calls_plain
    assert weights_prof.keys() == weights_plain.keys()
    for key in weights_plain:
        assert torch.equal(weights_prof[key], weights_plain[key]), key


def test_wrapper_keeps_return_values_and_exceptions() -> None:
    class Boom(Callback):
        def on_training_step_end(self, model, data_batch, output_batch, loss_dict, iteration=0):
            if iteration == 2:
                raise KeyError("boom at 2")

        def on_validation_end(self, model, loss_dict=None, iteration=0):
            return ("kept", iteration)

    boom = Boom()
    profiler = TrainProfilerCallback()
    trainer = Trainer(tiny_toy_config("prof_boom", max_iter=4), extra_callbacks={"profiler": profiler, "boom": boom})
    with pytest.raises(KeyError, match="boom at 2"):
        trainer.run()
    assert profiler.hook_calls[("boom", "on_training_step_end")] == 2
    assert "on_training_step_end" not in vars(boom)  # unwrapped by on_app_end, even after the error

    # Directly: the wrapper returns what the hook returns, and carries its name and docstring.
    profiler.trainer = trainer
    profiler._wrap_callbacks()
    wrapped = boom.on_validation_end
    assert wrapped is not Boom.on_validation_end.__get__(boom)
    assert wrapped.__name__ == "on_validation_end"
    assert wrapped(None, iteration=7) == ("kept", 7)
    profiler._unwrap_callbacks()
    assert "on_validation_end" not in vars(boom)


def test_no_state_in_checkpoints() -> None:
    profiler = TrainProfilerCallback()
    assert profiler.state_dict() == {}
    with pytest.raises(ValueError, match="every_n"):
        TrainProfilerCallback(every_n=0)
