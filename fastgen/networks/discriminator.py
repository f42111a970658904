"""Discriminator heads that read a diffusion network's intermediate features (DMD2, f-distill, LADD).

DMD2 attaches a small classification branch to the bottleneck of the fake-score network (Yin et al. 2024,
Sec. 4.3); LADD attaches heads to the frozen teacher's features (Sauer et al. 2024, Sec. 3). Either way the
features come from ``DiffusionNet.forward(..., feature_indices=[...])`` and each head maps one feature map to one
logit per sample; the logits of all heads are summed.
"""

from __future__ import annotations

import torch
from torch import nn

from fastgen.networks.diffusion_net import DiffusionNet


def _groups(channels: int) -> int:
    for groups in (32, 16, 8, 4, 2, 1):
        if channels % groups == 0:
            return groups
    return 1


class FeatureHead(nn.Module):
    """One logit per sample from a ``(B, C, H, W)`` feature map (conv, norm, SiLU, spatial mean, linear) or from a
    ``(B, C)`` feature vector (linear, SiLU, linear)."""

    def __init__(self, channels: int, spatial: bool, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or channels
        self.spatial = spatial
        if spatial:
            self.body = nn.Sequential(nn.Conv2d(channels, hidden, 3, padding=1), nn.GroupNorm(_groups(hidden), hidden), nn.SiLU())
        else:
            self.body = nn.Sequential(nn.Linear(channels, hidden), nn.SiLU())
        self.out = nn.Linear(hidden, 1)

    def forward(self, feature: torch.Tensor) -> torch.Tensor:
        h = self.body(feature)
        if self.spatial:
            h = h.mean(dim=(2, 3))
        return self.out(h).squeeze(1)


class FeatureDiscriminator(nn.Module):
    """Heads for a list of feature shapes ``[(C, H, W) or (C,), ...]``; ``forward(features) -> (B,)`` logits."""

    def __init__(self, feature_shapes: list[list[int]] | list[tuple[int, ...]], hidden: int | None = None) -> None:
        super().__init__()
        self.heads = nn.ModuleList(FeatureHead(int(shape[0]), spatial=len(shape) == 3, hidden=hidden) for shape in feature_shapes)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        if len(features) != len(self.heads):
            raise ValueError(f"expected {len(self.heads)} feature maps, got {len(features)}")
        logits = self.heads[0](features[0])
        for head, feature in zip(self.heads[1:], features[1:]):
            logits = logits + head(feature)
        return logits


def head_features(net: nn.Module, x_t: torch.Tensor, t: torch.Tensor, condition: torch.Tensor | None,
                  feature_indices: list[int]) -> list[torch.Tensor]:
    """The features a head reads from ``net`` (gradients flow as in a full forward). A ``DiffusionNet`` stops at
    the deepest requested feature (``features_only``), so a bottleneck head never runs the decoder; any other
    network honouring the contract runs its full forward."""
    if isinstance(net, DiffusionNet):
        return net(x_t, t, condition=condition, feature_indices=feature_indices, features_only=True)
    return net(x_t, t, condition=condition, feature_indices=feature_indices)[1]


@torch.no_grad()
def probe_feature_shapes(net: nn.Module, input_shape: list[int], feature_indices: list[int], num_classes: int,
                         t: float) -> list[list[int]]:
    """The per-sample shapes of the features ``net`` returns for ``feature_indices`` (one tiny forward on CPU
    copies of the inputs, so heads can be sized without asking the user for channel counts)."""
    param = next(net.parameters())
    x = torch.zeros(1, *input_shape, device=param.device, dtype=param.dtype)
    time = torch.full((1,), t, device=param.device, dtype=param.dtype)
    condition = torch.zeros(1, num_classes, device=param.device) if num_classes > 0 else None
    _, features = net(x, time, condition=condition, feature_indices=feature_indices)
    if len(features) != len(feature_indices):
        raise ValueError(f"the network returned {len(features)} feature maps for feature_indices={feature_indices}")
    return [list(f.shape[1:]) for f in features]


def default_feature_indices(net: nn.Module) -> list[int]:
    """The bottleneck of the network's backbone (see ``bottleneck_feature_index`` on each backbone)."""
    backbone = getattr(net, "backbone", net)
    index = getattr(backbone, "bottleneck_feature_index", None)
    if index is None:
        raise ValueError(f"{type(backbone).__name__} does not say where its bottleneck features are; "
                         "set model.feature_indices explicitly")
    return [int(index)]
