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
ids (``fastgen.utils.keyed_rng``), which makes a run's result independent of the world size. A loader's position
is stored as a global position too, so a checkpoint resumes at another world size (with the same global batch)
on exactly the samples an uninterrupted run would have seen next.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import default_collate

from fastgen.utils import distributed as dist_utils
from fastgen.utils.errors import UsageError


class ResumableLoader:
    """``rank`` / ``world_size`` default to the process group's (tests build every rank's loader in one process)."""

    def __init__(self, dataset: Any, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True,
                 rank: int | None = None, world_size: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
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
        self._order: torch.Tensor | None = None

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.per_rank // self.batch_size

    def _epoch_order(self) -> torch.Tensor:
        if self._order is None:
            n = self.per_rank * self.world_size
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed + self.epoch)
                order = torch.randperm(len(self.dataset), generator=g)[:n]
            else:
                order = torch.arange(n)
            self._order = order[self.rank :: self.world_size]
        return self._order

    def __iter__(self) -> ResumableLoader:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.position + self.batch_size > self.per_rank:
            self.epoch += 1
            self.position = 0
            self._order = None
        indices = self._epoch_order()[self.position : self.position + self.batch_size]
        sample_ids = self.sample_ids(self.position, len(indices))
        self.position += self.batch_size
        if hasattr(self.dataset, "get_batch"):
            batch = self.dataset.get_batch(indices)
        else:
            batch = default_collate([self.dataset[int(i)] for i in indices])
        if isinstance(batch, dict):
            batch["sample_ids"] = sample_ids
        return batch

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
        self._order = None


def build_dataloader(dataset: Any, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True,
                     rank: int | None = None, world_size: int | None = None) -> ResumableLoader:
    """LazyCall target of ``dataloader_train`` / ``dataloader_val``; ``batch_size`` is per rank."""
    return ResumableLoader(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                           rank=rank, world_size=world_size)
