"""Resuming at another world size: each new rank's random streams are derived from ``(seed, iteration, rank)``
(``CheckpointManager.restore_rank_state``), so ranks differ from each other and from the saved rank 0, and the same
resume draws the same numbers. At the saving world size each rank takes back its own saved stream."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fastgen.checkpoint.manager import CheckpointManager, TrainingState
from fastgen.distributed import group as dist_utils
from fastgen.utils.rng import capture_rng_state, seed_everything


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def saved_payload(world: int) -> dict:
    """A checkpoint's rank entries as a ``world``-rank run saves them: rank r's streams seeded with 1000 + r."""
    rng = {}
    for rank in range(world):
        seed_everything(1000 + rank)
        rng[rank] = capture_rng_state()
    return {"iteration": 12, "world_size": world, "rng": rng, "dataloaders": {}, "per_rank": {}}


def restore_as(rank: int, world: int, payload: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple:
    monkeypatch.setattr(dist_utils, "get_rank", lambda: rank)
    monkeypatch.setattr(dist_utils, "get_world_size", lambda: world)
    config = SimpleNamespace(save_dir="checkpoints", use_s3=False, s3_container=None, keep_last_n=None,
                             pretrained_ckpt_path=None, async_save=False)
    manager = CheckpointManager(config, tmp_path, sharded=False, seed=7)
    manager.restore_rank_state(payload, TrainingState(model=None, callbacks=None, loaders={}, iteration=12))
    return draws()


def test_at_another_world_size_every_rank_gets_a_stream_of_its_own(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    payload = saved_payload(2)
    seed_everything(1000)
    saved_rank0 = draws()
    streams = [restore_as(rank, 4, payload, tmp_path, monkeypatch) for rank in range(4)]
    assert len(set(streams)) == 4, "two new ranks draw the same numbers"
    assert saved_rank0 not in streams, "a new rank continues the saved rank 0's stream"
    assert restore_as(3, 4, payload, tmp_path, monkeypatch) == streams[3], "the same resume must draw the same numbers"


def test_at_the_saving_world_size_each_rank_continues_its_own_stream(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    payload = saved_payload(2)
    for rank in range(2):
        seed_everything(1000 + rank)
        expected = draws()
        assert restore_as(rank, 2, payload, tmp_path, monkeypatch) == expected
