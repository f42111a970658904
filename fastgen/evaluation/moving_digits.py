"""Scores for moving-digits videos (``fastgen.datasets.moving_digits``) with the shipped digits classifier.

Each frame's digit is cropped back out - the 8-column window holding the most ink, ``sum (x + 1) / 2`` - and scored
as a digit: on real videos the window is where the digit was drawn, so a model is judged on its digits, not on
where it put them. Reported, for ``N`` videos:

* ``fd_per_frame``: the Fréchet distance (Heusel et al. 2017, Eq. 6) between frame ``f``'s crops and the crops of
  real moving-digits frames, in the classifier's features, averaged over ``f``;
* ``accuracy``: the classifier's agreement with the video's label, averaged over frames;
* ``temporal_consistency``: the fraction of videos whose predicted label is the same in every frame.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch


def crop_digits(videos: torch.Tensor) -> torch.Tensor:
    """``(N, F, 1, 8, 8)``: each frame's 8x8 window (of ``(N, 1, F, 8, W)`` videos in ``[-1, 1]``) with the most ink;
    among equal ones, the window centred nearest the ink's centroid."""
    if videos.dim() != 5 or videos.shape[1] != 1 or videos.shape[3] != 8:
        raise ValueError(f"moving-digits videos are (N, 1, F, 8, W); got {tuple(videos.shape)}")
    ink = (videos.float().clamp(-1, 1) + 1) / 2  # (N, 1, F, 8, W)
    columns = ink.sum(dim=(1, 3))  # (N, F, W)
    windows = columns.unfold(-1, 8, 1).sum(-1)  # (N, F, W - 7)
    # ties (a digit with blank edge columns fits several windows): the window centred nearest the ink's centroid
    centroid = (columns * torch.arange(columns.shape[-1])).sum(-1) / columns.sum(-1).clamp_min(1e-6)
    centres = torch.arange(windows.shape[-1]) + 3.5
    start = (windows - 1e-3 * (centres - centroid[..., None]).abs()).argmax(-1)  # (N, F)
    index = (start[..., None] + torch.arange(8))[:, None, :, None, :].expand(-1, 1, -1, 8, -1)  # (N, 1, F, 8, 8)
    crops = torch.gather(videos.float(), 4, index)
    return crops.permute(0, 2, 1, 3, 4)


@lru_cache(maxsize=4)
def reference_statistics(frames: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Feature mean and covariance of the crops of every frame of the real moving-digits videos (all digits, 4
    trajectories each, seed 0)."""
    from fastgen.datasets.moving_digits import MovingDigitsDataset
    from fastgen.evaluation.digits import classifier_outputs
    from fastgen.evaluation.frechet import feature_statistics

    data = MovingDigitsDataset(split="all", frames=frames, width=width)
    crops = crop_digits(data.get_batch(torch.arange(len(data)))["real"]).reshape(-1, 1, 8, 8)
    features, _ = classifier_outputs(crops)
    return feature_statistics(features)


def score_videos(videos: Any, labels: Any = None) -> dict[str, float]:
    """``fd_per_frame``, ``accuracy`` (with ``labels``), ``temporal_consistency`` (module docstring) and
    ``num_samples`` of ``(N, 1, F, 8, W)`` videos in ``[-1, 1]``."""
    from fastgen.evaluation.digits import classifier_outputs
    from fastgen.evaluation.frechet import frechet_distance_to_statistics

    videos = torch.as_tensor(videos)
    n, _, frames, _, width = videos.shape
    if labels is not None:
        labels = np.asarray(labels).reshape(-1)
        if labels.shape[0] != n:
            raise ValueError(f"{n} videos but {labels.shape[0]} labels")
    crops = crop_digits(videos)
    features, preds = classifier_outputs(crops.reshape(-1, 1, 8, 8))
    features = features.reshape(n, frames, -1)
    preds = preds.reshape(n, frames)
    mu, sigma = reference_statistics(frames, width)
    per_frame = [frechet_distance_to_statistics(features[:, f], mu, sigma) for f in range(frames)]
    scores = {"fd_per_frame": float(np.mean(per_frame))}
    if labels is not None:
        scores["accuracy"] = float((preds == labels[:, None]).mean())
    scores.update(temporal_consistency=float((preds == preds[:, :1]).all(axis=1).mean()), num_samples=int(n))
    return scores


__all__ = ["crop_digits", "reference_statistics", "score_videos"]
