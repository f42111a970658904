"""TrainProfilerCallback: where the time of a training step goes.

The profiler keeps one stopwatch that always runs during training and, at each hook it implements, charges the
time since the previous hook to the phase that just ended:

* ``data`` - ``on_training_step_begin`` -> first ``on_training_accum_step_begin``, plus the time between
  accumulation rounds (loading and moving the next batch);
* ``forward`` - ``on_training_accum_step_begin`` -> ``on_backward_begin`` (summed over rounds);
* ``backward`` - ``on_backward_begin`` -> ``on_training_accum_step_end`` (summed over rounds);
* ``optimizer`` - last ``on_training_accum_step_end`` -> ``on_training_step_end``: optimizer and scheduler steps,
  ``zero_grad``;
* ``other`` - ``on_training_step_end`` -> next ``on_training_step_begin``: validation, checkpoints, logging;
* ``callbacks/<name>`` - the time each *other* callback spent in its hooks, taken out of whichever phase it fell
  in, so the parts add up: ``data + forward + backward + optimizer + other + sum(callbacks) = step``.

A step is one period of the loop, measured from this callback's ``on_training_step_end`` to the next one (the
first from its first ``on_training_step_begin``): every iteration's cost counted once, including work done
after the step proper (a checkpoint, callbacks later in the list). The callbacks before this one in
``trainer.callbacks`` run, at each hook, before the phase boundary and those after it run after; either way
their time is theirs, not the phase's.

Callback times are measured by wrapping the hooks of every other callback: at ``on_app_begin`` each hook a
callback overrides is replaced on that callback's *instance* by a timing wrapper (same arguments, same
return value, same exceptions). The dispatcher (``CallbackDict``) caches the bound methods of a hook the first
time that hook is called, so the wrappers must be in place before then. ``on_app_begin`` is the one hook
already cached (it is being dispatched while the wrapping happens), so it is never wrapped - it runs before
training and would not be counted anyway. Cached callers of any other hook are dropped so that they are
rebuilt with the wrappers, and the wrappers are removed again at ``on_app_end``.

Asynchronous devices make host clocks lie: a CUDA kernel launched in ``forward`` runs while the host is already
in ``backward``. With ``sync_device`` (the default) the profiler calls ``torch.cuda.synchronize()`` at every
phase boundary and around every wrapped hook when training on CUDA; this costs some throughput (the
CPU can no longer run ahead of the GPU), so turn it off to measure ``time/steps_per_s`` undisturbed. On CPU
there is nothing to synchronise.

Every ``every_n`` steps (default: ``trainer.logging_iter``, and at the last step) the averages per step over the
steps since the previous report are logged with ``trainer.log_scalar`` - place this callback before ``wandb``
to see them in the same logging window: ``time/data_ms``, ``time/forward_ms``, ``time/backward_ms``,
``time/optimizer_ms``, ``time/other_ms``, ``time/step_ms``, ``time/callbacks_ms`` (all callbacks),
``time/callbacks/<name>_ms`` (for each callback timed in the window) and ``time/steps_per_s`` (steps in the
window / their total time). The same values are kept in ``last_report``. Nothing is kept in checkpoints: a
resumed run starts a new window.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

# _overrides is the dispatcher's own test of which hooks it calls: wrapping exactly those keeps the two in step.
from fastgen.callbacks.callback import HOOKS, Callback, _overrides
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

PHASES: tuple[str, ...] = ("data", "forward", "backward", "optimizer", "other")

# Marks our wrappers, so a second run of the same trainer (or a second profiler) never wraps a wrapper of ours.
_WRAPPED_BY = "__fastgen_profiler__"


class TrainProfilerCallback(Callback):
    def __init__(self, every_n: int | None = None, sync_device: bool = True) -> None:
        if every_n is not None and int(every_n) < 1:
            raise ValueError(f"TrainProfilerCallback(every_n={every_n}): use a positive number of steps, or None")
        self.every_n = None if every_n is None else int(every_n)
        self.sync_device = bool(sync_device)
        self.last_report: dict[str, float] = {}
        # (callback name, hook) -> calls seen by the wrappers, during training or not; for tests and debugging.
        self.hook_calls: dict[tuple[str, str], int] = {}
        self._wrapped: list[tuple[Callback, str]] = []
        self._sync = False
        self._running = False
        self._phase = "data"
        self._t = 0.0
        self._in_phase_callbacks = 0.0  # callback time inside the interval since self._t
        self._step_start = 0.0
        self._step_phases = dict.fromkeys(PHASES, 0.0)
        self._step_callbacks: dict[str, float] = {}
        self._reset_window()

    # ---- the clock -----------------------------------------------------------------------------------------
    def _now(self) -> float:
        if self._sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _switch(self, next_phase: str, charge: str | None = None) -> float:
        """Charge the time since the last boundary (less the callbacks' share) to ``charge`` (default: the
        current phase), then start ``next_phase``. Returns the boundary's timestamp."""
        now = self._now()
        target = charge or self._phase
        if target not in self._step_phases:  # "between" closed by an unexpected hook: not lost, just unnamed
            target = "other"
        self._step_phases[target] += (now - self._t) - self._in_phase_callbacks
        self._in_phase_callbacks = 0.0
        self._t = now
        self._phase = next_phase
        return now

    def _reset_step(self, start: float) -> None:
        self._step_start = start
        self._step_phases = dict.fromkeys(PHASES, 0.0)
        self._step_callbacks = {}

    def _reset_window(self) -> None:
        self._window_steps = 0
        self._window_time = 0.0
        self._window_phases = dict.fromkeys(PHASES, 0.0)
        self._window_callbacks: dict[str, float] = {}

    # ---- wrapping other callbacks --------------------------------------------------------------------------
    def _timed(self, name: str, hook: str, method: Any) -> Any:
        key = (name, hook)

        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.hook_calls[key] = self.hook_calls.get(key, 0) + 1
            if not self._running:
                return method(*args, **kwargs)
            start = self._now()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = self._now() - start
                self._in_phase_callbacks += elapsed
                self._step_callbacks[name] = self._step_callbacks.get(name, 0.0) + elapsed

        setattr(wrapper, _WRAPPED_BY, self)
        return wrapper

    def _wrap_callbacks(self) -> None:
        dispatcher = self.trainer.callbacks
        for name, callback in dispatcher.items():
            if callback is self:
                continue
            for hook in HOOKS:
                if hook == "on_app_begin" or not _overrides(callback, hook):
                    continue  # on_app_begin is being dispatched already: see the module docstring
                method = getattr(callback, hook)
                if getattr(method, _WRAPPED_BY, None) is self:
                    continue
                setattr(callback, hook, self._timed(name, hook, method))
                self._wrapped.append((callback, hook))
                dispatcher.refresh(hook)  # a caller cached before now still holds the unwrapped method

    def _unwrap_callbacks(self) -> None:
        for callback, hook in self._wrapped:
            if getattr(vars(callback).get(hook), _WRAPPED_BY, None) is self:
                delattr(callback, hook)  # the class's method shows through again
                self.trainer.callbacks.refresh(hook)
        self._wrapped = []

    # ---- hooks ---------------------------------------------------------------------------------------------
    def on_app_begin(self) -> None:
        self._wrap_callbacks()

    def on_train_begin(self, model: Any, iteration: int = 0) -> None:
        if self.every_n is None:
            self.every_n = int(self.config.trainer.logging_iter)
        device = torch.device(self.trainer.device)
        self._sync = self.sync_device and device.type == "cuda" and torch.cuda.is_available()
        self._running = False
        self._reset_window()

    def on_training_step_begin(self, model: Any, iteration: int = 0) -> None:
        if not self._running:  # the first step of this run: the clock starts here
            self._running = True
            self._in_phase_callbacks = 0.0
            self._t = self._now()
            self._reset_step(self._t)
            self._phase = "data"
            return
        self._switch("data")  # closes "other"

    def on_training_accum_step_begin(self, model: Any, data_batch: dict, iteration: int = 0, accum_iter: int = 0) -> None:
        self._switch("forward", charge="data")  # the gap after the previous round was the next batch's loading

    def on_backward_begin(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0,
                          accum_iter: int = 0) -> None:
        self._switch("backward")

    def on_training_accum_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                                   iteration: int = 0, accum_iter: int = 0) -> None:
        # Until the next round starts (data) or the optimizer step ends (optimizer): charged at that boundary.
        self._switch("between")

    def on_optimizer_step_begin(self, model: Any, iteration: int = 0) -> None:
        self._switch("optimizer", charge="optimizer")

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                             iteration: int = 0) -> None:
        if not self._running:
            return
        now = self._switch("other")
        self._close_step(now)
        every = self.every_n or int(self.config.trainer.logging_iter)
        if iteration % every == 0 or iteration == self.config.trainer.max_iter:
            self._report()

    def on_train_end(self, model: Any, iteration: int = 0) -> None:
        self._running = False  # the unfinished period after the last step is never reported

    def on_app_end(self) -> None:
        self._running = False
        self._unwrap_callbacks()

    # ---- aggregation ---------------------------------------------------------------------------------------
    def _close_step(self, now: float) -> None:
        """End the current step at ``now`` (and start the next one there)."""
        self._window_steps += 1
        self._window_time += now - self._step_start
        for phase, seconds in self._step_phases.items():
            self._window_phases[phase] += seconds
        for name, seconds in self._step_callbacks.items():
            self._window_callbacks[name] = self._window_callbacks.get(name, 0.0) + seconds
        self._reset_step(now)

    def _report(self) -> None:
        n = self._window_steps
        if n == 0:
            return
        ms = 1000.0 / n
        report = {f"time/{phase}_ms": seconds * ms for phase, seconds in self._window_phases.items()}
        report["time/step_ms"] = self._window_time * ms
        report["time/callbacks_ms"] = sum(self._window_callbacks.values()) * ms
        for name, seconds in self._window_callbacks.items():
            report[f"time/callbacks/{name}_ms"] = seconds * ms
        report["time/steps_per_s"] = n / max(self._window_time, 1e-12)
        self.last_report = report
        for key, value in report.items():
            self.trainer.log_scalar(key, value)
        self._reset_window()
