"""The README's first command: ``fastgen train`` with no config distills the shipped digits teacher into a
1-step student with DMD2 on CPU, leaves a run directory with config.yaml, checkpoints, a W&B offline run and a PNG
grid of digits that a classifier (standing in for a person) recognises, and prints the student's Frechet distance
beside the 35-evaluation teacher's.

The distillation issue's goal is FD(student) <= FD(teacher). It is NOT met: at 5,000 samples the student scores
1.90 against the teacher's 0.56 (0.97 before keyed noise: docs/experiments/dmd2-digits.md). The bound below guards the measured level so that a
regression fails; it is not the goal. Training is deterministic on a given machine, but the recipe's EMA student
swings between 0.97 and 1.73 from checkpoint to checkpoint (README) and as much from seed to seed. Measured at
trainer.seed 0-4: 0.97, 1.09, 1.46, 1.47, 1.71 with training noise from torch's generator (before keyed noise);
1.90, 1.25, 1.73, 1.29, 1.27 with the keyed noise training draws now (fastgen.distributed.keyed_rng; this test's
seed 0 gives 1.90); 1.76, 1.66, 1.42, 1.48, 1.65 with an earlier key layout of the same generator. The bound is
1.25x the worst of those 15 runs (2.37, 4.25x the teacher's 0.56); it was 2x when one run at 0.97 was measured."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fastgen_testing import run_cli


def _tiles_from_grid(png: Path, n: int = 100, nrow: int = 10, size: int = 8, padding: int = 1) -> np.ndarray:
    """Cut the saved grid back into ``(n, 64)`` pixel vectors in [-1, 1]."""
    from PIL import Image

    image = Image.open(png).convert("L")
    cells = image.width // (nrow * (size + padding) + padding)  # the nearest-neighbour upscale factor
    pixels = np.asarray(image, dtype=np.float32)[::cells, ::cells]
    tiles = []
    for i in range(n):
        r, c = divmod(i, nrow)
        y, x = padding + r * (size + padding), padding + c * (size + padding)
        tiles.append(pixels[y : y + size, x : x + size].reshape(-1))
    return np.stack(tiles) / 127.5 - 1.0


def _digits_classifier():
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    digits = load_digits()
    x = digits.images.reshape(len(digits.images), -1) / 16.0 * 2.0 - 1.0
    return LogisticRegression(max_iter=2000).fit(x, digits.target)


@pytest.mark.slow
def test_quickstart_distills_a_one_step_student_and_scores_it_beside_its_teacher(output_root: Path, tmp_path: Path) -> None:
    result = run_cli("train", cwd=tmp_path, env={"WANDB_MODE": "offline"}, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = output_root / "fastgen" / "digits" / "config_dmd2_digits"
    assert (run_dir / "config.yaml").is_file()
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.pth")) == ["0000500.pth", "0001000.pth"]
    grid = run_dir / "samples" / "iter_0001000.png"
    assert grid.is_file()
    # W&B ran offline, with the hint, and wrote a local run that `wandb sync` can upload.
    assert "wandb sync" in result.stderr
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))

    # The student's and the teacher's Frechet distances, printed side by side and recorded.
    # The teacher's row comes from the scores shipped beside it (tests/evaluation/test_teacher_cache.py checks
    # that they reproduce), so the quick-start can afford 5,000 samples.
    assert "teacher (35 evaluations, cached)" in result.stdout and "fd_digits" in result.stdout
    evaluation = json.loads((run_dir / "evaluation.json").read_text())
    student, teacher = evaluation["results"]["student"], evaluation["results"]["teacher"]
    assert evaluation["num_samples"] == 5000 and evaluation["teacher_scores_cached"] is True
    assert student["fd_digits"] <= 4.25 * teacher["fd_digits"], evaluation  # measured: 1.90 vs 0.56 (docstring)
    assert student["accuracy"] >= 0.9, evaluation

    samples = _tiles_from_grid(grid)
    labels = np.arange(100) % 10  # the grid is conditional on 0..9 along each row
    accuracy = float((_digits_classifier().predict(samples) == labels).mean())
    assert accuracy >= 0.8, f"only {accuracy:.0%} of the sampled digits are recognisable as their class"
