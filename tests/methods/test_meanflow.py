"""MeanFlow (Geng et al. 2025): r = t is flow matching, the JVP target u_tgt = v - (t - r) du/dt, the adaptive
weight, one- and multi-step sampling, data vs distill mode, and a from-scratch run on toy data."""

from __future__ import annotations

import pytest
import torch
from toy_distill import build, has_grad, report, small_toy_mlp, tiny, toy_energy, toy_run_config, train

from omegaconf import DictConfig

from fastgen.configs.callbacks import EMA_POWER_CALLBACK, GradClip_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.config_utils import load_config
from fastgen.configs.instantiate import instantiate
from fastgen.configs.methods.config_meanflow import create_config
from fastgen.configs.net import flow_schedule
from fastgen.evaluation.sampling import draw_samples
from fastgen.methods.cm_utils import Tangents
from fastgen.utils.errors import ConfigError


def mf_net(hidden_dim: int = 16, num_layers: int = 1, use_r: bool = True):  # noqa: ANN201
    return small_toy_mlp(flow_schedule(), use_r=use_r, hidden_dim=hidden_dim, num_layers=num_layers)


def perturbed(model):  # noqa: ANN001, ANN201
    with torch.no_grad():
        for p in model.net.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def test_r_equal_t_is_flow_matching() -> None:
    model = perturbed(build(tiny(create_config, net=mf_net(), ratio_r_neq_t=0.0, adaptive_p=0.0)))
    x0 = torch.randn(32, 2)
    loss_dict, out = model.single_train_step({"real": x0}, 0)
    assert torch.equal(out["r"], out["t"]) and float(loss_dict["fm_fraction"]) == 1.0
    t = out["t"][:, None]
    eps = (out["x_t"] - (1 - t) * x0) / t
    with torch.no_grad():
        v_pred = model.net(out["x_t"], out["t"], fwd_pred_type="flow")  # r = t: the instantaneous velocity
    expected = (v_pred - (eps - x0)).square().sum(dim=1).mean()  # Lipman et al. 2023, Eq. 23 (summed over D)
    torch.testing.assert_close(loss_dict["total_loss"].detach(), expected, rtol=1e-4, atol=1e-5)


def test_target_is_v_minus_gap_times_the_total_derivative() -> None:
    model = perturbed(build(tiny(create_config, net=mf_net(), ratio_r_neq_t=1.0, adaptive_p=0.0)))
    x0 = torch.randn(16, 2)
    torch.manual_seed(4)
    loss_dict, out = model.single_train_step({"real": x0}, 0)
    t, r = out["t"], out["r"]
    assert torch.all(r < t)
    eps = (out["x_t"] - (1 - t[:, None]) * x0) / t[:, None]
    v = eps - x0

    def u(z: torch.Tensor, tt: torch.Tensor, rr: torch.Tensor) -> torch.Tensor:
        return model.net(z, tt, r=rr, fwd_pred_type="flow")

    dudt = Tangents("finite_difference", fd_step=1e-3)(u, (out["x_t"], t, r), (v, torch.ones_like(t), torch.zeros_like(r)))
    target = v - (t - r)[:, None] * dudt
    expected = (out["u"] - target).square().sum(dim=1).mean()
    torch.testing.assert_close(loss_dict["total_loss"].detach(), expected, rtol=2e-2, atol=1e-4)


def test_the_jvp_runs_only_on_rows_with_r_below_t_and_the_loss_is_the_full_batch_one() -> None:
    """The flow-matching rows (r = t) are left out of the Jacobian-vector product (their gap t - r is 0); the loss
    equals the one computed with the total derivative of every row. A batch with no such row still runs the JVP on
    one row, so every rank of a sharded network runs the same passes."""
    model = perturbed(build(tiny(create_config, net=mf_net(), ratio_r_neq_t=0.5, adaptive_p=0.0)))
    sizes: list[int] = []
    tangents = model.tangents
    model.tangents = lambda fn, primals, directions: sizes.append(primals[0].shape[0]) or tangents(fn, primals, directions)
    x0 = torch.randn(64, 2)
    torch.manual_seed(5)
    loss_dict, out = model.single_train_step({"real": x0}, 0)
    t, r = out["t"], out["r"]
    moving = int((r != t).sum())
    assert 0 < moving < 64 and sizes == [moving]
    eps = (out["x_t"] - (1 - t[:, None]) * x0) / t[:, None]
    v = eps - x0
    dudt = tangents(lambda z, tt, rr: model.net(z, tt, r=rr, fwd_pred_type="flow"), (out["x_t"], t, r),
                    (v, torch.ones_like(t), torch.zeros_like(r)))
    expected = (out["u"] - (v - (t - r)[:, None] * dudt)).square().sum(dim=1).mean()
    torch.testing.assert_close(loss_dict["total_loss"].detach(), expected, rtol=1e-5, atol=1e-6)

    flow_matching = build(tiny(create_config, net=mf_net(), ratio_r_neq_t=0.0, adaptive_p=0.0))
    sizes.clear()
    flow_matching.tangents = lambda fn, primals, directions: sizes.append(primals[0].shape[0]) or tangents(fn, primals, directions)
    flow_matching.single_train_step({"real": x0}, 0)
    assert sizes == [1]


def test_adaptive_weight_and_gradients() -> None:
    model = perturbed(build(tiny(create_config, net=mf_net())))
    loss_dict, out = model.single_train_step({"real": torch.randn(32, 2)}, 0)
    assert set(loss_dict) == {"total_loss", "meanflow_loss", "unweighted_loss", "fm_fraction"}
    # w = 1 / (||D||^2 + c): every sample contributes ||D||^2 / (||D||^2 + c) < 1 (Geng et al. 2025, Sec. 4.3)
    assert 0 < float(loss_dict["total_loss"].detach()) < 1
    loss_dict["total_loss"].backward()
    assert has_grad(model.net) and model.teacher is None and "teacher" not in model.model_dict


def test_distill_mode_uses_the_teachers_velocity() -> None:
    model = build(tiny(create_config, net=mf_net(), mode="distill", teacher=mf_net(use_r=False)))
    perturbed(model)
    with torch.no_grad():
        for p in model.teacher.parameters():
            p.add_(0.2 * torch.randn_like(p))
    z, t = torch.randn(8, 2), torch.linspace(0.1, 0.9, 8)
    v = model.instantaneous_velocity(torch.zeros(8, 2), torch.zeros(8, 2), z, t, None)
    torch.testing.assert_close(v, model.teacher(z, t, fwd_pred_type="flow"), rtol=1e-4, atol=1e-5)
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, 0)
    loss_dict["total_loss"].backward()
    assert has_grad(model.net) and not has_grad(model.teacher)


def test_the_network_must_fit_meanflow() -> None:
    with pytest.raises(ConfigError, match="use_r"):
        build(tiny(create_config, net=mf_net(use_r=False)))
    with pytest.raises(ConfigError, match="rectified-flow"):
        build(tiny(create_config, net=small_toy_mlp(use_r=True)))


def test_sampling_one_and_more_steps() -> None:
    model = perturbed(build(tiny(create_config, net=mf_net())))
    noise = torch.randn(8, 2)
    ones, zeros = torch.ones(8), torch.zeros(8)
    with torch.no_grad():
        one = noise - model.net(noise, ones, r=zeros, fwd_pred_type="flow")  # x0 = x1 - u(x1, 0, 1)
        mid = noise - 0.5 * model.net(noise, ones, r=0.5 * ones, fwd_pred_type="flow")
        two = mid - 0.5 * model.net(mid, 0.5 * ones, r=zeros, fwd_pred_type="flow")
    torch.testing.assert_close(model.generator_fn(model.net, noise), one)
    torch.testing.assert_close(model.generator_fn(model.net, noise, steps=2), two)
    model.config.t_list = [1.0, 0.5]
    torch.testing.assert_close(model.generator_fn(model.net, noise), two)


@pytest.mark.parametrize("recipe", ["Toy/config_meanflow_toy", "Digits/config_meanflow_digits"])
def test_recipes_build(recipe: str) -> None:
    config = load_config(recipe)
    model = instantiate(config.model_class, config=config.model)
    assert model.teacher is None
    noise = torch.randn(4, *config.model.input_shape)
    labels = torch.arange(4) if config.model.num_classes else None
    assert model.generator_fn(model.net, noise, None, labels).shape == noise.shape
    if config.model.num_classes:  # the U-Net's JVP through GroupNorm, attention and the label embedding
        loss_dict, _ = model.single_train_step({"real": torch.rand(4, 1, 8, 8) * 2 - 1, "condition": labels}, 0)
        assert torch.isfinite(loss_dict["total_loss"]) and model.tangents.mode == "auto"


def meanflow_config(seed: int = 0) -> BaseConfig:
    """MeanFlow from data (no teacher) on a 128-wide, 2-layer network: 1,200 iterations, a power EMA."""
    config = toy_run_config(create_config(), "meanflow", max_iter=1200)
    config.model.net = mf_net(hidden_dim=128, num_layers=2)
    config.model.ratio_r_neq_t = 0.75
    config.model.net_optimizer.lr = 2e-3
    config.model.use_ema = True
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_POWER_CALLBACK})
    config.trainer.seed = seed
    return config


@pytest.mark.slow
def test_training_from_data_improves_one_step_samples(toy_teacher_energy: float) -> None:
    """The 1-step samples of the EMA network after 1,200 iterations. The raw network's last iterate is too noisy
    to bound: its energy distance over seeds 0-5 (``tests/methods/measure_toy_quality.py``) was 0.0151 0.0411
    0.0233 0.0286 0.0243 0.0224, up to 0.61x its starting value 0.0672 (and 0.99x at seed 4 after 1,600
    iterations); the power EMA's was 0.0166 0.0242 0.0230 0.0188 0.0209 0.0256, at most 0.38x - so the bound 0.6x
    holds with margin.

    MeanFlow learns from data, without a teacher; the toy SFT teacher (same data, EMA, 18 Heun steps; 0.0021 -
    0.0046 over the same seeds, 0.0021 at seed 0) is the diffusion-model quality it is measured against. Worst
    student over best teacher: 0.0256 / 0.0021 = 12.1 -> bound 16x (1.25x that, so that the teacher's and the
    student's random streams may change independently)."""
    config = meanflow_config()
    before = toy_energy(build(config))  # u = 0 at initialisation: the 1-step sample is the noise itself
    model = train(config)
    after = toy_energy(model, net=model.ema_nets["ema"])
    report("MeanFlow (data, 1 step, EMA)", before, after)
    assert after < 0.6 * before
    assert after < 16.0 * toy_teacher_energy
    samples, _ = draw_samples(model, 64, seed=0, steps=2)
    assert samples.shape == (64, 2)
