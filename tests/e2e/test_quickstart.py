"""The README's first command: ``fastgen train`` with no config trains the digits recipe on CPU and leaves a run
directory with config.yaml, checkpoints, a W&B offline run and a PNG grid of digits that a classifier (standing
in for a person) recognises."""

from __future__ import annotations

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
def test_quickstart_trains_recognisable_digits(output_root: Path, tmp_path: Path) -> None:
    result = run_cli("train", cwd=tmp_path, env={"WANDB_MODE": "offline"}, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = output_root / "fastgen" / "digits" / "config_sft_digits"
    assert (run_dir / "config.yaml").is_file()
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.pth")) == ["0000500.pth", "0001000.pth"]
    grid = run_dir / "samples" / "iter_0001000.png"
    assert grid.is_file()
    # W&B ran offline, with the hint, and wrote a local run that `wandb sync` can upload.
    assert "wandb sync" in result.stderr
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))

    samples = _tiles_from_grid(grid)
    labels = np.arange(100) % 10  # the grid is conditional on 0..9 along each row
    accuracy = float((_digits_classifier().predict(samples) == labels).mean())
    assert accuracy >= 0.8, f"only {accuracy:.0%} of the sampled digits are recognisable as their class"
