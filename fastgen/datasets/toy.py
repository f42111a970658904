"""Procedurally generated 2-D toy distributions (fixed-size, seeded, so every run sees the same data).

``eight_gaussians``, ``checkerboard``, ``two_moons`` and ``swiss_roll``: standard low-dimensional test beds for
generative models (e.g. Grathwohl et al. 2019, FFJORD, Sec. 5.1). Each is scaled to roughly unit variance per
coordinate so the EDM default ``sigma_data = 0.5``-ish preconditioning and a flow schedule both work unchanged.
"""

from __future__ import annotations

import math

import torch

TOY_DISTRIBUTIONS = ("eight_gaussians", "checkerboard", "two_moons", "swiss_roll")


def toy_samples(name: str, n: int, seed: int = 0) -> torch.Tensor:
    """``n`` samples ``(n, 2)`` of the named distribution, deterministic for a given seed."""
    g = torch.Generator().manual_seed(seed)
    if name == "eight_gaussians":
        centers = torch.tensor([(math.cos(a), math.sin(a)) for a in torch.arange(8).float() * math.pi / 4])
        idx = torch.randint(0, 8, (n,), generator=g)
        x = centers[idx] * 2.0 + 0.1 * torch.randn(n, 2, generator=g)
        return x / 1.42
    if name == "checkerboard":
        x1 = torch.rand(n, generator=g) * 4 - 2
        x2 = torch.rand(n, generator=g) - torch.randint(0, 2, (n,), generator=g).float() * 2
        x2 = x2 + (torch.floor(x1) % 2)
        return torch.stack([x1, x2], dim=1) / 1.15
    if name == "two_moons":
        half = n // 2
        angles = torch.rand(n, generator=g) * math.pi
        upper = torch.stack([angles[:half].cos(), angles[:half].sin()], dim=1)
        lower = torch.stack([1 - angles[half:].cos(), 0.5 - angles[half:].sin()], dim=1)
        x = torch.cat([upper, lower]) + 0.05 * torch.randn(n, 2, generator=g)
        x = x - torch.tensor([0.5, 0.25])
        return x[torch.randperm(n, generator=g)] / 0.62
    if name == "swiss_roll":
        t = 1.5 * math.pi * (1 + 2 * torch.rand(n, generator=g))
        x = torch.stack([t * t.cos(), t * t.sin()], dim=1) + 0.3 * torch.randn(n, 2, generator=g)
        return x / 7.5
    raise ValueError(f"unknown toy distribution {name!r}; choose one of {', '.join(TOY_DISTRIBUTIONS)}")


class ToyDataset:
    """An in-memory dataset of ``num_samples`` points; items are ``{"real": (2,)}``."""

    def __init__(self, name: str = "eight_gaussians", num_samples: int = 50_000, seed: int = 0) -> None:
        self.name = name
        self.data = toy_samples(name, num_samples, seed)

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"real": self.data[index]}

    def get_batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"real": self.data[indices]}
