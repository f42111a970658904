"""Writing samples as files people open: PNG images (Pillow) and MP4 videos (PyAV, whose wheels carry FFmpeg, so
nothing has to be installed on the system). Each file is written beside its target and renamed onto it."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_png(path: Path, image: np.ndarray) -> None:
    """``image``: ``(H, W, C)`` uint8, C = 1 or 3."""
    from PIL import Image

    from fastgen.utils.io import atomic_open

    pixels = image[..., 0] if image.shape[-1] == 1 else image
    with atomic_open(path, "wb") as handle:
        Image.fromarray(np.ascontiguousarray(pixels)).save(handle, format="PNG")


def write_mp4(path: Path, frames: np.ndarray, fps: int = 16, crf: int = 12, audio: np.ndarray | None = None,
              sample_rate: int | None = None) -> None:
    """``frames``: ``(F, H, W, C)`` uint8, C = 1 or 3; H.264 in yuv420p (what players expect), which needs even
    sizes: an odd edge is padded by repeating its last row / column. ``crf`` 12: visually lossless (x264's default
    23 visibly softens samples one wants to judge). ``audio``: a ``(channels, samples)`` (or ``(samples,)``)
    waveform in ``[-1, 1]`` at ``sample_rate`` Hz, muxed as an AAC track (an audio-visual model's sound)."""
    import av

    from fastgen.utils.io import atomic_open

    if frames.shape[-1] == 1:
        frames = np.repeat(frames, 3, axis=-1)
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    if audio is not None:
        if not sample_rate or sample_rate <= 0:
            raise ValueError("an MP4 audio track needs a positive sample_rate")
        audio = np.atleast_2d(np.asarray(audio, dtype=np.float32)).clip(-1, 1)
        if audio.shape[0] > 2:
            raise ValueError(f"an audio track of {audio.shape[0]} channels; expected mono or stereo (channels, samples)")
    with atomic_open(path, "wb") as handle:
        with av.open(handle, mode="w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=fps)
            stream.width, stream.height = frames.shape[2], frames.shape[1]
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": str(crf)}
            sound = None
            if audio is not None:
                sound = container.add_stream("aac", rate=int(sample_rate))
                sound.layout = "mono" if audio.shape[0] == 1 else "stereo"
            for frame in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
            if sound is not None:
                chunk = 1024  # AAC encodes 1024-sample frames
                for start in range(0, audio.shape[1], chunk):
                    piece = np.ascontiguousarray(audio[:, start:start + chunk])
                    block = av.AudioFrame.from_ndarray(piece, format="fltp", layout=sound.layout.name)
                    block.sample_rate, block.pts = int(sample_rate), start
                    for packet in sound.encode(block):
                        container.mux(packet)
                for packet in sound.encode():
                    container.mux(packet)


def read_mp4(path: Path) -> np.ndarray:
    """The frames of a video file as ``(F, H, W, 3)`` uint8."""
    import av

    with av.open(str(path)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


def read_mp4_audio(path: Path) -> tuple[np.ndarray, int]:
    """The sound track of a video file as ``((channels, samples) float32, sample_rate)``."""
    import av

    with av.open(str(path)) as container:
        if not container.streams.audio:
            raise ValueError(f"{path} has no audio track")
        frames = [frame.to_ndarray() for frame in container.decode(audio=0)]
        rate = container.streams.audio[0].rate
    return np.concatenate(frames, axis=1).astype(np.float32), int(rate)


__all__ = ["read_mp4", "read_mp4_audio", "write_mp4", "write_png"]
