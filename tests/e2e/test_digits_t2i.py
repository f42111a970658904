"""The digits text-to-image pipeline that ships with fastgen (issue 34, point 7): a diffusers folder of a few MB
that diffusers loads and runs, whose teacher draws the digit a prompt names; the DMD2 recipe distills it and
the student exports to a pipeline diffusers runs in one step."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastgen_testing import run_in_process as fastgen

from fastgen.configs.experiments.Digits.config_sft_t2i_digits import shipped_pipeline

FOLDER = Path(shipped_pipeline()).resolve()
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def digits_of(folder: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    from diffusers import DiffusionPipeline

    call = json.loads((folder / "fastgen_export.json").read_text())["call"]
    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    prompts = [f"a handwritten {w}" for w in WORDS for _ in range(n)]
    out = pipe(prompts, generator=[torch.Generator().manual_seed(i) for i in range(len(prompts))], height=8, width=8,
               output_type="np", **call).images
    return (out.mean(-1) * 255).round().astype(np.uint8), np.repeat(np.arange(10), n)


def test_the_shipped_pipeline_is_small_and_its_teacher_draws_the_named_digit() -> None:
    from fastgen.evaluation.digits import classifier_accuracy

    size = sum(f.stat().st_size for f in FOLDER.rglob("*") if f.is_file())
    assert size < 10 * 2**20, size
    images, labels = digits_of(FOLDER, 5)
    assert images.shape == (50, 8, 8)
    assert classifier_accuracy(images, labels) >= 0.8


def test_the_recipe_distills_it_and_the_student_exports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two DMD2 iterations of ``Digits/config_dmd2_t2i_digits``; the 1-step student, exported, runs in diffusers
    and draws what ``fastgen sample --prompt`` drew."""
    from PIL import Image

    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path / "runs"))
    trained = fastgen("train", "-c", "Digits/config_dmd2_t2i_digits", "-", "trainer.max_iter=2",
                      "trainer.save_ckpt_iter=2", "trainer.callbacks.wandb.num_samples=10")
    assert trained.returncode == 0, trained.stderr[-2000:]
    run = tmp_path / "runs" / "fastgen" / "digits" / "config_dmd2_t2i_digits"
    with Image.open(run / "samples" / "iter_0000002.png") as grid:
        assert grid.mode == "RGB"  # decoded by the folder's VAE
    sampled = fastgen("sample", str(run), "--ema", "--prompt", "a handwritten seven", "--seed", "3",
                      "--out", str(tmp_path / "samples"))
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    exported = fastgen("convert-ckpt", str(run), str(tmp_path / "student"), "--to", "diffusers")
    assert exported.returncode == 0, exported.stderr[-2000:]
    info = json.loads((tmp_path / "student" / "fastgen_export.json").read_text())
    assert info["times"] == [1.0] and info["scheduler"] == "LCMScheduler"

    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(tmp_path / "student")
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe("a handwritten seven", generator=torch.Generator().manual_seed(3), height=8, width=8,
                  output_type="np", **info["call"]).images[0]
    with Image.open(tmp_path / "samples" / "0000.png") as ours:
        difference = np.abs((theirs * 255).round().astype(int) - np.asarray(ours.convert("RGB")).astype(int))
    assert difference.max() <= 2
