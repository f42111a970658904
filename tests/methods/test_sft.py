"""SFT: the loss of EDM (Karras et al. 2022, Eq. 2) and of flow matching, and that training learns."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastgen.configs.config_utils import load_config
from fastgen.configs.instantiate import LazyCall, instantiate
from fastgen.configs.net import edm_schedule
from fastgen.methods.sft import SFTModel
from fastgen.networks.layers import as_one_hot


def _model(recipe: str) -> SFTModel:
    config = load_config(recipe)
    return instantiate(config.model_class, config=config.model)


def test_edm_loss_is_the_weighted_x0_regression() -> None:
    model = _model("Toy/config_sft_toy")
    x0 = torch.randn(32, 2)
    torch.manual_seed(0)
    loss_dict, out = model.single_train_step({"real": x0}, 0)
    t = out["t"]
    pred = out["pred"]
    weight = (t**2 + 0.7**2) / (t * 0.7) ** 2
    expected = (weight * (pred - x0).square().mean(dim=1)).mean()
    torch.testing.assert_close(loss_dict["total_loss"], expected)
    loss_dict["total_loss"].backward()
    assert all(p.grad is not None for p in model.net.parameters())


def test_flow_matching_target_is_eps_minus_x0() -> None:
    model = _model("Toy/config_sft_flow_toy")
    x0 = torch.randn(16, 2)
    torch.manual_seed(1)
    loss_dict, out = model.single_train_step({"real": x0}, 0)
    t = out["t"][:, None]
    eps = (out["x_t"] - (1 - t) * x0) / t
    expected = (out["pred"] - (eps - x0)).square().mean()
    torch.testing.assert_close(loss_dict["total_loss"], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dropout", [0.0, 0.1, 0.5])
def test_label_dropout_drops_the_configured_fraction_to_the_null_label(dropout: float) -> None:
    """With ``condition_dropout = p`` the network sees the all-zero (null) label for a fraction p of the batch and
    the sample's own one-hot label otherwise; the null label is the one classifier-free guidance feeds its
    unconditional branch (Ho & Salimans 2022). 20,000 labels: the fraction is within 4.5 binomial standard
    deviations of p (0.0095 at p = 0.1, 0.016 at p = 0.5)."""
    config = load_config("Digits/config_sft_digits")
    assert config.model.condition_dropout == 0.1  # the recipe's value is among those tested
    config.model.condition_dropout = dropout
    config.model.net = LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(  # the 8x8 U-Net is slow at n
        backbone=LazyCall("fastgen.networks.mlp.MLPDenoiser")(data_dim=2, hidden_dim=16, num_layers=1, num_classes=10),
        noise_scheduler=edm_schedule(sigma_data=0.5))
    config.model.input_shape = [2]
    model = instantiate(config.model_class, config=config.model)
    seen: list[torch.Tensor] = []
    model.net.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["condition"]), with_kwargs=True)

    n = 20_000
    labels = torch.arange(n) % 10
    torch.manual_seed(0)
    model.single_train_step({"real": torch.randn(n, 2), "condition": labels}, 0)
    condition = as_one_hot(seen[0], 10)
    one_hot = torch.nn.functional.one_hot(labels, 10).float()
    dropped = (condition == 0).all(dim=1)
    assert torch.equal(condition[~dropped], one_hot[~dropped])
    fraction = float(dropped.float().mean())
    assert abs(fraction - dropout) <= 4.5 * (dropout * (1 - dropout) / n) ** 0.5
    if dropout > 0:
        assert fraction > 0
        per_class = torch.stack([dropped[labels == c].float().mean() for c in range(10)])
        assert float(per_class.min()) > 0  # every class is dropped, not one chosen class

        seen.clear()
        flow = model.flow_fn(model.net, labels[:4], guidance_scale=2.0)
        flow(torch.randn(4, 2), torch.full((4,), 1.0))
        unconditional = seen[0][4:]
        assert torch.equal(unconditional, condition[dropped][:4])


@pytest.mark.slow
def test_the_toy_teacher_learns_the_data_to_within_a_factor_of_its_finite_sample_floor(
        toy_teacher_ckpt: Path, toy_teacher_energy: float) -> None:
    """The toy SFT teacher (``toy_distill.teacher_config``: a 128-wide 2-layer MLP, EDM, 1,500 iterations of
    batch 256 on eight Gaussians, power EMA) sampled from its EMA with 18 Heun steps scores an energy distance
    (2,000 samples against 2,000 fresh data points) within 6x of what fresh data itself scores against the same
    points (the floor: 0.00115, the V-statistic's finite-sample bias). Teacher / floor over seeds 0-5 of
    ``tests/methods/measure_toy_quality.py``: 1.85 2.72 3.82 4.01 2.28 2.91 (max 4.01; the bound is 1.5x that); the
    raw network, without the EMA, scored 4.1-9.6x. Untrained (its output layer starts at zero, so it returns
    ``c_skip x``) the network scores 0.16, 139x the floor."""
    from toy_distill import build, data_floor, teacher_config, toy_energy

    from fastgen.checkpoint.checkpointer import load_checkpoint

    floor = data_floor()
    assert 0.0005 < floor < 0.003
    untrained = build(teacher_config())
    assert toy_energy(untrained) > 100 * floor  # the bound below is not met by a network that learned nothing
    assert toy_teacher_energy < 6.0 * floor
    assert load_checkpoint(toy_teacher_ckpt)["iteration"] == 1500


def test_sampling_uses_its_own_generator_and_the_ema_network() -> None:
    model = _model("Digits/config_sft_digits")
    assert model.sampling_net() is model.ema_nets["ema"]
    torch.manual_seed(5)
    before = torch.get_rng_state()
    a, labels = model.sample(10, generator=torch.Generator().manual_seed(0), steps=2)
    b, _ = model.sample(10, generator=torch.Generator().manual_seed(0), steps=2)
    assert torch.equal(a, b) and labels.tolist() == list(range(10))
    assert torch.equal(torch.get_rng_state(), before)  # logging samples never touches the training stream
