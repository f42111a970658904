"""Peak memory of one rank during training steps, traced with fake tensors: the dry run's estimate of the peak.

The state plan (``fastgen.profiling.plan``) counts what a rank *keeps*: parameters, gradients, optimizer state.
A rank's peak also holds what a step makes and drops - activations saved for backward, temporaries, gradients
while they are produced, FSDP2's all-gathered parameters, DDP's gradient buckets - and that depends on the
network's forward, the method's losses and the batch, not on a formula. So it is measured by *running* the step
without running it:

1. the method is built on the meta device and parallelised as the trainer would (FSDP2: ``plan.sharded_meta_model``
   on a fake process group, rank 0, which holds the largest shards);
2. its tensors become FakeTensors (``torch._subclasses.fake_tensor.FakeTensorMode``: shapes, dtypes and storage
   sizes, no data, no compute) and the optimizers are built over them;
3. ``single_train_step``, ``backward``, the stepping optimizers' ``step`` and ``zero_grad`` run on a batch with the
   real loader's shapes, as the trainer's loop does, for a few iterations: twice as many as it takes every
   optimizer to step once (alternating methods such as DMD2 step different optimizers in different iterations),
   and at least 3, so that every step runs while all optimizer states exist;
4. a ``TorchDispatchMode`` sees every tensor an operator returns and adds its storage's bytes to a running count
   while the storage lives (a weak reference drops them when it is freed). The estimate is that count's peak,
   starting from the parameters and buffers that exist before the first step.

What the trace cannot see: the allocator's caching and fragmentation, kernels' internal workspaces (oneDNN's,
cuDNN's), the data loader's buffers, Python objects, and callbacks (EMA updates are in place; gradient clipping
makes small temporaries). DDP's reducer keeps one flat copy of the replicated gradients in its buckets; it is
not an operator's output, so it is added as the trained parameters' gradient bytes. Measured against the real
CPU allocator (``benchmarks/distributed_memory.py``) the estimate is within a few percent on the digits recipes.

A method whose step cannot run on fake tensors (an operator whose output shape depends on data, a ``.item()`` in
control flow) gets no estimate: ``trace_step_peak`` raises ``StepTraceError`` with the reason, which the dry run
prints instead of a number.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from fastgen.utils.errors import one_line

MAX_ITERATIONS = 16  # two cycles of every alternating schedule the recipes use (DMD2: a student step every 5)


class StepTraceError(RuntimeError):
    """The training step could not be traced with fake tensors (the reason is the message)."""


@dataclass(frozen=True)
class StepPeak:
    """Bytes on the traced rank: ``peak`` during the steps (incl. ``buckets``), ``state`` before the first."""

    peak: int
    state: int
    buckets: int
    iterations: int


def _storages(tensor: torch.Tensor) -> Iterator[Any]:
    """The storages behind ``tensor``: its own, or its inner tensors' for a wrapper subclass (a DTensor's local
    shard)."""
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        for name in names:
            inner = getattr(tensor, name)
            if isinstance(inner, torch.Tensor):
                yield from _storages(inner)
    else:
        yield tensor.untyped_storage()


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages that operators return while they are alive, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, Any] = {}
        self.current = 0
        self.peak = 0

    def track(self, tensor: torch.Tensor) -> None:
        for storage in _storages(tensor):
            key = storage._cdata  # one StorageImpl, however many tensors view it
            if key in self._live:
                continue
            size = int(storage.nbytes())
            self._live[key] = weakref.ref(storage, lambda _ref, key=key, size=size: self._free(key, size))
            self.current += size
            self.peak = max(self.peak, self.current)

    def _free(self, key: int, size: int) -> None:
        if self._live.pop(key, None) is not None:
            self.current -= size

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.track(leaf)
        return out


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """fastgen's warnings during the trace are about the fake run (e.g. a method falling back from forward-mode AD),
    not about the user's: hold them back."""
    import logging

    logger = logging.getLogger("fastgen")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def first_batch(config: Any) -> dict[str, Any]:
    """One batch of the training loader (no worker processes), for its shapes and dtypes. Raises what the loader
    raises when its data is not there (a ``UsageError`` naming the path)."""
    from fastgen.configs.instantiate import instantiate

    loader_config = copy.deepcopy(config.dataloader_train)
    if "num_workers" in loader_config:
        loader_config.num_workers = 0
    return next(iter(instantiate(loader_config)))


@contextlib.contextmanager
def _method_on_meta(config: Any, world_size: int) -> Iterator[Any]:
    from fastgen.distributed.parallelize import distributed_mode
    from fastgen.profiling.estimate import build_meta_model
    from fastgen.profiling.plan import sharded_meta_model

    if distributed_mode(config.trainer) == "fsdp" and world_size > 1:
        with sharded_meta_model(config, world_size) as (model, _mesh):
            yield model
    else:
        from fastgen.distributed.parallelize import apply_activation_checkpointing

        model = build_meta_model(config)
        apply_activation_checkpointing(model)
        yield model


def _bucket_bytes(model: Any) -> int:
    """DDP's gradient buckets: one flat copy of the gradients of the trained (replicated) parameters."""
    seen: set[int] = set()
    total = 0
    for optimizer in model.optimizer_dict.values():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    total += int(p.numel()) * int(p.element_size())
    return total


def trace_step_peak(config: Any, world_size: int, batch: dict[str, Any]) -> StepPeak:
    """The peak bytes of rank 0 of a ``world_size``-rank job of ``config`` during its first training steps, traced
    on fake tensors with ``batch``'s shapes (module docstring). Raises ``StepTraceError``."""
    from fastgen.distributed.parallelize import distributed_mode

    ddp = distributed_mode(config.trainer) == "ddp" and world_size > 1
    with _no_cached_tensors():
        return _trace(config, world_size, batch, ddp)


@contextlib.contextmanager
def _no_cached_tensors() -> Iterator[None]:
    """Module-level tensor caches start empty and end empty around a trace: a real tensor cached before would not
    be counted (and the estimate would depend on what ran before), a fake one cached during it would poison real
    training later in the same process."""
    from fastgen.distributed import keyed_rng

    keyed_rng._element_hashes.cache_clear()
    try:
        yield
    finally:
        keyed_rng._element_hashes.cache_clear()


def _trace(config: Any, world_size: int, batch: dict[str, Any], ddp: bool) -> StepPeak:
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with _method_on_meta(config, world_size) as model, FakeTensorMode(allow_non_fake_inputs=True) as fake:
            model.to_empty(device="cpu")
            model.init_optimizers()
            fake_batch = {k: fake.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            counter = LiveBytes()
            for tensor in [*model.parameters(), *model.buffers()]:
                counter.track(tensor)
            state = counter.current
            stepped: set[str] = set()
            covered = None  # iterations until every optimizer has stepped once
            iteration = 0
            with counter, _quiet_logs():
                while iteration < MAX_ITERATIONS and (covered is None or iteration < max(2 * covered, 3)):
                    names = list(model.get_optimizers(iteration))
                    with model.bind_batch(fake_batch, iteration, seed=int(config.trainer.seed)):
                        loss_dict, _outputs = model.single_train_step(fake_batch, iteration)
                    loss_dict["total_loss"].backward()
                    del loss_dict, _outputs
                    for name in names:
                        model.optimizer_dict[name].step()
                    for optimizer in model.optimizer_dict.values():
                        optimizer.zero_grad(set_to_none=True)
                    stepped.update(names)
                    iteration += 1
                    if covered is None and stepped == set(model.optimizer_dict):
                        covered = iteration
            buckets = _bucket_bytes(model) if ddp else 0
            return StepPeak(peak=counter.peak + buckets, state=state, buckets=buckets, iterations=iteration)
    except Exception as exc:  # noqa: BLE001 - any operator may refuse fake tensors: no estimate, with the reason
        raise StepTraceError(one_line(exc)[:300]) from exc
