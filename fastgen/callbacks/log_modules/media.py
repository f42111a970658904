"""Small media helpers shared by ``WandbCallback`` and the log modules: WAV files (stdlib ``wave``), frame
sampling, tensor -> PIL conversion and PNG data URLs. Nothing here needs moviepy, soundfile or ffmpeg."""

from __future__ import annotations

import base64
import io
import wave
from pathlib import Path
from typing import Any

import torch


def save_wav(waveform: torch.Tensor, sample_rate: int, path: Path) -> Path:
    """Write a ``(T,)`` or ``(channels, T)`` waveform in ``[-1, 1]`` as 16-bit PCM WAV, atomically.

    Samples are clamped to ``[-1, 1]`` and scaled by 32767 (the largest 16-bit value), then interleaved by
    channel as the WAV format requires.
    """
    from fastgen.utils.io import atomic_open

    if int(sample_rate) <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    audio = waveform.detach().float().cpu()
    if audio.dim() == 1:
        audio = audio.unsqueeze(0)
    if audio.dim() != 2:
        raise ValueError(f"expected a (T,) or (channels, T) waveform, got {tuple(waveform.shape)}")
    pcm = (audio.clamp(-1, 1) * 32767.0).round().to(torch.int16).t().contiguous()  # (T, channels), interleaved
    with atomic_open(path, "wb") as handle:
        with wave.open(handle, "wb") as wav:
            wav.setnchannels(audio.shape[0])
            wav.setsampwidth(2)
            wav.setframerate(int(sample_rate))
            wav.writeframes(pcm.numpy().tobytes())
    return path


def frame_indices(num_frames: int, count: int) -> list[int]:
    """``count`` frame indices spread uniformly over ``[0, num_frames - 1]``, first and last included."""
    if num_frames <= 0:
        return []
    count = max(1, min(int(count), num_frames))
    if count == 1:
        return [num_frames // 2]
    return [round(i * (num_frames - 1) / (count - 1)) for i in range(count)]


def to_pil(image: torch.Tensor, min_size: int = 0) -> Any:
    """One ``(C, H, W)`` image in ``[-1, 1]`` -> an RGB PIL image, nearest-upscaled to at least ``min_size``."""
    from PIL import Image

    from fastgen.utils.images import to_uint8

    pixels = to_uint8(image.unsqueeze(0))[0].numpy()  # (H, W, C)
    if pixels.shape[2] == 1:
        pil = Image.fromarray(pixels[:, :, 0]).convert("RGB")
    else:
        pil = Image.fromarray(pixels[:, :, :3])
    if min_size and min(pil.size) < min_size:
        factor = -(-min_size // min(pil.size))
        pil = pil.resize((pil.width * factor, pil.height * factor), Image.NEAREST)
    return pil


def png_data_url(pil_image: Any) -> str:
    """A PIL image as an inline ``data:image/png;base64,...`` URL (the chat-completions image format)."""
    buffer = io.BytesIO()
    pil_image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
