"""VipeLogger: trajectory plots and action overlays from synthetic circle poses; the pose conventions."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import ImageChops

from fastgen.callbacks.log_modules.base import MediaEntry
from fastgen.callbacks.log_modules.vipe import BACKGROUND, VipeLogger, camera_to_world, centers_and_forward, path_length
from fastgen_testing import circle_poses

FRAMES = 16


def posed_entry(index: int = 0, kind: str = "video", with_actions: bool = True) -> MediaEntry:
    g = torch.Generator().manual_seed(index)
    data = torch.rand(3, FRAMES, 8, 8, generator=g) * 2 - 1 if kind == "video" else torch.rand(3, 8, 8, generator=g) * 2 - 1
    meta = {"camera_poses": circle_poses(FRAMES, radius=2.0, phase=0.5 * index),
            "intrinsics": torch.tensor([[4.0, 0.0, 4.0], [0.0, 4.0, 4.0], [0.0, 0.0, 1.0]])}
    if with_actions:
        meta["actions"] = torch.stack([torch.tensor([math.cos(t), math.sin(t)]) for t in range(FRAMES)])
    return MediaEntry(kind=kind, data=data, iteration=5, index=index, metadata=meta)


def ink(image: Image.Image) -> int:
    """Pixels that differ from the white background."""
    pixels = np.asarray(image.convert("RGB"))
    return int((pixels != np.array(BACKGROUND, dtype=pixels.dtype)).any(axis=2).sum())


def test_geometry_of_the_circle() -> None:
    c2w = camera_to_world(circle_poses(FRAMES, radius=2.0, height=0.5))
    centers, forward = centers_and_forward(c2w)
    assert torch.allclose(centers[:, [0, 2]].norm(dim=1), torch.full((FRAMES,), 2.0, dtype=torch.float64))
    assert torch.allclose(centers[:, 1], torch.full((FRAMES,), -0.5, dtype=torch.float64))
    # every camera looks at the circle's centre: forward is -centre (in the x-z plane), unit length
    assert torch.allclose(forward, -centers * torch.tensor([1.0, 0, 1.0], dtype=torch.float64) / 2.0, atol=1e-6)
    # the polygon through 16 points on a circle of radius 2: 15 chords of length 2 * 2 sin(pi / 16)
    assert path_length(centers) == pytest.approx(15 * 4 * math.sin(math.pi / FRAMES), rel=1e-6)


def test_world_to_camera_is_inverted() -> None:
    c2w = circle_poses(FRAMES).double()
    w2c = torch.linalg.inv(c2w)
    assert torch.allclose(camera_to_world(w2c, "w2c"), c2w, atol=1e-6)
    with pytest.raises(ValueError, match="pose_convention"):
        camera_to_world(c2w, "gl")


def test_process_logs_a_trajectory_plot_and_action_frames(tmp_path: Path) -> None:
    module = VipeLogger(num_frames=4, frame_size=64, plot_size=256)
    module.setup(tmp_path, is_rank0=True)
    entries = [posed_entry(0), posed_entry(1), MediaEntry(kind="video", data=torch.zeros(3, FRAMES, 8, 8), iteration=5)]
    result = module.process(entries, iteration=5)
    assert result is not None and set(result) == {"trajectory", "action_frames", "loss_dict"}
    plot = result["trajectory"]
    assert plot.size == (512, 256)
    left, right = plot.crop((0, 0, 256, 256)), plot.crop((256, 0, 512, 256))
    assert ink(left) > 500 and ink(right) > 100  # both panels have content
    # the top-down panel of a circle is as wide as tall (equal aspect): the coloured (non-grey) pixels' box
    coloured = [(x, y) for y in range(20, 256) for x in range(256)
                if len(set(left.getpixel((x, y)))) > 1]  # grey text and markers have r == g == b
    xs, ys = [p[0] for p in coloured], [p[1] for p in coloured]
    width, height = max(xs) - min(xs), max(ys) - min(ys)
    assert abs(width - height) <= 0.1 * max(width, height)
    strips = result["action_frames"]
    assert len(strips) == 2  # only the posed samples
    assert strips[0].size == (4 * 64 + 3 * 2, 64)
    assert ink(strips[0]) > 0
    loss = result["loss_dict"]
    assert loss["posed_samples"] == 2.0
    assert loss["path_length"] == pytest.approx(15 * 4 * math.sin(math.pi / FRAMES), rel=1e-5)
    saved = sorted(p.name for p in (tmp_path / "samples" / "vipe").iterdir())
    assert saved == ["iter_0000005_actions_0.png", "iter_0000005_actions_1.png", "iter_0000005_trajectory.png"]


def test_the_action_is_drawn_over_the_frame() -> None:
    from fastgen.callbacks.log_modules.media import to_pil
    from fastgen.callbacks.log_modules.vipe import action_frame

    frame = to_pil(torch.full((3, 8, 8), -1.0), min_size=64)  # black
    right = action_frame(frame, torch.tensor([1.0, 0.0]), t=0)
    up = action_frame(frame, torch.tensor([0.0, 1.0]), t=0)
    # the arrow is red: right of the centre for +a_0, above the centre for +a_1
    assert right.getpixel((32 + 10, 32))[0] > 200 and right.getpixel((32, 32 - 10))[0] < 50
    assert up.getpixel((32, 32 - 10))[0] > 200 and up.getpixel((32 + 10, 32))[0] < 50
    assert ink(right) > 0 and not np.array_equal(np.asarray(frame), np.asarray(right))


def test_pose_conventions_give_the_same_plot(tmp_path: Path) -> None:
    c2w = posed_entry(0)
    w2c = posed_entry(0)
    w2c.metadata["camera_poses"] = torch.linalg.inv(c2w.metadata["camera_poses"].double())
    a = VipeLogger(save_local=False).process([c2w], 1)["trajectory"]
    b = VipeLogger(pose_convention="w2c", save_local=False).process([w2c], 1)["trajectory"]
    assert ImageChops.difference(a, b).getbbox() is None


def test_entries_without_poses_log_nothing_and_images_get_one_frame() -> None:
    module = VipeLogger(save_local=False)
    assert module.process([MediaEntry(kind="image", data=torch.zeros(3, 8, 8), iteration=1)], 1) is None
    result = module.process([posed_entry(0, kind="image", with_actions=False)], 1)
    assert len(result["action_frames"]) == 1 and result["action_frames"][0].size == (128, 128)
