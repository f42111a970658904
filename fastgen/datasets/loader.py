"""A resumable, rank-aware, infinite data loader.

Each epoch is a permutation drawn from ``seed + epoch`` (so every rank agrees on it without communication);
rank ``r`` of ``W`` takes positions ``r, r + W, ...``. The loader's state is ``(epoch, position)``: saving it in
a checkpoint and loading it back continues with exactly the batch an uninterrupted run would have seen, which
the bit-identical resume guarantee depends on. Datasets that implement ``get_batch(indices)`` are gathered in
one vectorised index; others are collated item by item.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import default_collate

from fastgen.utils import distributed as dist_utils


class ResumableLoader:
    def __init__(self, dataset: Any, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.rank = dist_utils.get_rank()
        self.world_size = dist_utils.get_world_size()
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
        self.position += self.batch_size
        if hasattr(self.dataset, "get_batch"):
            return self.dataset.get_batch(indices)
        return default_collate([self.dataset[int(i)] for i in indices])

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = None


def build_dataloader(dataset: Any, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True) -> ResumableLoader:
    """LazyCall target of ``dataloader_train`` / ``dataloader_val``; ``batch_size`` is per rank."""
    return ResumableLoader(dataset, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last)
