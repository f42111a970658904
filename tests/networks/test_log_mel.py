"""LTX-2's waveform front end (``fastgen.networks.log_mel``) against independent derivations: the Slaney filter bank
written out from its definition here, and the whole log-mel spectrogram against ``transformers.audio_utils``' own
numpy STFT (framing, window and padding done by other code than ``torch.stft``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fastgen.networks.log_mel import log_mel_spectrogram, slaney_mel_filters


def _slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: 3 f / 200 below 1 kHz (15 mel at 1 kHz), then 27 / ln 6.4 mel per e-fold."""
    return np.where(hz < 1000.0, 3.0 * hz / 200.0, 15.0 + 27.0 * np.log(np.maximum(hz, 1e-9) / 1000.0) / math.log(6.4))


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    return np.where(mel < 15.0, 200.0 * mel / 3.0, 1000.0 * np.exp((mel - 15.0) * math.log(6.4) / 27.0))


def _filters_by_definition(n_fft: int, mel_bins: int, rate: int) -> np.ndarray:
    """Triangles between mel-equidistant corner frequencies, each scaled to unit area (2 / its base width)."""
    corners = _slaney_hz(np.linspace(0.0, _slaney_mel(np.array(rate / 2.0)), mel_bins + 2))
    freqs = np.linspace(0.0, rate / 2.0, n_fft // 2 + 1)
    bank = np.zeros((freqs.size, mel_bins))
    for m in range(mel_bins):
        low, centre, high = corners[m:m + 3]
        rising = (freqs - low) / (centre - low)
        falling = (high - freqs) / (high - centre)
        bank[:, m] = np.maximum(0.0, np.minimum(rising, falling)) * 2.0 / (high - low)
    return bank


@pytest.mark.parametrize(("n_fft", "mel_bins", "rate"), [(1024, 64, 16000), (256, 16, 8000)])
def test_the_filters_are_slaneys_unit_area_triangles(n_fft: int, mel_bins: int, rate: int) -> None:
    assert _slaney_mel(np.array(1000.0)) == pytest.approx(15.0)
    np.testing.assert_allclose(slaney_mel_filters(n_fft, mel_bins, rate).numpy(),
                               _filters_by_definition(n_fft, mel_bins, rate), rtol=1e-5, atol=1e-9)


def test_the_spectrogram_is_transformers_numpy_one_logged_at_the_floor() -> None:
    """Every channel of every clip: |STFT| with a periodic Hann window, centred with reflect padding, through the
    filters, ``log(max(., 1e-5))`` - and ``floor(N / hop) + 1`` frames in the ``(B, C, T, M)`` layout."""
    from transformers.audio_utils import mel_filter_bank, spectrogram, window_function

    rng = np.random.default_rng(0)
    waves = rng.normal(0.0, 0.3, (2, 2, 4000)).astype(np.float32)
    waves[1, 1, 1000:3000] = 0.0  # silence: the floor decides
    ours = log_mel_spectrogram(torch.from_numpy(waves), 16000, n_fft=1024, hop_length=160, mel_bins=64)
    assert ours.shape == (2, 2, 4000 // 160 + 1, 64)
    bank = mel_filter_bank(513, 64, 0.0, 8000.0, 16000, norm="slaney", mel_scale="slaney")
    for b in range(2):
        for c in range(2):
            want = spectrogram(waves[b, c].astype(np.float64), window_function(1024, "hann"), 1024, 160, power=1.0,
                               center=True, pad_mode="reflect", mel_filters=bank, mel_floor=1e-5, log_mel="log",
                               dtype=np.float64)
            np.testing.assert_allclose(ours[b, c].numpy(), want.T, atol=2e-5, rtol=0)
    assert float(ours[1, 1, 10].max()) == pytest.approx(math.log(1e-5))


def test_a_tone_lights_the_bands_around_its_pitch() -> None:
    """A 1 kHz sine's energy sits in the filters whose triangles cover 1 kHz."""
    rate, n = 16000, 8000
    tone = torch.sin(2 * math.pi * 1000.0 * torch.arange(n) / rate).view(1, 1, n)
    mel = log_mel_spectrogram(tone, rate, mel_bins=64)[0, 0, 10]
    corners = _slaney_hz(np.linspace(0.0, _slaney_mel(np.array(rate / 2.0)), 66))
    covering = [m for m in range(64) if corners[m] < 1000.0 < corners[m + 2]]
    assert int(mel.argmax()) in covering


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="batch, channels, samples"):
        log_mel_spectrogram(torch.zeros(2, 4000), 16000)
    with pytest.raises(ValueError, match="n_fft / 2"):
        log_mel_spectrogram(torch.zeros(1, 2, 100), 16000)
