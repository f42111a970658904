"""Sampling building blocks: batch-independent starting noise, seeds that never repeat across runs, labels,
checkpoint discovery errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastgen.checkpoint.source import resolve_checkpoint
from fastgen.evaluation.sampling import balanced_labels, initial_noise
from fastgen.networks.noise_schedules import EDMNoiseScheduler
from fastgen.utils.errors import UsageError


def test_initial_noise_is_the_same_for_any_split_into_batches() -> None:
    scheduler = EDMNoiseScheduler()
    whole = initial_noise(scheduler, (1, 8, 8), seed=3, start=0, count=50)
    pieces = torch.cat([initial_noise(scheduler, (1, 8, 8), 3, s, min(7, 50 - s)) for s in range(0, 50, 7)])
    assert torch.equal(whole, pieces)
    assert whole.std() > 10  # x_{t_max} = sigma_max * eps (EDM: sigma_max = 80)


def test_noise_differs_between_seeds_including_seeds_32_bits_apart() -> None:
    scheduler = EDMNoiseScheduler()
    base = initial_noise(scheduler, (2,), 0, 0, 32)
    for other_seed in (1, 1 << 32):  # torch's CPU generator would keep only the low 32 bits of a raw seed
        assert not torch.allclose(base, initial_noise(scheduler, (2,), other_seed, 0, 32))
    rows = initial_noise(scheduler, (2,), 0, 0, 4096)
    assert torch.unique(rows, dim=0).shape[0] == 4096  # no two samples share their noise


def test_balanced_and_fixed_labels() -> None:
    assert balanced_labels(12, 10).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert balanced_labels(3, 10, label=4).tolist() == [4, 4, 4]
    assert balanced_labels(5, 0) is None
    with pytest.raises(UsageError, match="unconditional"):
        balanced_labels(5, 0, label=1)
    with pytest.raises(UsageError, match="between 0 and 9"):
        balanced_labels(5, 10, label=10)


def test_resolve_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="checkpoint not found"):
        resolve_checkpoint(tmp_path / "nope.pth")
    with pytest.raises(UsageError, match="no valid checkpoint"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(UsageError, match="starts with s3:// \\(two slashes\\)"):
        resolve_checkpoint("s3:/bucket/run")
    (tmp_path / "checkpoints").mkdir()
    for name in ("0000002.pth", "0000010.pth"):
        torch.save({}, tmp_path / "checkpoints" / name)
    for name in ("0000012.pth", ".0000011.pth.x.tmp"):  # a truncated newest (skipped with a warning), a temporary
        (tmp_path / "checkpoints" / name).write_bytes(b"")
    resolved = resolve_checkpoint(tmp_path / "checkpoints")
    found, config = resolved.checkpoint, resolved.config_yaml
    assert Path(found).name == "0000010.pth" and config is None  # no config.yaml: load_run asks for --config
