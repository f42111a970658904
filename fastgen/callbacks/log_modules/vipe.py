"""VipeLogger: camera trajectories and action overlays for models trained on camera-pose batches.

Entries qualify when their ``metadata`` (copied by ``WandbCallback`` from the batch keys in its
``metadata_keys``) holds camera poses; per sample:

* ``camera_poses`` - ``(T, 4, 4)`` extrinsics, **camera-to-world** by default (``pose_convention="c2w"``: the
  camera centre is ``P[:3, 3]``), or world-to-camera with ``pose_convention="w2c"`` (inverted first:
  ``R^T``, centre ``-R^T t``). Cameras follow the OpenCV convention (ViPE's output): x right, y down, z forward,
  so a camera's viewing direction in the world is the third column of its camera-to-world rotation,
  ``R e_z``;
* ``intrinsics`` - optional ``(3, 3)`` or ``(T, 3, 3)`` ``K``; the horizontal field of view
  ``2 atan(c_x / f_x)`` (``c_x`` = half the image width for a centred principal point) is drawn as a wedge at the
  first camera;
* ``actions`` - optional ``(T, D)`` per-frame action vectors.

Logged (under the module name, ``vipe`` in ``VIPE_CALLBACK``):

* ``vipe/trajectory`` - one image with two panels: top-down ``x`` / ``z`` (world units, equal aspect) with each
  trajectory as a polyline, a dot per camera, an arrow along each camera's forward direction projected on the
  ``x``-``z`` plane, start (circle) and end (square) markers; and the height ``height_sign * y`` per frame
  (``height_sign = -1`` turns OpenCV's y-down into height);
* ``vipe/action_frames`` - for video samples, ``num_frames`` uniformly spaced frames per sample side by side, each
  with its action drawn over it: the values as text and the first two components as an arrow from the frame
  centre (``+a_0`` right, ``+a_1`` up; an action of norm 1 spans 40 % of half the frame);
* ``vipe/path_length`` (scalar) - mean camera path length ``sum_t ||c_{t+1} - c_t||`` over the posed samples;
* ``vipe/posed_samples`` (scalar) - how many samples had poses.

Drawn with Pillow only (no plotting library); local copies go to ``<run dir>/samples/vipe/``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import torch

from fastgen.callbacks.log_modules.base import LogModule, MediaEntry

COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
          (227, 119, 194), (127, 127, 127)]
BACKGROUND = (255, 255, 255)


def camera_to_world(poses: torch.Tensor, convention: str = "c2w") -> torch.Tensor:
    """``(T, 4, 4)`` poses in either convention -> camera-to-world, float64."""
    poses = torch.as_tensor(poses).detach().double().cpu()
    if poses.dim() != 3 or poses.shape[-2:] != (4, 4):
        raise ValueError(f"camera poses must have shape (T, 4, 4), got {tuple(poses.shape)}")
    if convention == "c2w":
        return poses
    if convention != "w2c":
        raise ValueError(f"pose_convention must be 'c2w' or 'w2c', got {convention!r}")
    rot_t = poses[:, :3, :3].transpose(1, 2)
    out = torch.zeros_like(poses)
    out[:, :3, :3] = rot_t
    out[:, :3, 3] = -(rot_t @ poses[:, :3, 3:]).squeeze(-1)
    out[:, 3, 3] = 1.0
    return out


def centers_and_forward(c2w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Camera centres ``(T, 3)`` and unit viewing directions ``(T, 3)`` (OpenCV: the camera's +z axis)."""
    forward = c2w[:, :3, 2]
    return c2w[:, :3, 3], forward / forward.norm(dim=1, keepdim=True).clamp_min(1e-12)


def path_length(centers: torch.Tensor) -> float:
    return float((centers[1:] - centers[:-1]).norm(dim=1).sum()) if len(centers) > 1 else 0.0


def _arrow(draw: Any, start: tuple[float, float], end: tuple[float, float], color: tuple[int, int, int], width: int = 2) -> None:
    draw.line([start, end], fill=color, width=width)
    dx, dy = end[0] - start[0], end[1] - start[1]
    length = math.hypot(dx, dy)
    if length < 1e-6:
        return
    ux, uy = dx / length, dy / length
    head = min(8.0, 0.4 * length + 3)
    left = (end[0] - head * ux + 0.5 * head * uy, end[1] - head * uy - 0.5 * head * ux)
    right = (end[0] - head * ux - 0.5 * head * uy, end[1] - head * uy + 0.5 * head * ux)
    draw.polygon([end, left, right], fill=color)


def trajectory_plot(trajectories: list[tuple[torch.Tensor, torch.Tensor]], height_sign: float = -1.0,
                    fov: float | None = None, size: int = 320) -> Any:
    """Two panels side by side: top-down ``x``/``z`` with forward arrows, and height per frame."""
    from PIL import Image, ImageDraw

    margin, title = 24, 16
    image = Image.new("RGB", (2 * size, size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    draw.text((margin, 4), "top-down: x (right) / z (up)", fill=(0, 0, 0))
    draw.text((size + margin, 4), f"height ({'-y' if height_sign < 0 else 'y'}) per frame", fill=(0, 0, 0))
    draw.line([(size, 0), (size, size)], fill=(200, 200, 200))

    # top-down panel: equal aspect, fitted to every trajectory
    xz = torch.cat([c[:, [0, 2]] for c, _ in trajectories])
    lo, hi = xz.min(dim=0).values, xz.max(dim=0).values
    span = float((hi - lo).max().clamp_min(1e-6))
    mid = (lo + hi) / 2
    scale = (size - 2 * margin - title) / (span * 1.2)
    arrow_len = 0.1 * span

    def top(x: float, z: float) -> tuple[float, float]:
        return (size / 2 + (x - float(mid[0])) * scale, (size + title) / 2 - (z - float(mid[1])) * scale)

    for k, (centers, forward) in enumerate(trajectories):
        color = COLORS[k % len(COLORS)]
        points = [top(float(c[0]), float(c[2])) for c in centers]
        if len(points) > 1:
            draw.line(points, fill=color, width=2)
        for c, f, p in zip(centers, forward, points):
            fxz = torch.stack([f[0], f[2]])
            norm = float(fxz.norm())
            if norm > 1e-6:
                end = top(float(c[0] + arrow_len * f[0] / norm), float(c[2] + arrow_len * f[2] / norm))
                _arrow(draw, p, end, color, width=1)
            draw.ellipse([p[0] - 2, p[1] - 2, p[0] + 2, p[1] + 2], fill=color)
        sx, sy = points[0]
        draw.ellipse([sx - 5, sy - 5, sx + 5, sy + 5], outline=(0, 0, 0), width=2)
        ex, ey = points[-1]
        draw.rectangle([ex - 5, ey - 5, ex + 5, ey + 5], outline=(0, 0, 0), width=2)
        if fov is not None and k == 0:
            f0 = forward[0]
            angle = math.atan2(float(f0[2]), float(f0[0]))
            reach = 2.5 * arrow_len
            for side in (-1, 1):
                a = angle + side * fov / 2
                end = top(float(centers[0][0]) + reach * math.cos(a), float(centers[0][2]) + reach * math.sin(a))
                draw.line([points[0], end], fill=(120, 120, 120), width=1)

    # height panel: frame index -> height_sign * y
    heights = [height_sign * c[:, 1] for c, _ in trajectories]
    all_h = torch.cat(heights)
    h_lo, h_hi = float(all_h.min()), float(all_h.max())
    h_span = max(h_hi - h_lo, 1e-6)
    n_max = max(len(h) for h in heights)
    x0, x1 = size + margin, 2 * size - margin
    y0, y1 = margin + title, size - margin
    draw.rectangle([x0, y0, x1, y1], outline=(200, 200, 200))
    draw.text((x0, y1 + 4), f"{h_lo:.2f} .. {h_hi:.2f}", fill=(80, 80, 80))
    for k, h in enumerate(heights):
        color = COLORS[k % len(COLORS)]
        pts = [(x0 + (x1 - x0) * (t / max(n_max - 1, 1)), y1 - (y1 - y0) * ((float(v) - h_lo) / h_span if h_hi > h_lo else 0.5))
               for t, v in enumerate(h)]
        if len(pts) > 1:
            draw.line(pts, fill=color, width=2)
        for p in pts:
            draw.ellipse([p[0] - 2, p[1] - 2, p[0] + 2, p[1] + 2], fill=color)
    return image


def action_frame(frame: Any, action: torch.Tensor | None, t: int) -> Any:
    """A copy of PIL ``frame`` with frame index ``t`` and ``action`` drawn over it (text, and an arrow for the
    first two components: ``+a_0`` right, ``+a_1`` up, norm 1 = 40 % of half the frame)."""
    from PIL import ImageDraw

    image = frame.convert("RGB").copy()
    draw = ImageDraw.Draw(image)
    values = [] if action is None else [float(v) for v in torch.as_tensor(action).reshape(-1)[:4]]
    text = f"t={t}" + (" a=[" + ", ".join(f"{v:+.2f}" for v in values) + "]" if values else "")
    box = draw.textbbox((2, 2), text)
    draw.rectangle([0, 0, box[2] + 2, box[3] + 2], fill=(0, 0, 0))
    draw.text((2, 2), text, fill=(255, 255, 0))
    if len(values) >= 1:
        ax, ay = values[0], values[1] if len(values) > 1 else 0.0
        cx, cy = image.width / 2, image.height / 2
        reach = 0.4 * min(image.width, image.height) / 2
        end = (cx + reach * ax, cy - reach * ay)
        _arrow(draw, (cx, cy), end, (255, 40, 40), width=3)
        draw.ellipse([cx - 3, cy - 3, cx + 3, cy + 3], fill=(255, 40, 40))
    return image


class VipeLogger(LogModule):
    def __init__(self, pose_convention: Literal["c2w", "w2c"] = "c2w", height_sign: float = -1.0,
                 num_frames: int = 4, max_entries: int = 4, plot_size: int = 320, frame_size: int = 128,
                 pose_key: str = "camera_poses", intrinsics_key: str = "intrinsics", action_key: str = "actions",
                 save_local: bool = True) -> None:
        if pose_convention not in ("c2w", "w2c"):
            raise ValueError(f"pose_convention must be 'c2w' or 'w2c', got {pose_convention!r}")
        self.pose_convention = pose_convention
        self.height_sign = float(height_sign)
        self.num_frames = int(num_frames)
        self.max_entries = int(max_entries)
        self.plot_size = int(plot_size)
        self.frame_size = int(frame_size)
        self.pose_key, self.intrinsics_key, self.action_key = pose_key, intrinsics_key, action_key
        self.save_local = save_local

    def process(self, entries: list[MediaEntry], iteration: int) -> dict[str, Any] | None:
        from fastgen.callbacks.log_modules.media import frame_indices, to_pil

        posed = [e for e in entries if e.metadata.get(self.pose_key) is not None][: max(self.max_entries, 0)]
        if not posed:
            return None
        trajectories = [centers_and_forward(camera_to_world(e.metadata[self.pose_key], self.pose_convention))
                        for e in posed]
        plot = trajectory_plot(trajectories, self.height_sign, self._fov(posed[0]), self.plot_size)
        strips = []
        for entry in posed:
            actions = entry.metadata.get(self.action_key)
            if entry.kind == "video":
                frames = [(t, entry.data[:, t]) for t in frame_indices(entry.data.shape[1], self.num_frames)]
            elif entry.kind == "image":
                frames = [(0, entry.data)]
            else:
                continue
            tiles = [action_frame(to_pil(img, self.frame_size), None if actions is None else actions[min(t, len(actions) - 1)], t)
                     for t, img in frames]
            strips.append(_hstack(tiles))
        result: dict[str, Any] = {
            "trajectory": plot,
            "loss_dict": {"path_length": sum(path_length(c) for c, _ in trajectories) / len(trajectories),
                          "posed_samples": float(len(posed))},
        }
        if strips:
            result["action_frames"] = strips
        if self.save_local and self.run_dir is not None:
            self._save(plot, strips, iteration)
        return result

    def _fov(self, entry: MediaEntry) -> float | None:
        k = entry.metadata.get(self.intrinsics_key)
        if k is None:
            return None
        k = torch.as_tensor(k).double().reshape(-1, 3, 3)[0]
        fx, cx = float(k[0, 0]), float(k[0, 2])
        return 2 * math.atan(cx / fx) if fx > 0 and cx > 0 else None

    def _save(self, plot: Any, strips: list[Any], iteration: int) -> None:
        from fastgen.utils.io import atomic_open

        folder = Path(self.run_dir or ".") / "samples" / "vipe"
        images = [(f"iter_{iteration:07d}_trajectory.png", plot)]
        images += [(f"iter_{iteration:07d}_actions_{k}.png", s) for k, s in enumerate(strips)]
        for name, image in images:
            with atomic_open(folder / name, "wb") as handle:
                image.save(handle, format="PNG")


def _hstack(images: list[Any]) -> Any:
    from PIL import Image

    width = sum(im.width for im in images) + 2 * (len(images) - 1)
    height = max(im.height for im in images)
    canvas = Image.new("RGB", (width, height), BACKGROUND)
    x = 0
    for im in images:
        canvas.paste(im, (x, 0))
        x += im.width + 2
    return canvas
