"""A clip's sound for ``encode-data`` (``fastgen.datasets.sound``): the audio track of real MP4 files (AAC, written
with PyAV) over the frames' span, resampled, and folded to stereo as LTX-2's trainer folds it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastgen.datasets.sound import read_sound, span_samples, to_stereo
from fastgen.pipelines.media import write_mp4


def _tone(freq: float, seconds: float, rate: int, amplitude: float = 0.5, delay: float = 0.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * (t - delay)) * (t >= delay)).astype(np.float32)


def _clip(path: Path, audio: np.ndarray | None, rate: int = 48000, frames: int = 24) -> Path:
    write_mp4(path, np.zeros((frames, 16, 16, 3), np.uint8), fps=24, audio=audio, sample_rate=rate)
    return path


def _pitch(wave: np.ndarray, rate: int) -> float:
    return float(np.argmax(np.abs(np.fft.rfft(wave)))) * rate / wave.size


def test_the_track_is_resampled_and_cut_to_the_span(tmp_path: Path) -> None:
    """A 48 kHz stereo track read at 16 kHz: ``samples`` samples from ``start``, each channel's pitch and level kept,
    aligned in time (a tone starting 0.25 s in starts 0.25 s in); past the track's end, zeros."""
    left, right = _tone(440.0, 1.0, 48000), _tone(1000.0, 1.0, 48000, amplitude=0.25, delay=0.25)
    path = _clip(tmp_path / "a.mp4", np.stack([left, right]))
    sound = read_sound(path, 0.0, 16000, 16000)
    assert sound is not None and sound.shape == (2, 16000) and sound.dtype == np.float32
    assert _pitch(sound[0], 16000) == pytest.approx(440.0, abs=1.0)
    assert _pitch(sound[1, 4000:], 16000) == pytest.approx(1000.0, abs=1.0)
    assert np.sqrt(np.mean(sound[0, 2000:14000] ** 2)) * np.sqrt(2) == pytest.approx(0.5, rel=0.03)
    onset = int(np.argmax(np.abs(sound[1]) > 0.05))
    assert abs(onset - 4000) < 40  # 2.5 ms
    later = read_sound(path, 0.5, 16000, 16000)
    assert later is not None
    np.testing.assert_allclose(later[:, :4000], sound[:, 8000:12000], atol=0.02)  # the same track, 0.5 s on
    assert np.abs(later[:, 9000:]).max() == 0.0  # the track ends at 1 s (plus the codec's last frame)
    bytes_read = read_sound(path.read_bytes(), 0.0, 16000, 16000)
    np.testing.assert_array_equal(bytes_read, sound)  # a WebDataset member's bytes read as the file


def test_mono_is_duplicated_and_a_silent_file_has_no_sound(tmp_path: Path) -> None:
    mono = read_sound(_clip(tmp_path / "m.mp4", _tone(300.0, 0.5, 22050)[None], rate=22050), 0.0, 4000, 8000)
    assert mono is not None and mono.shape == (2, 4000)
    np.testing.assert_array_equal(mono[0], mono[1])
    assert _pitch(mono[0], 8000) == pytest.approx(300.0, abs=2.0)
    assert read_sound(_clip(tmp_path / "v.mp4", None), 0.0, 100, 16000) is None


def test_surround_folds_down_as_ltx2s_trainer() -> None:
    """5.1 ``L R C LFE Ls Rs``: left = (L + 0.707 C + 0.707 Ls) / 2.414, LFE dropped; 7.1 adds the backs; other
    layouts are averaged."""
    wave = np.arange(6 * 3, dtype=np.float32).reshape(6, 3)
    L, R, C, _, Ls, Rs = wave
    np.testing.assert_allclose(to_stereo(wave), np.stack([L + 0.707 * C + 0.707 * Ls, R + 0.707 * C + 0.707 * Rs])
                               / 2.414, rtol=1e-6)
    wave8 = np.arange(8 * 2, dtype=np.float32).reshape(8, 2)
    np.testing.assert_allclose(to_stereo(wave8)[1], (wave8[1] + 0.707 * (wave8[2] + wave8[5] + wave8[7])) / 3.121,
                               rtol=1e-6)
    three = np.array([[1.0], [2.0], [6.0]], dtype=np.float32)
    np.testing.assert_array_equal(to_stereo(three), [[3.0], [3.0]])
    stereo = np.ones((2, 5), np.float32)
    assert to_stereo(stereo) is stereo


def test_the_span_counts_samples_as_the_pipelines() -> None:
    """``floor(F s / fps * rate)``: LTX-2's 121 frames at 24 fps are 80,666 samples at 16 kHz; exact spans do not
    lose a sample to rounding."""
    assert span_samples(121, 1, 24.0, 16000) == 80666
    assert span_samples(9, 2, 24.0, 16000) == 12000
    assert span_samples(93, 1, 24.0, 48000) == int(93 / 24 * 48000)
