"""A clip's sound for ``encode-data``: the audio track of a video file over the span its frames cover, resampled to
the rate a family's audio encoder takes and made stereo, as LTX-2's trainer prepares it
(``ltx-trainer/scripts/process_videos.py`` in Lightricks/LTX-2).

* **Span.** ``samples`` samples from the time of the first frame taken (``start``): the frames' span, ``F s / fps``
  seconds for ``F`` frames at stride ``s``. A track that ends early is zero-padded to it (LTX-2's trainer does the
  same); one that starts late is zero-padded before.
* **Rate.** FFmpeg's resampler (``libswresample`` through PyAV, which ``encode-data`` already reads videos with)
  converts the track to ``rate`` as it is decoded. LTX-2's trainer uses torchaudio's windowed-sinc resampler
  instead; the two differ by the filters' ripple, far below the audio VAE's reconstruction error.
* **Channels** (the audio VAEs are stereo): mono is duplicated; 5.1 (``L R C LFE Ls Rs``) and 7.1 (``... Lb Rb``)
  are folded down with the centre and surrounds at ``0.707`` of the front and the weights normalised to sum to 1
  (LFE dropped), as LTX-2's trainer does; any other layout is averaged to mono and duplicated."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

#: 5.1 / 7.1 fold-down: (left sources, right sources) by channel index, the first of each at weight 1, the rest 0.707
_FOLDS = {6: ((0, 2, 4), (1, 2, 5)), 8: ((0, 2, 4, 6), (1, 2, 5, 7))}
_SURROUND_WEIGHT = 0.707


def to_stereo(waveform: np.ndarray) -> np.ndarray:
    """``(2, N)`` of a ``(C, N)`` waveform (module docstring: channels)."""
    channels = waveform.shape[0]
    if channels == 2:
        return waveform
    if channels in _FOLDS:
        sides = []
        for sources in _FOLDS[channels]:
            weights = np.array([1.0] + [_SURROUND_WEIGHT] * (len(sources) - 1))
            sides.append(np.tensordot(weights / weights.sum(), waveform[list(sources)], axes=1))
        return np.stack(sides).astype(waveform.dtype)
    mono = waveform.mean(axis=0, keepdims=True)
    return np.repeat(mono, 2, axis=0)


def read_sound(where: Path | bytes, start: float, samples: int, rate: int) -> np.ndarray | None:
    """``(2, samples)`` float32 of the file's first audio track from ``start`` seconds at ``rate`` Hz (module
    docstring); None when the file has no audio track. Raises what PyAV raises for an unreadable file."""
    import av

    source = str(where) if isinstance(where, Path) else io.BytesIO(where)
    with av.open(source) as container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="fltp", rate=rate)  # keeps the track's channel layout
        pieces: list[np.ndarray] = []
        first: float | None = None
        for frame in container.decode(stream):
            if first is None and frame.time is not None:
                first = float(frame.time)
            pieces.extend(out.to_ndarray() for out in resampler.resample(frame))
        pieces.extend(out.to_ndarray() for out in resampler.resample(None))
    if not pieces:
        return None
    track = np.concatenate(pieces, axis=1).astype(np.float32)
    offset = int(round((start - (first or 0.0)) * rate))
    if offset < 0:  # the track starts after the first frame: silence before it
        track = np.pad(track, ((0, 0), (-offset, 0)))
        offset = 0
    clip = track[:, offset:offset + samples]
    if clip.shape[1] < samples:
        clip = np.pad(clip, ((0, 0), (0, samples - clip.shape[1])))
    return to_stereo(clip)


def span_samples(frames: int, stride: int, fps: float, rate: int) -> int:
    """Samples at ``rate`` of the span of ``frames`` frames taken every ``stride``-th at ``fps``: ``floor(F s / fps
    * rate)`` (as LTX-2's trainer and ``Cosmos3OmniPipeline`` count a clip's samples)."""
    return int(frames * stride / fps * rate + 1e-6)


__all__ = ["read_sound", "span_samples", "to_stereo"]
