"""An MLP denoiser for low-dimensional data (the 2-D toy distributions)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fastgen.networks.heads import HeadSpec
from fastgen.networks.layers import ConditionEmbedding


class MLPDenoiser(nn.Module):
    """``F(x, c_noise) = MLP([x, emb(c_noise)])`` with residual SiLU layers; the output layer starts at zero."""

    def __init__(self, data_dim: int = 2, hidden_dim: int = 256, num_layers: int = 3, num_classes: int = 0,
                 emb_dim: int = 128, use_r: bool = False) -> None:
        super().__init__()
        self.embed = ConditionEmbedding(emb_dim, num_classes=num_classes, use_r=use_r)
        self.inp = nn.Linear(data_dim + emb_dim, hidden_dim)
        self.layers = nn.ModuleList(nn.Linear(hidden_dim, hidden_dim) for _ in range(num_layers))
        self.out = nn.Linear(hidden_dim, data_dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    @property
    def bottleneck_feature_index(self) -> int:
        """The ``feature_indices`` entry of the last hidden layer - where discriminator heads attach."""
        return len(self.layers) - 1

    def head_projection(self) -> HeadSpec:
        """The output projection PDD widens: the output layer (its outputs are the data's coordinates)."""
        return HeadSpec("out")

    def shard_units(self) -> list[nn.Module]:
        """Each hidden layer: FSDP's shard units."""
        return list(self.layers)

    def forward(self, x: torch.Tensor, c_noise: torch.Tensor, condition: torch.Tensor | None = None,
                r_noise: torch.Tensor | None = None, feature_indices: list[int] | None = None,
                return_logvar: bool = False, features_only: bool = False) -> Any:
        if return_logvar:
            raise ValueError("MLPDenoiser does not predict a log-variance")
        wanted = len(feature_indices) if features_only and feature_indices is not None else -1
        emb = self.embed(c_noise, condition, r_noise)
        h = nn.functional.silu(self.inp(torch.cat([x, emb.to(x.dtype)], dim=1)))
        features = []
        for i, layer in enumerate(self.layers):
            h = h + nn.functional.silu(layer(h))
            if feature_indices is not None and i in feature_indices:
                features.append(h)
                if len(features) == wanted:
                    return features
        if features_only:
            return features
        out = self.out(h)
        return (out, features) if feature_indices is not None else out
