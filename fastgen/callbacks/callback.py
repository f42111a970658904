"""The ``Callback`` base class and the dispatcher that runs callbacks in dictionary order.

A callback overrides any of the lifecycle hooks below. Before ``on_app_begin`` the dispatcher sets
``self.config`` (the run's ``BaseConfig``) and ``self.trainer`` (the ``Trainer``). ``state_dict()`` /
``load_state_dict()`` are saved in every checkpoint under the callback's name in ``trainer.callbacks``; a name
can be used only once.

Hooks, in the order the trainer calls them (see ``fastgen.trainer`` for the full sequence)::

    on_app_begin()
    on_model_init_start()                      on_model_init_end(model)
    on_optimizer_init_start(model)             on_optimizer_init_end(model)
    on_load_checkpoint_start(model)            on_load_checkpoint_end(model, iteration, checkpoint_path)
    on_dataloader_init_start(model)            on_dataloader_init_end(model, dataloader_train, dataloader_val)
    on_train_begin(model, iteration)
      on_training_step_begin(model, iteration)
        on_training_accum_step_begin(model, data_batch, iteration, accum_iter)
        on_backward_begin(model, data_batch, output_batch, loss_dict, iteration, accum_iter)
        on_training_accum_step_end(model, data_batch, output_batch, loss_dict, iteration, accum_iter)
      on_optimizer_step_begin(model, iteration)
      on_training_step_end(model, data_batch, output_batch, loss_dict, iteration)   # iteration = steps done
      on_validation_begin(model, iteration)
        on_validation_step_begin(model, data_batch, iteration)
        on_validation_step_end(model, data_batch, output_batch, loss_dict, iteration)
      on_validation_end(model, loss_dict, iteration)
      on_save_checkpoint_start(model, iteration)
      on_save_checkpoint_success(model, iteration, checkpoint_path)
      on_save_checkpoint_end(model, iteration)
    on_train_end(model, iteration)
    on_app_end()

Only hooks a callback actually overrides are called, so an unused hook costs nothing in the training loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastgen.configs.config import BaseConfig
    from fastgen.trainer import Trainer

HOOKS: tuple[str, ...] = (
    "on_app_begin",
    "on_model_init_start",
    "on_model_init_end",
    "on_optimizer_init_start",
    "on_optimizer_init_end",
    "on_load_checkpoint_start",
    "on_load_checkpoint_end",
    "on_dataloader_init_start",
    "on_dataloader_init_end",
    "on_train_begin",
    "on_training_step_begin",
    "on_training_accum_step_begin",
    "on_backward_begin",
    "on_training_accum_step_end",
    "on_optimizer_step_begin",
    "on_training_step_end",
    "on_validation_begin",
    "on_validation_step_begin",
    "on_validation_step_end",
    "on_validation_end",
    "on_save_checkpoint_start",
    "on_save_checkpoint_success",
    "on_save_checkpoint_end",
    "on_train_end",
    "on_app_end",
)


class Callback:
    """Base class: every hook is a no-op; override the ones you need."""

    config: BaseConfig
    trainer: Trainer

    # -- setup
    def on_app_begin(self) -> None: ...
    def on_model_init_start(self) -> None: ...
    def on_model_init_end(self, model: Any) -> None: ...
    def on_optimizer_init_start(self, model: Any) -> None: ...
    def on_optimizer_init_end(self, model: Any) -> None: ...
    def on_load_checkpoint_start(self, model: Any) -> None: ...
    def on_load_checkpoint_end(self, model: Any, iteration: int = 0, checkpoint_path: str | None = None) -> None: ...
    def on_dataloader_init_start(self, model: Any) -> None: ...
    def on_dataloader_init_end(self, model: Any, dataloader_train: Any = None, dataloader_val: Any = None) -> None: ...

    # -- training
    def on_train_begin(self, model: Any, iteration: int = 0) -> None: ...
    def on_training_step_begin(self, model: Any, iteration: int = 0) -> None: ...
    def on_training_accum_step_begin(self, model: Any, data_batch: dict, iteration: int = 0, accum_iter: int = 0) -> None: ...
    def on_backward_begin(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0, accum_iter: int = 0) -> None: ...
    def on_training_accum_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0, accum_iter: int = 0) -> None: ...
    def on_optimizer_step_begin(self, model: Any, iteration: int = 0) -> None: ...
    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0) -> None: ...
    def on_train_end(self, model: Any, iteration: int = 0) -> None: ...

    # -- validation
    def on_validation_begin(self, model: Any, iteration: int = 0) -> None: ...
    def on_validation_step_begin(self, model: Any, data_batch: dict, iteration: int = 0) -> None: ...
    def on_validation_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0) -> None: ...
    def on_validation_end(self, model: Any, loss_dict: dict | None = None, iteration: int = 0) -> None: ...

    # -- checkpointing
    def on_save_checkpoint_start(self, model: Any, iteration: int = 0) -> None: ...
    def on_save_checkpoint_success(self, model: Any, iteration: int = 0, checkpoint_path: str | None = None) -> None: ...
    def on_save_checkpoint_end(self, model: Any, iteration: int = 0) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """State saved in checkpoints under this callback's name (tensors and plain Python values)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    # -- cleanup
    def on_app_end(self) -> None: ...


def _overrides(callback: Callback, hook: str) -> bool:
    return getattr(type(callback), hook) is not getattr(Callback, hook)


class CallbackDict(Mapping[str, Callback]):
    """Ordered callbacks by name; ``callbacks.on_<hook>(...)`` calls the hook on each, in order."""

    def __init__(self, callbacks: Mapping[str, Callback] | None = None) -> None:
        self._callbacks: dict[str, Callback] = {}
        for name, callback in (callbacks or {}).items():
            self.add(name, callback)

    def add(self, name: str, callback: Callback) -> None:
        if name in self._callbacks:
            raise ValueError(f"a callback named {name!r} exists already; callback names must be unique")
        if not isinstance(callback, Callback):
            raise TypeError(f"callback {name!r} is a {type(callback).__name__}, not a fastgen Callback")
        self._callbacks[name] = callback
        self.refresh()

    def move_to_front(self, name: str) -> None:
        """Call ``name``'s hooks before every other callback's (one that others depend on, e.g. loss scaling)."""
        self._callbacks = {name: self._callbacks[name], **{n: c for n, c in self._callbacks.items() if n != name}}
        self.refresh()

    def refresh(self, hook: str | None = None) -> None:
        """Drop the cached caller of ``hook`` (default: every hook), so the next call rebuilds it from the
        callbacks' current methods - after a callback is added, or a callback's hook method is replaced."""
        for name in HOOKS if hook is None else (hook,):
            self.__dict__.pop(name, None)

    def bind(self, config: BaseConfig, trainer: Trainer) -> None:
        for callback in self._callbacks.values():
            callback.config = config
            callback.trainer = trainer

    def __getitem__(self, name: str) -> Callback:
        return self._callbacks[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._callbacks)

    def __len__(self) -> int:
        return len(self._callbacks)

    def __getattr__(self, hook: str) -> Any:
        # Called once per hook name: the caller is then cached in the instance dict, so the training loop
        # pays one dict lookup and a loop over only the callbacks that override the hook.
        if hook not in HOOKS:
            raise AttributeError(hook)
        bound = [getattr(cb, hook) for cb in self._callbacks.values() if _overrides(cb, hook)]

        def call(*args: Any, **kwargs: Any) -> None:
            for method in bound:
                method(*args, **kwargs)

        self.__dict__[hook] = call
        return call

    def state_dict(self) -> dict[str, Any]:
        return {name: state for name, cb in self._callbacks.items() if (state := cb.state_dict())}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, callback in self._callbacks.items():
            if name in state:
                callback.load_state_dict(state[name])
