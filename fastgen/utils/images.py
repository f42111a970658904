"""Image grids for sample logging: ``[-1, 1]`` tensors -> one PIL image (nearest-neighbour upscaled)."""

from __future__ import annotations

import math
from pathlib import Path

import torch


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """``(N, C, H, W)`` in ``[-1, 1]`` -> ``(N, H, W, C)`` uint8 in ``[0, 255]``."""
    return ((images.detach().float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()


def image_grid(images: torch.Tensor, nrow: int | None = None, upscale: int = 1, padding: int = 1):
    """Tile ``(N, C, H, W)`` images into one PIL image, ``nrow`` per row (default: square-ish)."""
    from PIL import Image

    pixels = to_uint8(images)
    n, h, w, c = pixels.shape
    nrow = nrow or max(1, int(math.ceil(math.sqrt(n))))
    rows = int(math.ceil(n / nrow))
    canvas = torch.full((rows * (h + padding) + padding, nrow * (w + padding) + padding, c), 255, dtype=torch.uint8)
    for i in range(n):
        r, col = divmod(i, nrow)
        y, x = padding + r * (h + padding), padding + col * (w + padding)
        canvas[y : y + h, x : x + w] = pixels[i]
    array = canvas.numpy()
    image = Image.fromarray(array[:, :, 0] if c == 1 else array, mode="L" if c == 1 else "RGB")
    if upscale > 1:
        image = image.resize((image.width * upscale, image.height * upscale), Image.NEAREST)
    return image


def scatter_plot(points: torch.Tensor, size: int = 256, extent: float = 3.0):
    """A 2-D point cloud rendered as a PIL image (for toy-data samples), no plotting library needed."""
    from PIL import Image, ImageDraw

    image = Image.new("L", (size, size), 255)
    draw = ImageDraw.Draw(image)
    pts = points.detach().float().cpu()
    scale = size / (2 * extent)
    for x, y in pts.tolist():
        px, py = (x + extent) * scale, (extent - y) * scale
        draw.point((px, py), fill=0)
    return image


def save_samples_image(samples: torch.Tensor, path: Path, nrow: int | None = None) -> Path:
    """Save samples as a PNG: an image grid for ``(N, C, H, W)``, a scatter plot for ``(N, 2)``."""
    from fastgen.utils.io import atomic_open

    if samples.dim() == 4:
        upscale = max(1, 64 // samples.shape[-1])
        image = image_grid(samples, nrow=nrow, upscale=upscale)
    elif samples.dim() == 2 and samples.shape[1] == 2:
        image = scatter_plot(samples)
    else:
        raise ValueError(f"cannot render samples of shape {tuple(samples.shape)} as an image")
    with atomic_open(path, "wb") as handle:
        image.save(handle, format="PNG")
    return path


# ---- videos ------------------------------------------------------------------------------------------------------
def video_grid_frames(videos: torch.Tensor, nrow: int | None = None, upscale: int = 1, padding: int = 1) -> list:
    """``(N, C, T, H, W)`` videos in ``[-1, 1]`` -> ``T`` PIL frames, each the grid of the N videos at that time."""
    if videos.dim() != 5:
        raise ValueError(f"expected videos of shape (N, C, T, H, W), got {tuple(videos.shape)}")
    return [image_grid(videos[:, :, t], nrow=nrow, upscale=upscale, padding=padding) for t in range(videos.shape[2])]


def save_gif(frames: list, path: Path, fps: float = 8.0) -> Path:
    """Write PIL frames as a looping GIF with Pillow alone (no moviepy / ffmpeg), atomically."""
    from fastgen.utils.io import atomic_open

    if not frames:
        raise ValueError("a GIF needs at least one frame")
    duration_ms = max(20, int(round(1000.0 / max(fps, 1e-6))))  # GIF delays are in 10 ms units; 20 ms minimum
    first, *rest = [frame.convert("RGB") for frame in frames]
    with atomic_open(path, "wb") as handle:
        first.save(handle, format="GIF", save_all=True, append_images=rest, duration=duration_ms, loop=0)
    return path


def save_samples_video(samples: torch.Tensor, path: Path, fps: float = 8.0, nrow: int | None = None) -> Path:
    """Save ``(N, C, T, H, W)`` samples as one GIF whose frames are grids of the N videos (small videos upscaled)."""
    upscale = max(1, 64 // samples.shape[-1])
    return save_gif(video_grid_frames(samples, nrow=nrow, upscale=upscale), path, fps=fps)
