"""Audio-visual moving digits: a moving-digits video (``fastgen.datasets.moving_digits``) with a sound track that
belongs to it - the joint audio-video task a two-stream model (LTX-2) can learn on a CPU.

The sound is a small magnitude spectrogram ``(1, frames, bins)`` - one spectral frame per video frame, laid out as
an audio VAE's latents are (channels, time, frequency) - holding one tone:

* its **pitch** says the digit: digit ``d`` sounds at bin ``3 + d`` (a Gaussian bump of width ``0.6`` bins), so
  the audio alone tells the class, as the video does;
* its **loudness** follows the digit's position: in frame ``f`` the amplitude is ``0.3 + 0.7 x_f / span`` for the
  digit at column ``x_f`` of the ``span + 1`` it can take (louder to the right), so audio and video must agree
  frame by frame - a model that draws each stream alone gets the pitch right and the timing wrong.

Values are in ``[-1, 1]`` (silence -1), like the video's pixels. ``spectrogram_to_waveform`` is the task's vocoder:
additive synthesis of each bin's sine (bin ``m`` at ``220 * 2^(m / 12)`` Hz, a semitone apart from A3) with the
frame's amplitude, linearly interpolated between frames - what W&B plays and MP4s carry.
Items are ``{"real": {"video": (1, F, 8, W), "audio": (1, F, bins)}, "condition": label}``.
"""

from __future__ import annotations

import math

import torch

from fastgen.datasets.moving_digits import MovingDigitsDataset

BINS = 16
PITCH_OFFSET = 3  # digit d sounds at bin PITCH_OFFSET + d
TONE_WIDTH = 0.6  # the tone's Gaussian width in bins
SAMPLE_RATE = 8000
FRAME_SECONDS = 0.125  # each spectral (and video) frame lasts this long: 8 frames are one second


def loudness(offsets: torch.Tensor, span: int) -> torch.Tensor:
    """``(N, F)`` amplitudes in ``[0.3, 1]`` of the digit at column ``offsets`` (louder to the right)."""
    return 0.3 + 0.7 * offsets.float() / max(span, 1)


def spectrograms(labels: torch.Tensor, offsets: torch.Tensor, span: int, bins: int = BINS) -> torch.Tensor:
    """``(N, 1, F, bins)`` spectrograms in ``[-1, 1]`` of the digits ``labels`` at column ``offsets`` ``(N, F)``."""
    pitch = (PITCH_OFFSET + labels.float())[:, None, None]  # (N, 1, 1)
    bump = torch.exp(-0.5 * ((torch.arange(bins).float()[None, None] - pitch) / TONE_WIDTH) ** 2)  # (N, 1, bins)
    magnitude = loudness(offsets, span)[:, :, None] * bump  # (N, F, bins)
    return (2.0 * magnitude - 1.0)[:, None]


def bin_frequencies(bins: int = BINS) -> torch.Tensor:
    """The frequency in Hz of each bin: A3 (220 Hz) and a semitone per bin."""
    return 220.0 * 2.0 ** (torch.arange(bins, dtype=torch.float64) / 12.0)


def spectrogram_to_waveform(spec: torch.Tensor, sample_rate: int = SAMPLE_RATE,
                            frame_seconds: float = FRAME_SECONDS) -> torch.Tensor:
    """``(N, 1, samples)`` waveforms in ``[-1, 1]`` of ``(N, 1, F, bins)`` spectrograms (module docstring): each
    bin's sine at its frequency with the amplitude ``(s + 1) / 2`` interpolated linearly between frame centres,
    scaled so the loudest tone of the task peaks at 0.9."""
    n, _, frames, bins = spec.shape
    amplitude = ((spec.double().clamp(-1, 1) + 1) / 2)[:, 0]  # (N, F, bins)
    hop = int(round(sample_rate * frame_seconds))
    samples = frames * hop
    position = (torch.arange(samples, dtype=torch.float64) + 0.5) / hop - 0.5  # time in frames
    left = position.floor().clamp(0, frames - 1).long()
    right = (left + 1).clamp(max=frames - 1)
    weight = (position - left.double()).clamp(0, 1)[None, :, None]
    envelope = amplitude[:, left] * (1 - weight) + amplitude[:, right] * weight  # (N, samples, bins)
    t = torch.arange(samples, dtype=torch.float64) / sample_rate
    phases = 2 * math.pi * t[:, None] * bin_frequencies(bins)[None]  # (samples, bins)
    wave = (envelope * torch.sin(phases)[None]).sum(-1) * (0.9 / (math.sqrt(2 * math.pi) * TONE_WIDTH))
    return wave.clamp(-1, 1).float()[:, None]


class AudioVideoDigitsDataset:
    """Moving-digits videos of ``split`` with their spectrograms (module docstring)."""

    def __init__(self, split: str = "train", frames: int = 8, width: int = 16, repeats: int = 4, seed: int = 0,
                 bins: int = BINS) -> None:
        if bins < PITCH_OFFSET + 10:
            raise ValueError(f"the ten pitches need at least {PITCH_OFFSET + 10} bins, got {bins}")
        self.videos = MovingDigitsDataset(split, frames=frames, width=width, repeats=repeats, seed=seed)
        self.span, self.bins = width - 8, int(bins)

    def __len__(self) -> int:
        return len(self.videos)

    def get_batch(self, indices: torch.Tensor) -> dict[str, object]:
        batch = self.videos.get_batch(indices)
        audio = spectrograms(batch["condition"], self.videos.offsets[indices], self.span, self.bins)
        return {"real": {"video": batch["real"], "audio": audio}, "condition": batch["condition"]}

    def __getitem__(self, index: int) -> dict[str, object]:
        batch = self.get_batch(torch.tensor([index]))
        return {"real": {name: value[0] for name, value in batch["real"].items()}, "condition": batch["condition"][0]}


__all__ = ["AudioVideoDigitsDataset", "bin_frequencies", "loudness", "spectrogram_to_waveform", "spectrograms"]
