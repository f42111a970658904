"""Discriminator heads that read a diffusion network's intermediate features (DMD2, f-distill, LADD).

DMD2 attaches a small classification branch to the bottleneck of the fake-score network (Yin et al. 2024,
Sec. 4.3); LADD attaches heads to the frozen teacher's features (Sauer et al. 2024, Sec. 3). Either way the
features come from ``DiffusionNet.forward(..., feature_indices=[...])`` and each head maps one feature map to one
logit per sample; the logits of all heads are summed.

A head judges one sample at a time, so it cannot see a generator that makes every sample plausible but too few
kinds of them (mode dropping). With ``minibatch_std_group = G > 1`` each head also reads ProGAN's minibatch
standard deviation (Karras et al. 2018, "Progressive Growing of GANs", Sec. 3; groups of G as in StyleGAN): the
spread of the features over each group of G consecutive samples, one extra input channel. Real and generated
samples must then come in separate groups: callers that score both in one batch put them in contiguous halves
whose size G divides.
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


def group_size(batch: int, group: int) -> int:
    """The largest divisor of ``batch`` that is at most ``group`` (StyleGAN takes ``min(group, batch)`` and needs
    it to divide the batch; taking a divisor keeps any batch size working)."""
    for size in range(min(group, batch), 0, -1):
        if batch % size == 0:
            return size
    return 1


def minibatch_std(feature: torch.Tensor, group: int) -> torch.Tensor:
    """ProGAN's minibatch standard deviation (Karras et al. 2018, Sec. 3): over each group of ``group`` consecutive
    samples, the standard deviation of every feature (and position), averaged to one number per group and given
    to each of the group's samples. Returns ``(B,)``."""
    batch = feature.shape[0]
    size = group_size(batch, group)
    grouped = feature.float().reshape(batch // size, size, -1)
    spread = (grouped.var(dim=1, unbiased=False) + 1e-8).sqrt().mean(dim=1)
    return spread.repeat_interleave(size).to(feature.dtype)


class FeatureHead(nn.Module):
    """One logit per sample from a ``(B, C, H, W)`` feature map (conv, norm, SiLU, spatial mean, linear) or from a
    ``(B, C)`` feature vector (linear, SiLU, linear); with ``minibatch_std_group > 1`` the feature gets one more
    channel, its group's minibatch standard deviation."""

    def __init__(self, channels: int, spatial: bool, hidden: int | None = None, minibatch_std_group: int = 0) -> None:
        super().__init__()
        hidden = hidden or channels
        self.spatial = spatial
        self.minibatch_std_group = minibatch_std_group
        inputs = channels + (1 if minibatch_std_group > 1 else 0)
        if spatial:
            self.body = nn.Sequential(nn.Conv2d(inputs, hidden, 3, padding=1), nn.GroupNorm(_groups(hidden), hidden), nn.SiLU())
        else:
            self.body = nn.Sequential(nn.Linear(inputs, hidden), nn.SiLU())
        self.out = nn.Linear(hidden, 1)

    def forward(self, feature: torch.Tensor, group: int | None = None) -> torch.Tensor:
        if self.minibatch_std_group > 1:
            spread = minibatch_std(feature, group or self.minibatch_std_group)
            extra = spread.view(-1, *([1] * (feature.dim() - 1))).expand(-1, 1, *feature.shape[2:])
            feature = torch.cat([feature, extra], dim=1)
        h = self.body(feature)
        if self.spatial:
            h = h.mean(dim=(2, 3))
        return self.out(h).squeeze(1)


class FeatureDiscriminator(nn.Module):
    """Heads for a list of feature shapes ``[(C, H, W) or (C,), ...]``; ``forward(features) -> (B,)`` logits."""

    def __init__(self, feature_shapes: list[list[int]] | list[tuple[int, ...]], hidden: int | None = None,
                 minibatch_std_group: int = 0) -> None:
        super().__init__()
        if minibatch_std_group < 0:
            raise ValueError(f"minibatch_std_group must be >= 0, got {minibatch_std_group}")
        self.heads = nn.ModuleList(FeatureHead(int(shape[0]), spatial=len(shape) == 3, hidden=hidden,
                                               minibatch_std_group=minibatch_std_group) for shape in feature_shapes)

    def forward(self, features: list[torch.Tensor], group: int | None = None) -> torch.Tensor:
        """``group`` overrides the minibatch-std group size for this call: a caller scoring real and generated
        samples in one batch passes ``group_size(half, minibatch_std_group)`` so that no group straddles them."""
        if len(features) != len(self.heads):
            raise ValueError(f"expected {len(self.heads)} feature maps, got {len(features)}")
        logits = self.heads[0](features[0], group)
        for head, feature in zip(self.heads[1:], features[1:]):
            logits = logits + head(feature, group)
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
