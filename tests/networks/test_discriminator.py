"""The discriminator heads' minibatch standard deviation (ProGAN, Karras et al. 2018, Sec. 3): its value, its
groups (consecutive, or by part and condition), and that it lets a head see a collapsed batch, which a per-sample
head cannot."""

from __future__ import annotations

import pytest
import torch

from fastgen.networks.discriminator import FeatureDiscriminator, group_size, minibatch_groups, minibatch_std, per_group


@pytest.mark.parametrize(("batch", "group", "size"), [(64, 4, 4), (6, 4, 3), (7, 4, 1), (3, 4, 3), (8, 1, 1)])
def test_group_size_is_the_largest_divisor_of_the_batch_up_to_the_group(batch: int, group: int, size: int) -> None:
    assert group_size(batch, group) == size


def test_minibatch_std_is_the_mean_feature_std_of_each_group_of_consecutive_samples() -> None:
    torch.manual_seed(0)
    feature = torch.randn(8, 3, 2, 2)
    feature[:4] = feature[0]  # the first group holds one sample four times
    spread = minibatch_std(feature, 4)
    assert spread.shape == (8,)
    assert torch.allclose(spread[:4], torch.full((4,), 1e-4), atol=1e-6)
    expected = feature[4:].std(dim=0, unbiased=False).mean()
    assert torch.allclose(spread[4:], expected.expand(4), atol=1e-5)


@pytest.mark.parametrize("shape", [[5, 2, 2], [5]])
def test_a_head_with_minibatch_std_tells_a_collapsed_batch_from_a_varied_one(shape: list[int]) -> None:
    """The same first sample gets a different logit when its batch-mates are copies of it than when they vary;
    without the minibatch std its logit depends on it alone."""
    torch.manual_seed(0)
    varied = torch.randn(4, *shape)
    collapsed = varied[:1].expand(4, *shape).clone()
    with_std = FeatureDiscriminator([shape], hidden=8, minibatch_std_group=4)
    without = FeatureDiscriminator([shape], hidden=8)
    assert not torch.allclose(with_std([varied])[0], with_std([collapsed])[0])
    assert torch.allclose(without([varied])[0], without([collapsed])[0])


def test_the_group_override_keeps_groups_inside_each_part() -> None:
    """Two parts of 6 scored in one batch of 12 with groups of 4: by default a group straddles the parts, so the
    first part's logits move when the second changes; with ``group=group_size(6, 4)`` they do not."""
    torch.manual_seed(0)
    head = FeatureDiscriminator([[5]], hidden=8, minibatch_std_group=4)
    first, second = torch.randn(6, 5), torch.randn(6, 5)
    changed = second + 3.0
    straddling = [head([torch.cat([first, part])])[:6] for part in (second, changed)]
    assert not torch.allclose(*straddling)
    kept = [head([torch.cat([first, part])], group_size(6, 4))[:6] for part in (second, changed)]
    assert torch.allclose(*kept)


def test_a_negative_group_is_refused() -> None:
    with pytest.raises(ValueError, match="minibatch_std_group"):
        FeatureDiscriminator([[5]], minibatch_std_group=-1)


def test_conditional_groups_hold_one_condition_of_one_part_and_at_most_the_group_size() -> None:
    labels = torch.tensor([0, 1, 0, 0, 2, 0, 1, 0, 0, 0])
    condition = torch.nn.functional.one_hot(torch.cat([labels, labels]), 3).float()  # generated half, real half
    groups = minibatch_groups(20, 3, condition, parts=2)
    assert groups is not None and groups.shape == (20,)
    part = torch.arange(20) // 10
    for g in groups.unique():
        members = (groups == g).nonzero().squeeze(1)
        assert len(members) <= 3
        assert len(set(part[members].tolist())) == 1
        assert len({tuple(row) for row in condition[members].tolist()}) == 1
    # label 0 has 7 samples per part: groups of 3, 3 and 1, in batch order
    zeros = groups[:10][labels == 0]
    assert zeros.tolist() == [zeros[0]] * 3 + [zeros[3]] * 3 + [zeros[6]] and len(set(zeros.tolist())) == 3
    # the real half is grouped exactly like the generated half (same conditions), with its own ids
    first, second = groups[:10], groups[10:]
    assert set(first.tolist()).isdisjoint(second.tolist())
    assert torch.equal(first.unsqueeze(0) == first.unsqueeze(1), second.unsqueeze(0) == second.unsqueeze(1))


def test_unconditional_groups_are_consecutive_and_off_below_two() -> None:
    assert minibatch_groups(8, 4).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert minibatch_groups(12, 4, parts=2).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]  # 3 divides each part
    assert minibatch_groups(8, 1) is None and minibatch_groups(8, 0, torch.eye(8)) is None
    with pytest.raises(ValueError, match="equal parts"):
        minibatch_groups(7, 4, parts=2)


def test_minibatch_std_over_group_ids_is_each_groups_mean_feature_std() -> None:
    torch.manual_seed(0)
    feature = torch.randn(7, 3, 2, 2)
    groups = torch.tensor([1, 0, 1, 2, 0, 1, 0])
    spread = minibatch_std(feature, groups)
    for g in range(3):
        members = groups == g
        expected = ((feature[members].var(dim=0, unbiased=False) + 1e-8).sqrt().mean())
        assert torch.allclose(spread[members], expected.expand(int(members.sum())), atol=1e-6)
    assert spread[3] == pytest.approx(1e-4)  # a group of one has no spread
    assert torch.allclose(minibatch_std(feature[:6], torch.tensor([0, 0, 0, 1, 1, 1])), minibatch_std(feature[:6], 3))


def test_per_group_gives_each_group_its_first_samples_value() -> None:
    """One value per group, the one drawn for the group's first sample (per-sample draws stay keyed by sample)."""
    groups = torch.tensor([2, 0, 2, 1, 0])
    values = per_group(lambda n: torch.arange(n) * 10.0, groups, 5)
    assert values.tolist() == [0.0, 10.0, 0.0, 30.0, 10.0]
    assert per_group(lambda n: torch.arange(n) * 1.0, None, 3).tolist() == [0.0, 1.0, 2.0]


def test_class_groups_keep_one_classs_logits_independent_of_another_class() -> None:
    """With groups by condition, changing the samples of class 1 leaves the logits of class 0 alone; consecutive
    groups of the same size would mix them."""
    torch.manual_seed(0)
    head = FeatureDiscriminator([[5]], hidden=8, minibatch_std_group=4)
    labels = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
    groups = minibatch_groups(8, 4, torch.nn.functional.one_hot(labels, 2).float())
    feature = torch.randn(8, 5)
    changed = feature.clone()
    changed[labels == 1] += 3.0
    zero = labels == 0
    assert torch.allclose(head([feature], groups)[zero], head([changed], groups)[zero])
    assert not torch.allclose(head([feature])[zero], head([changed])[zero])
