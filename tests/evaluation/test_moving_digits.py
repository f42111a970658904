"""Moving digits (``fastgen.datasets.moving_digits``) and their scores (``fastgen.evaluation.moving_digits``): the
videos are the split's digits gliding one pixel per frame with reflection, deterministic per index; the crop finds
the drawn digit; real videos score near the floor and noise, shuffled frames or changing labels do not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastgen.datasets.digits import DigitsDataset
from fastgen.datasets.moving_digits import MovingDigitsDataset, glide_offsets
from fastgen.evaluation.moving_digits import crop_digits, score_videos


def test_offsets_glide_one_pixel_per_frame_and_reflect() -> None:
    offsets = glide_offsets(torch.tensor([6, 1, 0]), torch.tensor([1, -1, 1]), 6, 8)
    assert offsets.tolist() == [[6, 7, 8, 7, 6, 5], [1, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]]


def test_videos_are_the_splits_digits_at_their_offsets_and_deterministic() -> None:
    data = MovingDigitsDataset("val", frames=8, width=16, repeats=2)
    digits = DigitsDataset("val")
    assert len(data) == 2 * len(digits)
    batch = data.get_batch(torch.arange(len(data)))
    videos = batch["real"]
    assert videos.shape == (len(data), 1, 8, 8, 16) and videos.min() >= -1 and videos.max() <= 1
    for i in (0, 5, len(data) - 1):
        source = int(data.source[i])
        assert int(batch["condition"][i]) == int(digits.labels[source])
        for f in range(8):
            x = int(data.offsets[i, f])
            torch.testing.assert_close(videos[i, :, f, :, x:x + 8], digits.images[source])
            rest = torch.cat([videos[i, :, f, :, :x], videos[i, :, f, :, x + 8:]], dim=-1)
            assert bool((rest == -1).all())
        steps = (data.offsets[i, 1:] - data.offsets[i, :-1]).abs()
        assert bool((steps == 1).all())
    again = MovingDigitsDataset("val", frames=8, width=16, repeats=2).get_batch(torch.arange(4))["real"]
    assert torch.equal(again, videos[:4])
    assert torch.equal(data[3]["real"], videos[3])


def test_the_crop_finds_the_drawn_digit() -> None:
    data = MovingDigitsDataset("train", frames=4)
    batch = data.get_batch(torch.arange(400))
    crops = crop_digits(batch["real"])
    digits = data.digits[data.source[:400]]
    exact = (crops - digits[:, None]).abs().amax(dim=(2, 3, 4)) == 0
    assert float(exact.float().mean()) > 0.85  # the rest: a digit with blank edge columns, one column off
    ink_kept = ((crops + 1).sum(dim=(2, 3, 4)) - (digits[:, None] + 1).sum(dim=(2, 3, 4))).abs()
    assert float(ink_kept.max()) < 1e-4  # every crop holds all of the digit's ink


def test_scores_real_videos_near_the_floor_and_separate_bad_ones() -> None:
    data = MovingDigitsDataset("train", frames=4)
    batch = data.get_batch(torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[:1000])
    videos, labels = batch["real"], batch["condition"].numpy()
    real = score_videos(videos, labels)
    assert real["fd_per_frame"] < 5 and real["accuracy"] > 0.98 and real["temporal_consistency"] > 0.97
    noise = score_videos(torch.rand_like(videos) * 2 - 1, labels)
    assert noise["fd_per_frame"] > 100 and noise["accuracy"] < 0.3
    # each frame a different video's digit: per-frame digits stay real, the label does not hold across frames
    mixed = videos.clone()
    for f in range(1, 4):
        mixed[:, :, f] = videos.roll(f * 7, dims=0)[:, :, f]
    shuffled = score_videos(mixed, labels)
    assert shuffled["fd_per_frame"] < 5 and shuffled["temporal_consistency"] < 0.2


@pytest.mark.slow
def test_the_wan_moving_digits_recipe_trains_and_samples_videos(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """``Digits/config_sft_wan_moving_digits`` through the trainer for 3 iterations, then 2 sampled videos of the
    recipe's shape that the scorer takes."""
    from fastgen.configs.config_utils import load_config
    from fastgen.trainer import Trainer

    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    config = load_config("Digits/config_sft_wan_moving_digits")
    config.trainer.max_iter = 3
    config.trainer.save_ckpt_iter = 3
    config.dataloader_train.batch_size = 4
    trainer = Trainer(config)
    model = trainer.run()
    # the diffusers-backed network draws pixels here: the samples at the end of training are logged as a GIF
    assert (Path(trainer.run_dir) / "samples" / "iter_0000003.gif").is_file()
    videos, labels = model.sample(2, generator=torch.Generator().manual_seed(0), steps=2)
    assert videos.shape == (2, 1, 8, 8, 16) and torch.isfinite(videos).all()
    assert set(score_videos(videos.clamp(-1, 1), labels.numpy())) >= {"fd_per_frame", "accuracy",
                                                                     "temporal_consistency"}
