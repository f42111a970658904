"""``sample_ids`` of ``ResumableLoader`` batches: global stream positions that do not depend on the world size,
and a loader state that resumes at another world size."""

from __future__ import annotations

import pytest
import torch

from fastgen.datasets.loader import ResumableLoader, build_dataloader
from fastgen.datasets.toy import ToyDataset


def batches(loader: ResumableLoader, n: int) -> list[dict[str, torch.Tensor]]:
    return [next(loader) for _ in range(n)]


@pytest.mark.parametrize("size", [64, 67])  # 67: the ranks leave a different remainder than one process does
def test_one_rank_at_2b_sees_the_samples_and_ids_of_two_ranks_at_b(size: int) -> None:
    dataset = ToyDataset("two_moons", num_samples=size)
    single = build_dataloader(dataset, batch_size=8, seed=4, rank=0, world_size=1)
    ranks = [build_dataloader(dataset, batch_size=4, seed=4, rank=r, world_size=2) for r in range(2)]
    for _ in range(20):  # several epochs
        full = next(single)
        halves = [next(loader) for loader in ranks]
        assert full["sample_ids"].dtype == torch.int64 and full["sample_ids"].shape == (8,)
        assert torch.equal(full["sample_ids"][0::2], halves[0]["sample_ids"])  # positions r, r + W, ...
        assert torch.equal(full["sample_ids"][1::2], halves[1]["sample_ids"])
        assert torch.equal(full["real"][0::2], halves[0]["real"]) and torch.equal(full["real"][1::2], halves[1]["real"])


def test_ids_are_epoch_times_dataset_size_plus_position() -> None:
    dataset = ToyDataset("two_moons", num_samples=20)
    loader = ResumableLoader(dataset, batch_size=6, seed=0, rank=1, world_size=2)  # 10 per rank: 1 batch per epoch
    first, second = next(loader)["sample_ids"], next(loader)["sample_ids"]
    assert first.tolist() == [1, 3, 5, 7, 9, 11]
    assert second.tolist() == [21, 23, 25, 27, 29, 31]  # epoch 1 starts at 20 whatever the world size
    ids = torch.cat([next(loader)["sample_ids"] for _ in range(30)])
    assert ids.unique().numel() == ids.numel()  # never reused


def test_collated_datasets_get_ids_too() -> None:
    class Items:
        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int) -> dict:
            return {"real": torch.full((2,), float(i))}

    batch = next(ResumableLoader(Items(), batch_size=4, shuffle=False, rank=0, world_size=1))
    assert batch["sample_ids"].tolist() == [0, 1, 2, 3]


def test_a_checkpoint_of_two_ranks_resumes_on_one_rank_at_the_same_global_batch() -> None:
    dataset = ToyDataset("eight_gaussians", num_samples=50)
    straight = ResumableLoader(dataset, batch_size=8, seed=2, rank=0, world_size=1)
    expected = [b["sample_ids"] for b in batches(straight, 15)]
    ranks = [ResumableLoader(dataset, batch_size=4, seed=2, rank=r, world_size=2) for r in range(2)]
    for loader in ranks:
        batches(loader, 4)
    resumed = ResumableLoader(dataset, batch_size=8, seed=2, rank=0, world_size=1)
    resumed.load_state_dict(ranks[0].state_dict())  # the trainer saves rank 0's state
    for batch, want in zip(batches(resumed, 11), expected[4:], strict=True):
        assert torch.equal(batch["sample_ids"], want)
    back = [ResumableLoader(dataset, batch_size=4, seed=2, rank=r, world_size=2) for r in range(2)]
    for loader in back:  # and from one rank back to two
        loader.load_state_dict(resumed.state_dict())
    following = [next(loader)["sample_ids"] for loader in back]
    straight_next = next(straight)["sample_ids"]
    assert torch.equal(following[0], straight_next[0::2]) and torch.equal(following[1], straight_next[1::2])


def test_a_world_size_that_cannot_split_the_consumed_samples_is_a_usage_error() -> None:
    from fastgen.utils.errors import UsageError

    dataset = ToyDataset("eight_gaussians", num_samples=60)
    loader = ResumableLoader(dataset, batch_size=2, seed=0, rank=0, world_size=2)
    next(loader)  # 2 ranks x 2 samples = 4 consumed
    with pytest.raises(UsageError, match="world size that divides"):
        ResumableLoader(dataset, batch_size=2, seed=0, rank=0, world_size=3).load_state_dict(loader.state_dict())


def test_a_state_without_a_global_position_resumes_at_the_same_world_size() -> None:
    dataset = ToyDataset("eight_gaussians", num_samples=50)
    loader = ResumableLoader(dataset, batch_size=8, seed=2, rank=0, world_size=1)
    batches(loader, 3)
    old_state = {"epoch": loader.epoch, "position": loader.position, "seed": 2, "batch_size": 8}  # older checkpoints
    resumed = ResumableLoader(dataset, batch_size=8, seed=2, rank=0, world_size=1)
    resumed.load_state_dict(old_state)
    assert torch.equal(next(resumed)["sample_ids"], next(loader)["sample_ids"])


def test_rank_and_world_size_are_checked_and_default_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    dataset = ToyDataset("eight_gaussians", num_samples=64)
    with pytest.raises(ValueError, match="rank 2"):
        ResumableLoader(dataset, batch_size=4, rank=2, world_size=2)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = ResumableLoader(dataset, batch_size=4, shuffle=False)
    assert (loader.rank, loader.world_size) == (1, 2) and next(loader)["sample_ids"].tolist() == [1, 3, 5, 7]
