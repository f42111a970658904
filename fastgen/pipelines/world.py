"""Video-to-world sampling (``fastgen.networks.conditioning_frames``): the conditioning image or clip as
``Cosmos2VideoToWorldPipeline`` prepares it (the samplers then call the network through
``fastgen.networks.conditioning_frames.WithConditioningFrames``).

The pipeline's ``prepare_latents``: the conditioning clip's ``n`` pixel frames (an image is one) are padded to the
sample's ``num_frames`` by repeating the last one (or cut to the last ``num_frames``), the whole clip is encoded
with the sample's generator (a posterior *sample*: the draw comes before the starting noise's, so the noise depends
on it), normalised with Wan's per-channel mean and std, and its first ``(n - 1) // k_t + 1`` latent frames are
the given ones (``k_t``: the VAE's temporal factor). The starting noise is drawn after, from the same generator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from fastgen.networks.conditioning_frames import encode_given_clips, temporal_factor
from fastgen.utils.errors import UsageError


def spatial_factor(vae: Any) -> int:
    """Pixels per latent along each spatial axis (``2 ** len(temperal_downsample)``, as the pipelines compute it)."""
    return 2 ** len(getattr(vae.config, "temperal_downsample", ()) or ())


def pad_clip(clip: torch.Tensor, num_frames: int) -> tuple[torch.Tensor, int]:
    """``(1, C, num_frames, H, W)`` pixels - ``clip`` (``(1, C, n, H, W)``) padded with its last frame, or its last
    ``num_frames`` - and the pixel frames that condition (``min(n, num_frames)``)."""
    frames = clip.shape[2]
    if frames >= num_frames:
        return clip[:, :, -num_frames:], num_frames
    return torch.cat([clip, clip[:, :, -1:].expand(-1, -1, num_frames - frames, -1, -1)], dim=2), frames


def conditioning_latents(codec: Any, clips: Sequence[torch.Tensor], num_frames: int,
                         generators: Sequence[torch.Generator]) -> tuple[torch.Tensor, int]:
    """``(B, C, F, H, W)`` normalised latents of the padded ``clips`` (pixels in ``[-1, 1]``, one ``(1, C, n, H, W)``
    clip per sample, all with the same ``n``), each a posterior sample drawn with its sample's generator, and how
    many of their latent frames are given (module docstring)."""
    factor = temporal_factor(codec.vae)
    padded = []
    for clip in clips:
        video, frames = pad_clip(clip, num_frames)
        padded.append((video, (frames - 1) // factor + 1))
    return encode_given_clips(codec, padded, generators)


def load_clip(path: str, height: int, width: int, prepare_image: Callable[..., torch.Tensor] | None = None
              ) -> torch.Tensor:
    """An image file or a video (MP4, GIF: every frame) as ``(1, C, n, H, W)`` pixels in ``[-1, 1]``, resized as
    the pipeline's ``VideoProcessor`` resizes (``preprocess`` / ``preprocess_video``). ``prepare_image``: how the
    family's pipeline prepares an ``image=`` instead (a codec's ``conditioning_image(image, height, width)``:
    Cosmos Predict 2.5 and Cosmos 3 resize it their own ways)."""
    from pathlib import Path

    from diffusers.video_processor import VideoProcessor
    from PIL import Image

    file = Path(path)
    if not file.is_file():
        raise UsageError(f"{path}: no such file")
    processor = VideoProcessor(vae_scale_factor=8)
    try:
        if file.suffix.lower() in (".mp4", ".mov", ".webm", ".gif"):
            import av

            with av.open(str(file)) as container:
                frames = [frame.to_image() for frame in container.decode(video=0)]
            if not frames:
                raise UsageError(f"{path}: the video has no frames")
            return processor.preprocess_video([frames], height, width)
        with Image.open(file) as image:
            rgb = image.convert("RGB")
        if prepare_image is not None:
            return prepare_image(rgb, height, width)
        return processor.preprocess(rgb, height, width).unsqueeze(2)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not an image or video this can read ({exc})") from None


__all__ = ["conditioning_latents", "load_clip", "pad_clip", "spatial_factor"]
