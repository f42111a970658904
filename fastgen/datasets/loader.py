"""A resumable, rank-aware, infinite data loader.

Each epoch is a permutation drawn from ``seed + epoch`` (so every rank agrees on it without communication);
rank ``r`` of ``W`` takes positions ``r, r + W, ...``. The loader's state is ``(epoch, position)``: saving it in
a checkpoint and loading it back continues with exactly the batch an uninterrupted run would have seen, which
the bit-identical resume guarantee depends on. Datasets that implement ``get_batch(indices)`` are gathered in
one vectorised index; others are collated item by item.

**Sample ids.** Every batch (a dict) carries ``sample_ids`` (int64, ``(B,)``): each sample's global stream
position, ``epoch * len(dataset) + p`` where ``p`` is its position in the epoch's order. Rank ``r`` of ``W`` takes
positions ``r, r + W, ...``, so the same sample gets the same id whatever ``W`` is - a 1-rank batch of ``2B``
covers exactly the positions two ranks' batches of ``B`` cover - and the method keys its training noise by these
ids (``fastgen.distributed.keyed_rng``), which makes a run's result independent of the world size. A loader's position
is stored as a global position too, so a checkpoint resumes at another world size (with the same global batch)
on exactly the samples an uninterrupted run would have seen next.

**Worker processes.** With ``num_workers > 0`` batches are read by a ``torch.utils.data.DataLoader`` whose batch
sampler replays this loader's own index order from its current ``(epoch, position)``; workers may read ahead
(``prefetch_factor`` batches each), but the loader's state advances only when a batch is handed out, and the
DataLoader returns batches in sampler order. So a checkpoint's state names the next batch the training loop has
not seen, whatever was prefetched, and a restart - which starts a fresh sampler at that state - reads exactly
it. ``pin_memory`` pins batches for faster host-to-GPU copies (only when CUDA is available); ``persistent_workers``
keeps the worker processes across ``load_state_dict`` (the DataLoader is re-iterated from the new state). The
DataLoader has its own generator, so starting it never consumes the global random stream (a resumed run would
otherwise draw differently from an uninterrupted one). Randomness a dataset draws inside a worker is not part of
the guarantee: derive it from the sample's index, as ``xflip`` does.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import default_collate

from fastgen.distributed import group as dist_utils
from fastgen.utils.errors import UsageError


class ResumableLoader:
    """``rank`` / ``world_size`` default to the process group's (tests build every rank's loader in one process)."""

    def __init__(self, dataset: Any, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True,
                 rank: int | None = None, world_size: int | None = None, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False,
                 prefetch_factor: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if num_workers < 0:
            raise UsageError(f"num_workers must be 0 or more, got {num_workers}")
        if num_workers == 0 and (persistent_workers or prefetch_factor is not None):
            raise UsageError("persistent_workers and prefetch_factor need worker processes: set num_workers > 0")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.rank = dist_utils.get_rank() if rank is None else int(rank)
        self.world_size = dist_utils.get_world_size() if world_size is None else int(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, world_size={self.world_size})")
        n = len(dataset)
        self.per_rank = n // self.world_size
        if self.per_rank < self.batch_size:
            raise ValueError(
                f"dataset of {n} samples is too small for batch_size {batch_size} on {self.world_size} rank(s)"
            )
        self.epoch = 0
        self.position = 0
        self._orders: dict[int, torch.Tensor] = {}
        self.num_workers = int(num_workers)
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        self.persistent_workers = bool(persistent_workers)
        self.prefetch_factor = prefetch_factor
        self._dataloader: torch.utils.data.DataLoader | None = None
        self._batches: Any = None  # the DataLoader's iterator, from the state it was started at

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.per_rank // self.batch_size

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """This rank's dataset indices for ``epoch``, in the order they are read (the last two are cached)."""
        if epoch not in self._orders:
            n = self.per_rank * self.world_size
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed + epoch)
                order = torch.randperm(len(self.dataset), generator=g)[:n]
            else:
                order = torch.arange(n)
            self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1}
            self._orders[epoch] = order[self.rank :: self.world_size]
        return self._orders[epoch]

    def next_position(self, epoch: int, position: int) -> tuple[int, int]:
        """Where the batch read at ``(epoch, position)`` starts: the next epoch once this one has no full batch."""
        return (epoch + 1, 0) if position + self.batch_size > self.per_rank else (epoch, position)

    def __iter__(self) -> ResumableLoader:
        return self

    def __next__(self) -> dict[str, Any]:
        self.epoch, self.position = self.next_position(self.epoch, self.position)
        sample_ids = self.sample_ids(self.position, self.batch_size)
        if self.num_workers > 0 or self.pin_memory:
            batch = next(self._worker_batches())
        else:
            indices = self.epoch_order(self.epoch)[self.position : self.position + self.batch_size]
            batch = read_batch(self.dataset, indices)
        self.position += self.batch_size
        if isinstance(batch, dict):
            batch["sample_ids"] = sample_ids
        return batch

    def _worker_batches(self) -> Any:
        if self._batches is None:
            if self._dataloader is None:
                from torch.utils.data import DataLoader

                self._dataloader = DataLoader(
                    _BatchReader(self.dataset), batch_sampler=_ReplaySampler(self), collate_fn=_first,
                    num_workers=self.num_workers, pin_memory=self.pin_memory,
                    persistent_workers=self.persistent_workers and self.num_workers > 0,
                    prefetch_factor=self.prefetch_factor if self.num_workers > 0 else None,
                    # The DataLoader draws its workers' base seed from this generator: from the global one, each
                    # restart (a new iterator) would shift the training's random stream by one draw.
                    generator=torch.Generator().manual_seed(self.seed * 65_537 + self.rank),
                )
            self._batches = iter(self._dataloader)
        return self._batches

    def sample_ids(self, position: int, count: int) -> torch.Tensor:
        """Global stream positions of this rank's ``count`` samples from local ``position`` of the current epoch:
        ``epoch * len(dataset) + (position + i) * world_size + rank`` (``len(dataset)`` per epoch, not the samples
        the ranks use, so that ids do not depend on the world size)."""
        local = torch.arange(position, position + count, dtype=torch.int64)
        return self.epoch * len(self.dataset) + local * self.world_size + self.rank

    def state_dict(self) -> dict[str, int]:
        """``position`` is this rank's; ``global_position`` (``position * world_size``) lets a resume at another
        world size continue where the ranks together stopped."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "batch_size": self.batch_size,
                "global_position": self.position * self.world_size, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        if "global_position" in state and int(state.get("world_size", self.world_size)) != self.world_size:
            consumed = int(state["global_position"])
            if consumed % self.world_size:
                raise UsageError(f"the checkpoint's data loader stopped after {consumed} samples of its epoch, which "
                                 f"{self.world_size} ranks cannot split evenly; resume with a world size that divides it")
            self.position = consumed // self.world_size
        else:
            self.position = int(state["position"])
        self._batches = None  # workers read ahead from the old position: start again from the new one


def read_batch(dataset: Any, indices: Any) -> Any:
    """Items ``indices`` of ``dataset``: one vectorised ``get_batch`` when it has one, else collated one by one."""
    if hasattr(dataset, "get_batch"):
        return dataset.get_batch(torch.as_tensor(indices, dtype=torch.long))
    return default_collate([dataset[int(i)] for i in indices])


class _BatchReader:
    """The dataset as the DataLoader's workers see it: ``__getitems__`` reads a whole batch (``read_batch``)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: list[int]) -> Any:
        return read_batch(self.dataset, indices)


class _ReplaySampler:
    """The workers' batch sampler: ``loader``'s batches from the loader's state when the DataLoader is iterated.

    It reaches the loader through a weak reference, one batch at a time: the loader owns the DataLoader, which owns
    this sampler and its iterator, and without a reference cycle a dropped loader frees its DataLoader - and stops
    its workers - at once. (Left to the cycle collector, the shutdown took 5 s per worker to join them.)"""

    def __init__(self, loader: ResumableLoader) -> None:
        self._loader = weakref.ref(loader)

    def __iter__(self) -> Iterator[list[int]]:
        loader = self._loader()
        if loader is None:
            return iter(())
        return _replay(self._loader, loader.epoch, loader.position)


def _replay(ref: weakref.ref, epoch: int, position: int) -> Iterator[list[int]]:
    """Every batch's indices from ``(epoch, position)`` on, as ``ResumableLoader.__next__`` reads them."""
    while (loader := ref()) is not None:
        epoch, position = loader.next_position(epoch, position)
        indices = loader.epoch_order(epoch)[position : position + loader.batch_size].tolist()
        position += loader.batch_size
        del loader
        yield indices


def _first(batch: Any) -> Any:
    """The DataLoader's ``collate_fn``: ``__getitems__`` already returns the collated batch."""
    return batch


def build_dataloader(dataset: Any, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True,
                     rank: int | None = None, world_size: int | None = None, num_workers: int = 0,
                     pin_memory: bool = False, persistent_workers: bool = False,
                     prefetch_factor: int | None = None) -> ResumableLoader:
    """LazyCall target of ``dataloader_train`` / ``dataloader_val``; ``batch_size`` is per rank. ``num_workers``,
    ``pin_memory``, ``persistent_workers`` and ``prefetch_factor`` are the DataLoader's (see the module
    docstring: resuming stays exact with workers)."""
    return ResumableLoader(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                           rank=rank, world_size=world_size, num_workers=num_workers, pin_memory=pin_memory,
                           persistent_workers=persistent_workers, prefetch_factor=prefetch_factor)
