"""The discriminator heads' minibatch standard deviation (ProGAN, Karras et al. 2018, Sec. 3): its value, its
groups, and that it lets a head see a collapsed batch, which a per-sample head cannot."""

from __future__ import annotations

import pytest
import torch

from fastgen.networks.discriminator import FeatureDiscriminator, group_size, minibatch_std


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
