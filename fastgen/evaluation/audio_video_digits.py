"""Scores for audio-visual moving digits (``fastgen.datasets.audio_video_digits``): the video's scores
(``fastgen.evaluation.moving_digits``: FD per frame, accuracy, temporal consistency) and the sound's:

* ``spectral_fd``: the Fréchet distance (Heusel et al. 2017, Eq. 6) between generated and real sounds in a
  summary of their spectrograms - the pitch profile (each bin's magnitude averaged over time) and the loudness
  envelope (each frame's peak magnitude) - a spectral distance that sees both what is played and when;
* ``pitch_accuracy``: the share of sounds whose loudest bin over time is the label's pitch;
* ``av_sync``: the correlation over frames between the sound's loudness and the digit's position in the video
  (the ink's centroid column), averaged over samples: 1 for real pairs, about 0 for streams drawn apart.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch

from fastgen.datasets.audio_video_digits import PITCH_OFFSET


def audio_features(spec: torch.Tensor) -> torch.Tensor:
    """``(N, bins + F)``: the pitch profile and the loudness envelope of ``(N, 1, F, bins)`` spectrograms."""
    magnitude = ((spec.float().clamp(-1, 1) + 1) / 2)[:, 0]
    return torch.cat([magnitude.mean(dim=1), magnitude.amax(dim=2)], dim=1)


def digit_positions(videos: torch.Tensor) -> torch.Tensor:
    """``(N, F)``: the ink's centroid column in each frame of ``(N, 1, F, 8, W)`` videos."""
    ink = ((videos.float().clamp(-1, 1) + 1) / 2).sum(dim=(1, 3))  # (N, F, W)
    columns = torch.arange(ink.shape[-1], dtype=ink.dtype)
    return (ink * columns).sum(-1) / ink.sum(-1).clamp_min(1e-6)


def frame_correlation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(N,)`` Pearson correlations of the rows of ``a`` and ``b`` ``(N, F)``; 0 where either row is constant."""
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    denominator = (a.norm(dim=1) * b.norm(dim=1))
    return torch.where(denominator > 1e-8, (a * b).sum(1) / denominator.clamp_min(1e-8), torch.zeros_like(denominator))


@lru_cache(maxsize=4)
def reference_statistics(frames: int, width: int, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of ``audio_features`` of every real sound (all digits, 4 trajectories each, seed 0)."""
    from fastgen.datasets.audio_video_digits import AudioVideoDigitsDataset
    from fastgen.evaluation.frechet import feature_statistics

    data = AudioVideoDigitsDataset("all", frames=frames, width=width, bins=bins)
    audio = data.get_batch(torch.arange(len(data)))["real"]["audio"]
    return feature_statistics(audio_features(audio).double().numpy())


def score_audio_video(videos: Any, audio: Any, labels: Any = None) -> dict[str, float]:
    """The video's and the sound's scores (module docstring) of ``(N, 1, F, 8, W)`` videos and ``(N, 1, F, bins)``
    spectrograms in ``[-1, 1]`` (``accuracy`` and ``pitch_accuracy`` with ``labels``)."""
    from fastgen.evaluation.frechet import frechet_distance_to_statistics
    from fastgen.evaluation.moving_digits import score_videos

    videos, audio = torch.as_tensor(videos), torch.as_tensor(audio)
    if videos.shape[0] != audio.shape[0] or videos.shape[2] != audio.shape[2]:
        raise ValueError(f"videos {tuple(videos.shape)} and sounds {tuple(audio.shape)} must pair up frame by frame")
    scores = score_videos(videos, labels)
    features = audio_features(audio)
    mu, sigma = reference_statistics(videos.shape[2], videos.shape[-1], audio.shape[-1])
    scores["spectral_fd"] = frechet_distance_to_statistics(features.double().numpy(), mu, sigma)
    if labels is not None:
        pitch = features[:, : audio.shape[-1]].argmax(dim=1) - PITCH_OFFSET
        scores["pitch_accuracy"] = float((pitch.numpy() == np.asarray(labels).reshape(-1)).mean())
    envelope = features[:, audio.shape[-1]:]
    scores["av_sync"] = float(frame_correlation(envelope, digit_positions(videos)).mean())
    return scores


__all__ = ["audio_features", "digit_positions", "reference_statistics", "score_audio_video"]
