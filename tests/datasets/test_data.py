"""Built-in datasets and the resumable, rank-aware loader."""

from __future__ import annotations

import pytest
import torch

from fastgen.datasets.digits import DigitsDataset
from fastgen.datasets.loader import ResumableLoader
from fastgen.datasets.toy import TOY_DISTRIBUTIONS, ToyDataset, toy_samples


@pytest.mark.parametrize("name", TOY_DISTRIBUTIONS)
def test_toy_distributions_are_seeded_and_roughly_unit_scale(name: str) -> None:
    a, b = toy_samples(name, 4000, seed=1), toy_samples(name, 4000, seed=1)
    assert a.shape == (4000, 2) and torch.equal(a, b)
    assert not torch.equal(a, toy_samples(name, 4000, seed=2))
    assert 0.4 < float(a.std()) < 1.6


def test_unknown_toy_distribution() -> None:
    with pytest.raises(ValueError, match="checkerboard"):
        toy_samples("spiral", 10)


def test_digits_splits_are_disjoint_and_labelled() -> None:
    train, val, everything = DigitsDataset("train"), DigitsDataset("val"), DigitsDataset("all")
    assert len(train) + len(val) == len(everything) == 1797
    item = train[0]
    assert item["real"].shape == (1, 8, 8) and -1 <= float(item["real"].min()) and float(item["real"].max()) <= 1
    assert set(train.labels.tolist()) == set(range(10))
    train_set = {tuple(x.flatten().tolist()) for x in train.images}
    assert not any(tuple(x.flatten().tolist()) in train_set for x in val.images[:50])


def test_digits_are_exactly_scikit_learns() -> None:
    """Read from scikit-learn's file without importing sklearn.datasets: the same images and labels."""
    import numpy as np
    from sklearn.datasets import load_digits

    from fastgen.datasets.digits import load_digits_tensors

    images, labels = load_digits_tensors()
    bunch = load_digits()
    assert torch.equal(images, torch.from_numpy(bunch.images).float().div(16.0).mul(2.0).sub(1.0).unsqueeze(1))
    assert np.array_equal(labels.numpy(), bunch.target) and labels.dtype == torch.int64


def test_loader_resumes_at_the_exact_batch() -> None:
    dataset = ToyDataset("two_moons", num_samples=100)
    straight = ResumableLoader(dataset, batch_size=16, seed=3)
    expected = [next(straight)["real"] for _ in range(20)]  # crosses several epochs
    first = ResumableLoader(dataset, batch_size=16, seed=3)
    for _ in range(7):
        next(first)
    state = first.state_dict()
    resumed = ResumableLoader(dataset, batch_size=16, seed=3)
    resumed.load_state_dict(state)
    for i in range(7, 20):
        assert torch.equal(next(resumed)["real"], expected[i])


def test_loader_shards_ranks_without_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    dataset = ToyDataset("eight_gaussians", num_samples=64)
    seen = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = ResumableLoader(dataset, batch_size=8, seed=0)
        seen.append(torch.cat([next(loader)["real"] for _ in range(4)]))
    rows = {tuple(r.tolist()) for r in seen[0]}
    assert not any(tuple(r.tolist()) in rows for r in seen[1])
    assert len(rows) + len(seen[1]) == 64


def test_loader_rejects_a_batch_larger_than_the_data() -> None:
    with pytest.raises(ValueError, match="too small"):
        ResumableLoader(ToyDataset(num_samples=10), batch_size=16)


def test_generic_dataset_items_are_collated() -> None:
    class Items:
        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int) -> dict:
            return {"real": torch.full((2,), float(i)), "condition": torch.tensor(i)}

    batch = next(ResumableLoader(Items(), batch_size=4, shuffle=False))
    assert batch["real"].shape == (4, 2) and batch["condition"].tolist() == [0, 1, 2, 3]
