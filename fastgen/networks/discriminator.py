"""Discriminator heads that read a diffusion network's intermediate features (DMD2, f-distill, LADD).

DMD2 attaches a small classification branch to the bottleneck of the fake-score network (Yin et al. 2024,
Sec. 4.3); LADD attaches heads to the frozen teacher's features (Sauer et al. 2024, Sec. 3). Either way the
features come from ``DiffusionNet.forward(..., feature_indices=[...])`` and each head maps one feature map to one
logit per sample; the logits of all heads are summed.

A head judges one sample at a time, so it cannot see a generator that makes every sample plausible but too few
kinds of them (mode dropping). With ``minibatch_std_group = G > 1`` each head also reads ProGAN's minibatch
standard deviation (Karras et al. 2018, "Progressive Growing of GANs", Sec. 3; groups of G as in StyleGAN): the
spread of the features over a group of at most G samples, one extra input channel. By default a group is G
consecutive samples. For a diffusion discriminator that spread is only informative when the group's samples are
alike in everything but the generator's variety, so callers pass explicit groups (``minibatch_groups``): a group
never mixes real and generated samples, nor (for a conditional model) two conditions, and the caller gives all of
a group's samples one noise level (``per_group``). Otherwise the spread measures the mix of noise levels and
classes in the group, not the variety within a class - which is what a mode-seeking generator loses.
"""

from __future__ import annotations

from collections.abc import Callable

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


def minibatch_groups(batch: int, group: int, condition: torch.Tensor | None = None, parts: int = 1,
                     device: torch.device | str | None = None) -> torch.Tensor | None:
    """Group index ``(batch,)`` (``0 .. n_groups - 1``) for the minibatch standard deviation, or None when it is off
    (``group <= 1``). The batch is ``parts`` equal, contiguous parts (generated then real) that no group crosses.
    Unconditional: consecutive groups of ``group_size(part, group)``. Conditional: each part's samples with the same
    condition row, in batch order, cut into groups of at most ``group`` - so the spread is within one class."""
    if group <= 1:
        return None
    if batch % parts:
        raise ValueError(f"a batch of {batch} does not split into {parts} equal parts")
    part_size = batch // parts
    index = torch.arange(batch, device=device)
    if condition is None:
        return index // group_size(part_size, group)
    _, label = torch.unique(condition.reshape(batch, -1), dim=0, return_inverse=True)
    key = (index // part_size) * batch + label.to(index.device)  # (part, condition) pairs, distinct per part
    _, key = torch.unique(key, return_inverse=True)
    seen = torch.nn.functional.one_hot(key).cumsum(dim=0)  # running count of each key along the batch
    rank = seen.gather(1, key.unsqueeze(1)).squeeze(1) - 1  # position of each sample among its key's samples
    _, ids = torch.unique(key * batch + rank // group, return_inverse=True)
    return ids


def per_group(draw: Callable[[int], torch.Tensor], groups: torch.Tensor | None, batch: int) -> torch.Tensor:
    """One value per group, shared by its samples (a noise level per minibatch-std group): the value ``draw(batch)``
    gives the group's first sample; with ``groups=None`` each sample's own. Drawing per sample and keeping the
    first keeps the draw keyed by sample (``fastgen.distributed.keyed_rng``: a per-sample draw needs the batch's rows)."""
    values = draw(batch)
    if groups is None:
        return values
    groups = groups.to(values.device)
    order = torch.arange(batch, device=groups.device)
    first = torch.full((int(groups.max().item()) + 1,), batch, device=groups.device, dtype=order.dtype)
    first.scatter_reduce_(0, groups, order, reduce="amin")
    return values[first][groups]


def minibatch_std(feature: torch.Tensor, group: int | torch.Tensor) -> torch.Tensor:
    """ProGAN's minibatch standard deviation (Karras et al. 2018, Sec. 3): over each group of samples, the standard
    deviation of every feature (and position), averaged to one number per group and given to each of the group's
    samples. ``group`` is a group size (consecutive samples, ``group_size`` of the batch) or a ``(B,)`` group
    index from ``minibatch_groups``; a group of one sample has spread 0 (real and generated batches with the same
    conditions have the same group sizes, so that is the same for both). Returns ``(B,)``."""
    batch = feature.shape[0]
    flat = feature.float().reshape(batch, -1)
    if isinstance(group, int):
        ids = torch.arange(batch, device=flat.device) // group_size(batch, group)
    else:
        ids = group.to(flat.device)
    n_groups = int(ids.max().item()) + 1
    count = torch.zeros(n_groups, device=flat.device).index_add_(0, ids, torch.ones(batch, device=flat.device))
    mean = torch.zeros(n_groups, flat.shape[1], device=flat.device).index_add_(0, ids, flat) / count.unsqueeze(1)
    deviation = (flat - mean[ids]).square()
    var = torch.zeros_like(mean).index_add_(0, ids, deviation) / count.unsqueeze(1)
    return (var + 1e-8).sqrt().mean(dim=1)[ids].to(feature.dtype)


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

    def forward(self, feature: torch.Tensor, group: int | torch.Tensor | None = None) -> torch.Tensor:
        if self.minibatch_std_group > 1:
            spread = minibatch_std(feature, self.minibatch_std_group if group is None else group)
            extra = spread.view(-1, *([1] * (feature.dim() - 1))).expand(-1, 1, *feature.shape[2:])
            feature = torch.cat([feature, extra], dim=1)
        h = self.body(feature)
        if self.spatial:
            h = h.mean(dim=(2, 3))
        # A fresh tensor, not a view of the linear layer's output: FSDP2 hooks the outputs of the modules it wraps, and
        # an in-place op on a returned view would bypass that hook (torch warns about every such view).
        return self.out(h).squeeze(1).clone()


class FeatureDiscriminator(nn.Module):
    """Heads for a list of feature shapes ``[(C, H, W) or (C,), ...]``; ``forward(features) -> (B,)`` logits."""

    def __init__(self, feature_shapes: list[list[int]] | list[tuple[int, ...]], hidden: int | None = None,
                 minibatch_std_group: int = 0) -> None:
        super().__init__()
        if minibatch_std_group < 0:
            raise ValueError(f"minibatch_std_group must be >= 0, got {minibatch_std_group}")
        self.heads = nn.ModuleList(FeatureHead(int(shape[0]), spatial=len(shape) == 3, hidden=hidden,
                                               minibatch_std_group=minibatch_std_group) for shape in feature_shapes)

    def shard_units(self) -> list[nn.Module]:
        """Each head: FSDP's shard units."""
        return list(self.heads)

    def forward(self, features: list[torch.Tensor], group: int | torch.Tensor | None = None) -> torch.Tensor:
        """``group`` overrides the minibatch-std grouping for this call: a group size, or a ``(B,)`` group index
        from ``minibatch_groups`` (which keeps real and generated samples, and classes, in separate groups)."""
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
