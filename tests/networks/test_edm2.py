"""The EDM2 magnitude-preserving U-Net: the primitives preserve magnitude on random data, forced weight
normalisation hits EDM2's exact target, and the backbone honours the ``DiffusionNet`` contract."""

from __future__ import annotations

import math

import pytest
import torch

from fastgen.configs.instantiate import instantiate
from fastgen.configs.net_edm2 import edm2_unet, edm2_unet_8x8
from fastgen.networks.diffusion_net import DiffusionNet
from fastgen.networks.edm2 import (
    EDM2UNet,
    MPConv,
    MPFourier,
    forced_weight_norm_,
    mp_cat,
    mp_silu,
    mp_sum,
    mpconv_weights,
    normalize,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rms(x: torch.Tensor) -> float:
    """The paper's "magnitude": root mean square."""
    return float(x.double().square().mean().sqrt())


def _tiny(resolution: int = 8, num_classes: int = 10, **kwargs) -> EDM2UNet:
    torch.manual_seed(0)
    return EDM2UNet(img_resolution=resolution, in_channels=1, model_channels=8, channel_mult=(1, 2),
                    num_blocks=1, num_classes=num_classes, attn_resolutions=(4,), logvar_channels=16, **kwargs)


# ---- magnitude preservation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", [(), (1, 1), (3, 3)])
def test_mpconv_with_normalised_weights_preserves_unit_variance(kernel: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    conv = MPConv(64, 48, kernel)
    forced_weight_norm_(conv)
    x = torch.randn(32, 64, 12, 12, generator=_gen(1)) if kernel else torch.randn(4096, 64, generator=_gen(1))
    with torch.no_grad():
        y = conv(x)
    if kernel == (3, 3):
        y = y[:, :, 1:-1, 1:-1]  # zero padding shrinks the border's magnitude; the interior is exact
    assert abs(float(y.var()) - 1.0) < 0.05
    with torch.no_grad():
        assert abs(_rms(conv(x, gain=2.5)) / _rms(conv(x)) - 2.5) < 1e-4


def test_mp_silu_mp_sum_and_mp_cat_preserve_magnitude() -> None:
    a = torch.randn(2_000_000, generator=_gen(0))
    b = torch.randn(2_000_000, generator=_gen(1))
    assert abs(_rms(mp_silu(a)) - 1.0) < 0.01  # 0.596 is the RMS of silu(N(0, 1)), not its std (0.560)
    for t in (0.3, 0.5, 0.8):
        assert abs(float(mp_sum(a, b, t).var()) - 1.0) < 0.01
    assert torch.equal(mp_sum(a, b, 0.0), a)
    wide, narrow = a[:1_600_000].reshape(1000, 1600), b[:400_000].reshape(1000, 400)
    for t in (0.3, 0.5):
        cat = mp_cat(wide, narrow, dim=1, t=t)
        assert cat.shape == (1000, 2000)
        assert abs(_rms(cat) - 1.0) < 0.01
        # b's share of the total energy is t^2 / ((1 - t)^2 + t^2), whatever the channel counts.
        share = float(cat[:, 1600:].square().sum() / cat.square().sum())
        assert abs(share - t**2 / ((1 - t) ** 2 + t**2)) < 0.01


def test_mp_fourier_and_pixel_norm_have_unit_magnitude() -> None:
    torch.manual_seed(0)
    fourier = MPFourier(4096)
    c = torch.randn(64, generator=_gen(2))
    assert abs(_rms(fourier(c)) - 1.0) < 0.03
    x = 3.0 * torch.randn(8, 16, 5, 5, generator=_gen(3)) + 1.0
    per_pixel = normalize(x, dim=1).square().mean(dim=1).sqrt()
    torch.testing.assert_close(per_pixel, torch.ones_like(per_pixel), atol=1e-4, rtol=0)


def test_network_activations_keep_unit_magnitude() -> None:
    """The whole encoder keeps magnitude ~1 at init (the point of the design), unlike a plain conv stack."""
    net = _tiny(num_classes=0)
    net.eval()
    magnitudes = []
    hooks = [block.register_forward_hook(lambda m, i, o: magnitudes.append(_rms(o))) for block in net.enc.values()]
    with torch.no_grad():
        net(torch.randn(64, 1, 8, 8, generator=_gen(4)), torch.randn(64, generator=_gen(5)))
    for h in hooks:
        h.remove()
    assert len(magnitudes) == len(net.enc)
    assert all(0.5 < m < 1.5 for m in magnitudes), magnitudes


# ---- forced weight normalisation ----------------------------------------------------------------------------
def test_normalize_matches_a_hand_computation() -> None:
    w = torch.tensor([[3.0, 4.0], [0.0, 1.0]])  # fan_in 2: row norms 5 and 1
    expected = torch.stack([w[0] / (1e-4 + 5 / math.sqrt(2)), w[1] / (1e-4 + 1 / math.sqrt(2))])
    torch.testing.assert_close(normalize(w), expected)


def test_forced_weight_norm_sets_every_row_norm_to_sqrt_fan_in_and_is_idempotent() -> None:
    net = _tiny()
    with torch.no_grad():
        for w in mpconv_weights(net):
            w.mul_(torch.rand(w.shape[0], *[1] * (w.ndim - 1)) * 5 + 0.1)  # rows of very different norms
    before = [w.detach().clone() for w in mpconv_weights(net)]
    assert forced_weight_norm_(net) == len(before)
    for w0, w in zip(before, mpconv_weights(net), strict=True):
        fan_in = w[0].numel()
        norms0 = w0.reshape(w0.shape[0], -1).norm(dim=1)
        norms = w.reshape(w.shape[0], -1).norm(dim=1)
        # EDM2's exact target: ||w_i|| / (eps + ||w_i|| / sqrt(fan_in)), i.e. sqrt(fan_in) up to eps.
        torch.testing.assert_close(norms, norms0 / (1e-4 + norms0 / math.sqrt(fan_in)), rtol=1e-5, atol=0)
        # ... = sqrt(fan_in) / (1 + eps sqrt(fan_in) / ||w_i||): off by at most eps / (smallest element RMS).
        bound = 1e-4 * math.sqrt(fan_in) / float(norms0.min()) * 1.01
        torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(fan_in)), rtol=bound, atol=0)
        # Directions are unchanged.
        torch.testing.assert_close(w / norms.reshape(-1, *[1] * (w.ndim - 1)),
                                   w0 / norms0.reshape(-1, *[1] * (w.ndim - 1)), rtol=1e-5, atol=1e-6)
    # Idempotent up to eps: the map r -> r / (eps + r / sqrt(n)) on row norms has the fixed point
    # r* = sqrt(n) (1 - eps) and slope eps there, so a second pass moves each row by at most the first pass's
    # eps-offset above, and a third pass by ~eps times that (float rounding).
    once = [w.detach().clone() for w in mpconv_weights(net)]
    forced_weight_norm_(net)
    twice = [w.detach().clone() for w in mpconv_weights(net)]
    for w0, a, b in zip(before, once, twice, strict=True):
        bound = 1e-4 * math.sqrt(w0[0].numel()) / float(w0.reshape(w0.shape[0], -1).norm(dim=1).min()) * 1.01
        torch.testing.assert_close(b, a, rtol=bound + 1e-4, atol=0)
    forced_weight_norm_(net)
    for a, b in zip(twice, mpconv_weights(net), strict=True):
        torch.testing.assert_close(b, a, rtol=2e-6, atol=1e-7)
        norms = b.reshape(b.shape[0], -1).norm(dim=1)
        torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(b[0].numel()) * (1 - 1e-4)),
                                   rtol=2e-6, atol=0)


def test_fused_pass_equals_edm2_per_layer_normalize() -> None:
    fused, reference = _tiny(), _tiny()
    forced_weight_norm_(fused)
    for module in reference.modules():
        if isinstance(module, MPConv):
            module.normalize_()
    for a, b in zip(mpconv_weights(fused), mpconv_weights(reference), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_forced_weight_norm_leaves_the_forward_pass_unchanged_and_handles_bfloat16() -> None:
    net = _tiny()
    with torch.no_grad():
        for p in net.parameters():
            if p.ndim == 0:
                p.fill_(0.7)  # non-zero gains, so the output depends on every weight
    x, c, y = torch.randn(4, 1, 8, 8, generator=_gen(6)), torch.randn(4, generator=_gen(7)), torch.arange(4)
    with torch.no_grad():
        before = net(x, c, y)
        forced_weight_norm_(net)
        after = net(x, c, y)
    torch.testing.assert_close(after, before, rtol=1e-3, atol=1e-4)
    half = _tiny().to(torch.bfloat16)
    forced_weight_norm_(half)
    for w in mpconv_weights(half):
        assert w.dtype == torch.bfloat16
        norms = w.float().reshape(w.shape[0], -1).norm(dim=1)
        torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(w[0].numel())), rtol=1e-2, atol=0)


# ---- the backbone contract ----------------------------------------------------------------------------------
@pytest.mark.parametrize("resolution", [8, 16])
def test_forward_shapes_with_and_without_labels(resolution: int) -> None:
    net = _tiny(resolution)
    x, c = torch.randn(3, 1, resolution, resolution), torch.randn(3)
    assert net(x, c).shape == x.shape
    assert net(x, c, condition=torch.tensor([0, 4, 9])).shape == x.shape
    assert net(x, c, condition=torch.eye(10)[:3]).shape == x.shape
    uncond = _tiny(resolution, num_classes=0)
    assert uncond(x, c).shape == x.shape
    out, features, logvar = net(x, c, feature_indices=[0, 1, 2], return_logvar=True)
    assert out.shape == x.shape and logvar.shape == (3,)
    assert [f.shape for f in features] == [(3, 8, resolution, resolution), (3, 16, resolution // 2, resolution // 2),
                                           (3, 16, resolution // 2, resolution // 2)]
    out2, logvar2 = net(x, c, return_logvar=True)
    torch.testing.assert_close(out2, out)
    torch.testing.assert_close(logvar2, logvar)


def test_a_net_built_for_8x8_runs_on_16x16() -> None:
    assert _tiny(8)(torch.randn(2, 1, 16, 16), torch.randn(2)).shape == (2, 1, 16, 16)


def test_labels_none_is_the_zero_label_and_integer_equals_one_hot() -> None:
    net = _tiny()
    with torch.no_grad():
        for block in net.modules():
            if hasattr(block, "emb_gain"):
                block.emb_gain.fill_(1.0)
        net.out_gain.fill_(1.0)
    x, c = torch.randn(2, 1, 8, 8), torch.randn(2)
    torch.testing.assert_close(net(x, c, condition=None), net(x, c, condition=torch.zeros(2, 10)))
    torch.testing.assert_close(net(x, c, condition=torch.tensor([3, 5])),
                               net(x, c, condition=torch.nn.functional.one_hot(torch.tensor([3, 5]), 10).float()))
    assert not torch.allclose(net(x, c, condition=torch.tensor([3, 5])), net(x, c))


def test_untrained_net_returns_c_skip_x_and_gradients_flow() -> None:
    net = DiffusionNet(_tiny(), instantiate(edm2_unet_8x8()).noise_scheduler)
    x_t, t = torch.randn(4, 1, 8, 8), torch.tensor([0.1, 0.5, 1.0, 10.0])
    c_skip = net.noise_scheduler.precondition(t)[0]
    torch.testing.assert_close(net(x_t, t), c_skip.reshape(-1, 1, 1, 1) * x_t)  # out_gain starts at zero

    with torch.no_grad():  # move every zero-initialised gain off zero, so each weight influences the output
        for name, p in net.named_parameters():
            if name.endswith("_gain"):
                p.fill_(0.5)
    pred, logvar = net(x_t, t, condition=torch.tensor([1, 2, 3, 4]), return_logvar=True)
    ((pred.float() - 1).square().mean(dim=(1, 2, 3)) / logvar.exp() + logvar).mean().backward()
    for name, p in net.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_gains_are_vectors_that_fsdp_can_shard_and_old_scalar_gains_load() -> None:
    """FSDP2 shards parameters along dimension 0, so the learned gains are (1,) tensors, not scalars; a state dict
    written when they were 0-dim loads into them."""
    net = _tiny()
    gains = {name: p for name, p in net.named_parameters() if name.endswith("_gain")}
    assert gains and all(p.shape == (1,) for p in gains.values())
    old = {k: (v.reshape(()) + 0.25 if k.endswith("_gain") else v) for k, v in net.state_dict().items()}
    net.load_state_dict(old)
    assert all(float(p) == 0.25 for p in gains.values())


def test_config_helpers_build_a_diffusion_net() -> None:
    net = instantiate(edm2_unet_8x8(num_classes=10, model_channels=8))
    assert isinstance(net, DiffusionNet) and isinstance(net.backbone, EDM2UNet)
    assert net.native_pred_type == "x0"
    x = torch.randn(2, 1, 8, 8)
    pred, logvar = net(x, torch.tensor([0.5, 2.0]), condition=torch.tensor([1, 2]), return_logvar=True)
    assert pred.shape == x.shape and logvar.shape == (2,)
    rgb = instantiate(edm2_unet(img_resolution=16, in_channels=3, num_classes=0, model_channels=8, use_r=True))
    out = rgb(torch.randn(2, 3, 16, 16), torch.tensor([0.5, 2.0]), r=torch.tensor([0.1, 1.0]))
    assert out.shape == (2, 3, 16, 16)


def test_forced_weight_norm_writes_back_into_non_contiguous_weights() -> None:
    net = _tiny().to(memory_format=torch.channels_last)
    conv_weights = [w for w in mpconv_weights(net) if w.ndim == 4 and not w.is_contiguous()]
    assert conv_weights  # channels_last makes the 3x3 weights non-contiguous
    forced_weight_norm_(net)
    for w in mpconv_weights(net):
        norms = w.reshape(w.shape[0], -1).norm(dim=1)
        torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(w[0].numel())), rtol=2e-3, atol=0)
