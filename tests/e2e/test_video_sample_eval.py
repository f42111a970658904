"""Videos through ``fastgen sample`` / ``fastgen eval`` and ``train --eval-samples``: a video run's samples are
stored as uint8 (N, F, H, W, C) with a GIF and an MP4 of the grid; moving-digits videos are recognised and scored
by per-frame FD, accuracy averaged over frames and temporal consistency, the same from a file as in memory; a
causal video recipe trained with ``--eval-samples`` writes those scores for the student and its teacher."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from fastgen_testing import run_cli

from fastgen.datasets.moving_digits import MovingDigitsDataset
from fastgen.evaluation.evaluate import detect_dataset, evaluate_arrays, load_sample_files
from fastgen.evaluation.moving_digits import score_videos
from fastgen.evaluation.sampling import dataset_of_config, sample_arrays, save_samples
from fastgen.utils.errors import UsageError


def real_videos(n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    data = MovingDigitsDataset("val")
    batch = data.get_batch(torch.arange(n))
    return batch["real"], batch["condition"]


def test_videos_are_stored_frame_major_with_a_gif_and_an_mp4(tmp_path: Path) -> None:
    from PIL import Image

    from fastgen.pipelines.media import read_mp4

    videos, labels = real_videos(20)
    npz, previews = save_samples(tmp_path / "v.npz", videos, labels, dataset="moving_digits")
    assert [p.suffix for p in previews] == [".gif", ".mp4"] and all(p.is_file() for p in previews)
    with np.load(npz, allow_pickle=False) as data:
        arr = data["arr_0"]
        assert arr.dtype == np.uint8 and arr.shape == (20, 8, 8, 16, 1)
        assert str(data["fastgen_dataset"]) == "moving_digits" and data["arr_1"].tolist() == labels.tolist()
    # frame f of video i is the video's frame f, as an image is stored
    expected = ((videos[3, 0, 5].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
    assert np.array_equal(arr[3, 5, :, :, 0], expected)
    colour = torch.rand(2, 3, 4, 6, 10, generator=torch.Generator().manual_seed(0)) * 2 - 1  # (N, C, F, H, W)
    stored = sample_arrays(colour, None)["arr_0"]
    assert stored.shape == (2, 4, 6, 10, 3)
    expected = ((colour[1, :, 2].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).numpy()
    assert np.array_equal(stored[1, 2], expected)
    with Image.open(previews[0]) as gif:
        assert gif.n_frames == 8
    assert read_mp4(previews[1]).shape[0] == 8


def test_moving_digits_files_are_detected_and_scored_as_in_memory(tmp_path: Path) -> None:
    videos, labels = real_videos(40)
    arrays = sample_arrays(videos, labels)
    assert detect_dataset(arrays["arr_0"]) == "moving_digits"
    with pytest.raises(UsageError, match="moving_digits"):
        detect_dataset(arrays["arr_0"][:, 0], hint="moving_digits")
    from_file = evaluate_arrays(arrays["arr_0"], arrays["arr_1"], "moving_digits")
    rounded = ((videos.clamp(-1, 1) + 1) * 127.5).round() / 127.5 - 1  # what the uint8 file holds
    in_memory = score_videos(rounded, labels.numpy())
    assert from_file["dataset"] == "moving_digits" and from_file["num_samples"] == 40
    for key in ("fd_per_frame", "accuracy", "temporal_consistency"):
        assert from_file[key] == pytest.approx(in_memory[key], rel=1e-4, abs=1e-4), key
    unlabelled = evaluate_arrays(arrays["arr_0"], None, "moving_digits")
    assert "accuracy" not in unlabelled and unlabelled["fd_per_frame"] == pytest.approx(from_file["fd_per_frame"])
    # shuffled frames: the same per-frame digits, but a video's label changes over time
    mixed = videos.clone()
    mixed[:, :, 4:] = videos[torch.roll(torch.arange(40), 1), :, 4:]
    worse = evaluate_arrays(sample_arrays(mixed, labels)["arr_0"], labels.numpy(), "moving_digits")
    assert worse["temporal_consistency"] < from_file["temporal_consistency"] - 0.3


def test_the_moving_digits_recipes_name_their_data_set() -> None:
    from fastgen.configs.config_utils import load_config

    for recipe in ("Digits/config_causal_sft_moving_digits", "Digits/config_self_forcing_moving_digits"):
        assert dataset_of_config(load_config(recipe)) == "moving_digits"


TINY_CAUSAL_SFT = '''
from fastgen.configs.experiments.Digits.config_causal_sft_moving_digits import create_config as base
from fastgen.configs.net_dit import causal_video_dit


def create_config():
    config = base()
    config.model.net = causal_video_dit(hidden_size=32, depth=2, num_heads=2)
    config.model.sample_steps = 2
    config.trainer.max_iter = 2
    config.trainer.save_ckpt_iter = 2
    config.trainer.callbacks = {}
    config.dataloader_train.batch_size = 4
    config.log_config.name = "tiny_causal_sft"
    return config
'''


@pytest.mark.slow
def test_a_video_run_samples_evaluates_and_reports_its_scores(tmp_path: Path) -> None:
    """``train --eval-samples`` on a video recipe writes the three video scores; ``sample`` then writes the npz,
    GIF and MP4 of the run's videos, and ``eval`` scores the npz with the same metrics."""
    recipe = tmp_path / "tiny_causal_sft.py"
    recipe.write_text(TINY_CAUSAL_SFT)
    env = {"FASTGEN_OUTPUT_ROOT": str(tmp_path / "out"), "WANDB_MODE": "disabled"}
    trained = run_cli("train", "-c", str(recipe), "--eval-samples", "20", cwd=tmp_path, env=env, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "fd_per_frame" in trained.stdout and "temporal_consistency" in trained.stdout
    run_dir = tmp_path / "out" / "fastgen" / "moving_digits" / "tiny_causal_sft"
    record = json.loads((run_dir / "evaluation.json").read_text())
    assert record["dataset"] == "moving_digits"
    assert {"fd_per_frame", "accuracy", "temporal_consistency"} <= set(record["results"]["model"])
    out = tmp_path / "videos.npz"
    sampled = run_cli("sample", str(run_dir), "-n", "12", "--steps", "2", "--out", str(out), cwd=tmp_path, env=env)
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert out.with_suffix(".gif").is_file() and out.with_suffix(".mp4").is_file()
    assert "mp4" in sampled.stdout and "gif" in sampled.stdout
    assert load_sample_files(out).arr_0.shape == (12, 8, 8, 16, 1)
    evaluated: subprocess.CompletedProcess = run_cli("eval", str(out), cwd=tmp_path, env=env)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "fd_per_frame" in evaluated.stdout and "temporal_consistency" in evaluated.stdout
