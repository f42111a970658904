"""SFT: the loss of EDM (Karras et al. 2022, Eq. 2) and of flow matching, and that training learns."""

from __future__ import annotations

import torch

from fastgen.configs.config_utils import load_config
from fastgen.configs.instantiate import instantiate
from fastgen.methods.sft import SFTModel


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


def test_label_dropout_only_with_labels() -> None:
    model = _model("Digits/config_sft_digits")
    batch = {"real": torch.rand(4, 1, 8, 8) * 2 - 1, "condition": torch.tensor([1, 2, 3, 4])}
    loss_dict, _ = model.single_train_step(batch, 0)
    assert torch.isfinite(loss_dict["total_loss"])


def test_sampling_uses_its_own_generator_and_the_ema_network() -> None:
    model = _model("Digits/config_sft_digits")
    assert model.sampling_net() is model.ema_nets["ema"]
    torch.manual_seed(5)
    before = torch.get_rng_state()
    a, labels = model.sample(10, generator=torch.Generator().manual_seed(0), steps=2)
    b, _ = model.sample(10, generator=torch.Generator().manual_seed(0), steps=2)
    assert torch.equal(a, b) and labels.tolist() == list(range(10))
    assert torch.equal(torch.get_rng_state(), before)  # logging samples never touches the training stream
