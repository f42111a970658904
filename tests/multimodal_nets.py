"""A toy two-stream backbone for the multimodal tests: each modality's prediction reads both modalities, its own
time and the label (linear layers over the flattened samples) - the contract of ``DiffusionNet``'s multimodal
forward (``fastgen.networks.modalities``) at the smallest size."""

from __future__ import annotations

import math

import torch
from torch import nn

from fastgen.configs.instantiate import LazyCall
from fastgen.networks.diffusion_net import DiffusionNet
from fastgen.networks.heads import HeadSpec
from fastgen.networks.noise_schedules import RectifiedFlowScheduler


class TwoStream(nn.Module):
    def __init__(self, shapes: dict, num_classes: int = 0, hidden: int = 0) -> None:
        super().__init__()
        self.shapes = {name: list(shape) for name, shape in shapes.items()}
        sizes = {name: math.prod(shape) for name, shape in self.shapes.items()}
        width = sum(sizes.values()) + 1 + num_classes
        self.num_classes = num_classes
        self.heads = nn.ModuleDict({name: nn.Sequential(nn.Linear(width, hidden), nn.SiLU(), nn.Linear(hidden, size))
                                    if hidden else nn.Linear(width, size) for name, size in sizes.items()})

    def forward(self, x, c_noise, condition=None, feature_indices=None, **_):  # noqa: ANN001, ANN003, ANN201
        b = next(iter(x.values())).shape[0]
        cond = []
        if self.num_classes:
            if condition is None:
                cond = [torch.zeros(b, self.num_classes)]
            elif condition.dim() == 1:
                cond = [nn.functional.one_hot(condition.long(), self.num_classes).float()]
            else:
                cond = [condition.float()]
        both = [x[name].flatten(1) for name in self.shapes]
        # (B, k C, ...): k = 1, or PDD's k heads of a widened last layer (head-major rows: channel_major)
        return {name: head(torch.cat([*both, c_noise[name][:, None], *cond], 1)).reshape(b, -1, *x[name].shape[2:])
                for name, head in self.heads.items()}

    def head_projections(self) -> dict[str, HeadSpec]:
        """PDD's widened projections (``fastgen.networks.heads``): each stream's last linear layer, its own."""
        return {name: HeadSpec(f"heads.{name}" if isinstance(head, nn.Linear) else f"heads.{name}.2")
                for name, head in self.heads.items()}


def two_stream_net(shapes: dict, num_classes: int = 0, hidden: int = 0, schedule=None):  # noqa: ANN001, ANN201
    return LazyCall(DiffusionNet)(backbone=LazyCall(TwoStream)(shapes=shapes, num_classes=num_classes, hidden=hidden),
                                  noise_scheduler=schedule or LazyCall(RectifiedFlowScheduler)())
