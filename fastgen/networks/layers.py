"""Small building blocks shared by the backbones."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


class FourierEmbedding(nn.Module):
    """Sinusoidal embedding of a scalar noise level (Vaswani et al. 2017, Sec. 3.5; used as in EDM's
    ``PositionalEmbedding``): ``[cos(c * f_k), sin(c * f_k)]`` with ``f_k = scale * max_period^(-k/half)``."""

    def __init__(self, dim: int, scale: float = 100.0, max_period: float = 10_000.0) -> None:
        super().__init__()
        half = dim // 2
        freqs = scale * torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
        self.register_buffer("freqs", freqs, persistent=False)

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        angles = c.float()[:, None] * self.freqs[None, :]
        return torch.cat([angles.cos(), angles.sin()], dim=1)


class ConditionEmbedding(nn.Module):
    """Noise-level (and optional second time ``r`` and class label) embedding -> one vector per sample."""

    def __init__(self, emb_dim: int, num_classes: int = 0, fourier_dim: int = 64, use_r: bool = False) -> None:
        super().__init__()
        self.fourier = FourierEmbedding(fourier_dim)
        self.r_fourier = FourierEmbedding(fourier_dim) if use_r else None
        in_dim = fourier_dim * (2 if use_r else 1)
        self.mlp = nn.Sequential(nn.Linear(in_dim, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.num_classes = num_classes
        self.label = nn.Linear(num_classes, emb_dim, bias=False) if num_classes > 0 else None

    def forward(self, c_noise: torch.Tensor, condition: torch.Tensor | None, r_noise: torch.Tensor | None) -> torch.Tensor:
        parts = [self.fourier(c_noise)]
        if self.r_fourier is not None:
            parts.append(self.r_fourier(c_noise if r_noise is None else r_noise))
        # Fourier features are computed in the float32 of their frequencies; the MLP may hold another dtype (bf16
        # weights, or FSDP2 gathering float32 shards as bf16 for compute).
        emb = self.mlp(torch.cat(parts, dim=1).to(self.mlp[0].weight.dtype))
        if self.label is not None and condition is not None:
            emb = emb + self.label(as_one_hot(condition, self.num_classes).to(emb.dtype))
        return emb


def as_one_hot(condition: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Accept integer labels ``(B,)`` or one-hot / soft labels ``(B, num_classes)`` (zeros = unconditional)."""
    if condition.dim() == 1:
        return nn.functional.one_hot(condition.long(), num_classes).float()
    return condition.float()


def contract_output(out: torch.Tensor, features: list[torch.Tensor] | None = None,
                    logvar: torch.Tensor | None = None) -> Any:
    """What a backbone (and ``DiffusionNet``) returns under the network contract: ``out`` alone when nothing else
    was asked for, else ``(out, features, logvar)`` with only the parts that were (``None`` = not asked for)."""
    if features is None and logvar is None:
        return out
    result: tuple[Any, ...] = (out,)
    if features is not None:
        result += (features,)
    if logvar is not None:
        result += (logvar,)
    return result
