"""LTX-2's audio front end: waveforms -> the log-mel spectrograms its audio VAE encodes.

diffusers (0.42) ships LTX-2's audio VAE but not the step before it, and torchaudio, which LTX-2's own preprocessing
calls (``ltx_core.model.audio_vae.ops.AudioProcessor`` in Lightricks/LTX-2: ``torchaudio.transforms.MelSpectrogram``
then a clamped log), has no wheel for the torch fastgen pins. This module computes the same transform from its
definition with ``torch.stft`` and the mel filters of ``transformers.audio_utils`` (which implement torchaudio's and
librosa's filter banks):

* **Magnitude STFT** (power 1): ``|X_t(k)| = |sum_n w(n) x(t h + n - N / 2) e^{-2 pi i k n / N}|`` for
  ``k = 0 .. N / 2`` with ``N = n_fft`` (1024), hop ``h`` (160 samples: 100 frames a second at 16 kHz), ``w`` the
  periodic Hann window of length ``N``, and the signal reflect-padded by ``N / 2`` on both sides (centred frames:
  ``floor(len / h) + 1`` of them).
* **Mel filters** (Slaney, 1998, "Auditory Toolbox", the ``mel_scale="slaney"`` / ``norm="slaney"`` choice): the
  mel scale is linear below 1 kHz and logarithmic above, ``m(f) = 3 f / 200`` for ``f < 1000`` and
  ``15 + 27 ln(f / 1000) / ln 6.4`` above; ``M + 2`` points equally spaced in mel from 0 Hz to ``sr / 2`` give ``M``
  triangles over the linear FFT frequencies, each scaled by ``2 / (f_{i+2} - f_i)`` so every filter has unit area
  (equal energy per band).
* **Log**: ``log(max(F^T |X|, 1e-5))``.

Output ``(B, C, T, M)`` - channels (LTX-2: stereo), frames, mel bins - the layout ``AutoencoderKLLTX2Audio.encode``
takes."""

from __future__ import annotations

import torch

#: the floor under the mel energies before the log (LTX-2's ``AudioProcessor``)
LOG_FLOOR = 1e-5


def slaney_mel_filters(n_fft: int, mel_bins: int, sample_rate: int) -> torch.Tensor:
    """``(n_fft / 2 + 1, mel_bins)``: Slaney-scale, unit-area triangles from 0 Hz to ``sample_rate / 2`` (module
    docstring)."""
    from transformers.audio_utils import mel_filter_bank

    filters = mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=mel_bins, min_frequency=0.0,
                              max_frequency=sample_rate / 2.0, sampling_rate=sample_rate, norm="slaney",
                              mel_scale="slaney")
    return torch.from_numpy(filters).float()


def log_mel_spectrogram(waveforms: torch.Tensor, sample_rate: int, n_fft: int = 1024, hop_length: int = 160,
                        mel_bins: int = 64) -> torch.Tensor:
    """``(B, C, floor(N / hop) + 1, mel_bins)`` log-mel spectrograms of ``(B, C, N)`` waveforms at ``sample_rate``
    (module docstring), computed in float32 whatever the input's dtype."""
    if waveforms.dim() != 3:
        raise ValueError(f"waveforms of shape {tuple(waveforms.shape)}; expected (batch, channels, samples)")
    batch, channels, length = waveforms.shape
    if length <= n_fft // 2:
        raise ValueError(f"{length} samples; the centred STFT's reflect padding needs more than n_fft / 2 = "
                         f"{n_fft // 2}")
    signal = waveforms.reshape(batch * channels, length).float()
    window = torch.hann_window(n_fft, periodic=True, device=signal.device)
    spectrum = torch.stft(signal, n_fft, hop_length=hop_length, win_length=n_fft, window=window, center=True,
                          pad_mode="reflect", normalized=False, onesided=True, return_complex=True).abs()
    filters = slaney_mel_filters(n_fft, mel_bins, sample_rate).to(signal.device)
    mel = spectrum.transpose(1, 2) @ filters  # (B C, T, M)
    return torch.log(mel.clamp(min=LOG_FLOOR)).reshape(batch, channels, -1, mel_bins)


__all__ = ["LOG_FLOOR", "log_mel_spectrogram", "slaney_mel_filters"]
