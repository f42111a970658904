"""Moving digits: scikit-learn's 8x8 digits gliding across an ``8 x width`` canvas over ``frames`` frames - a video
task that trains on a CPU (the video families' and causal students' smoke test, as the digits are the images').

Each video is one digit (values in ``[-1, 1]``, background -1) at column offset ``x_f`` in frame ``f``: it starts at
a random offset in ``[0, width - 8]`` and moves one pixel per frame, left or right, reflecting at the canvas edges
(so its motion is predictable from any two frames). Only the horizontal position moves, so every frame holds the
whole digit: ``fastgen.evaluation.moving_digits`` crops it back out and scores it with the digits classifier.

Videos are a fixed function of ``(split, index, seed)``: ``repeats`` trajectories per digit of the split (the
digits split of ``fastgen.datasets.digits``). Items are ``{"real": (1, frames, 8, width), "condition": label}``,
frame-major in time like every video latent here ``(C, F, H, W)``.
"""

from __future__ import annotations

import torch

from fastgen.datasets.digits import DigitsDataset


def glide_offsets(start: torch.Tensor, direction: torch.Tensor, frames: int, span: int) -> torch.Tensor:
    """``(N, frames)`` column offsets: from ``start`` one pixel per frame in ``direction`` (+1 / -1), reflecting
    at 0 and ``span`` (the triangle wave of period ``2 span``)."""
    steps = start[:, None] + direction[:, None] * torch.arange(frames)[None]
    period = 2 * span
    phase = torch.remainder(steps, period)
    return torch.where(phase <= span, phase, period - phase)


def render(digits: torch.Tensor, offsets: torch.Tensor, width: int) -> torch.Tensor:
    """``(N, 1, F, 8, width)`` videos of ``digits`` ``(N, 1, 8, 8)`` at ``offsets`` ``(N, F)`` on a -1 canvas."""
    n, frames = offsets.shape
    video = torch.full((n, 1, frames, 8, width), -1.0, dtype=digits.dtype)
    for f in range(frames):
        for x in offsets[:, f].unique().tolist():
            rows = (offsets[:, f] == x).nonzero().squeeze(1)
            video[rows, :, f, :, x:x + 8] = digits[rows]
    return video


class MovingDigitsDataset:
    """``repeats`` gliding videos per digit of ``split`` (``train`` / ``val`` / ``all``)."""

    def __init__(self, split: str = "train", frames: int = 8, width: int = 16, repeats: int = 4, seed: int = 0) -> None:
        if frames < 1 or width < 8 or repeats < 1:
            raise ValueError("moving digits need frames >= 1, width >= 8 and repeats >= 1")
        digits = DigitsDataset(split=split)
        self.frames, self.width = int(frames), int(width)
        count = len(digits) * repeats
        generator = torch.Generator().manual_seed(seed)
        span = width - 8
        start = torch.randint(0, span + 1, (count,), generator=generator)
        direction = torch.randint(0, 2, (count,), generator=generator) * 2 - 1
        self.source = torch.arange(count) % len(digits)
        self.offsets = glide_offsets(start, direction, frames, span) if span else torch.zeros(count, frames).long()
        self.digits, self.labels = digits.images, digits.labels

    def __len__(self) -> int:
        return self.source.shape[0]

    def get_batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        source = self.source[indices]
        return {"real": render(self.digits[source], self.offsets[indices], self.width),
                "condition": self.labels[source]}

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {key: value[0] for key, value in self.get_batch(torch.tensor([index])).items()}


__all__ = ["MovingDigitsDataset", "glide_offsets", "render"]
