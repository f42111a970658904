"""sCM (Lu & Song 2024): TrigFlow maps and schedule, the tangent warm-up (also when it is 0), forward-mode AD vs
finite differences with the automatic fallback, which modules get gradients, and an sCD run on toy data."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from toy_distill import build, has_grad, report, small_toy_mlp, tiny, toy_energy, toy_run_config, train
from torch import nn

from fastgen.configs.config import BaseConfig
from fastgen.configs.config_utils import load_config
from fastgen.configs.instantiate import LazyCall, instantiate
from fastgen.configs.methods.config_scm import create_config, trigflow_schedule
from fastgen.configs.net import edm_schedule, flow_schedule
from fastgen.evaluation.sampling import draw_samples
from fastgen.methods.cm_utils import Tangents, map_state
from fastgen.networks.noise_schedules import EDMNoiseScheduler, RectifiedFlowScheduler, TrigFlowScheduler


class _NoForwardAD(torch.autograd.Function):
    """An op with a backward but no forward-mode (jvp) formula, like some fused kernels."""

    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        return grad


class NoForwardADBackbone(nn.Module):
    """The toy MLP with one op that forward-mode AD cannot go through."""

    def __init__(self) -> None:
        super().__init__()
        from fastgen.networks.mlp import MLPDenoiser

        self.inner = MLPDenoiser(data_dim=2, hidden_dim=16, num_layers=1)

    def forward(self, x: torch.Tensor, c_noise: torch.Tensor, **kwargs: object) -> torch.Tensor:
        return self.inner(_NoForwardAD.apply(x), c_noise, **kwargs)


def test_trigflow_schedule() -> None:
    sched = TrigFlowScheduler(sigma_data=0.5)
    t = torch.tensor([0.3, 1.0, 1.4])
    x0, eps = torch.randn(3, 2), torch.randn(3, 2)
    x_t = sched.add_noise(x0, eps, t)
    torch.testing.assert_close(x_t, torch.cos(t)[:, None] * x0 + torch.sin(t)[:, None] * 0.5 * eps)
    v = sched.target(x0, eps, t)  # dx_t/dt = cos(t) z - sin(t) x0
    torch.testing.assert_close(v, torch.cos(t)[:, None] * 0.5 * eps - torch.sin(t)[:, None] * x0)
    torch.testing.assert_close(sched.convert(v, x_t, t, "flow", "x0"), x0, rtol=1e-5, atol=1e-5)
    times = sched.sampling_times(4)
    assert times[0] == pytest.approx(math.atan(80 / 0.5)) and times[-1] == 0 and torch.all(times[:-1] > times[1:])
    assert sched.t_max == pytest.approx(math.atan(160.0))


@pytest.mark.parametrize("dst", [EDMNoiseScheduler(sigma_data=0.5), RectifiedFlowScheduler(),
                                 TrigFlowScheduler(sigma_data=0.7)])
def test_map_state_keeps_x0_and_eps(dst: object) -> None:
    src = TrigFlowScheduler(sigma_data=0.5)
    x0, eps = torch.randn(4, 2), torch.randn(4, 2)
    t = torch.tensor([0.05, 0.5, 1.0, 1.5])
    x_dst, t_dst = map_state(src, dst, src.add_noise(x0, eps, t), t)
    torch.testing.assert_close(x_dst, dst.add_noise(x0, eps, t_dst), rtol=1e-4, atol=1e-5)


def test_an_edm_network_is_a_trigflow_network() -> None:
    # sigma_d F = (cos t x - D(x / cos t, sigma_d tan t)) / sin t equals -sigma_d F_EDM(x / sigma_d, ln(sigma_d tan t) / 4).
    model = build(tiny(create_config, net=small_toy_mlp(edm_schedule(sigma_data=0.5)), mode="ct"))
    with torch.no_grad():
        for p in model.net.parameters():
            p.add_(0.1 * torch.randn_like(p))
        x, t = torch.randn(5, 2), torch.tensor([0.1, 0.4, 0.8, 1.2, 1.5])
        v = model.velocity(model.net, x, t, None)
        f_edm = model.net.backbone(x / 0.5, torch.log(0.5 * torch.tan(t)) / 4)
    torch.testing.assert_close(v, -0.5 * f_edm, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("warmup, iteration, expected", [(0, 0, 1.0), (0, 7, 1.0), (10, 0, 0.0), (10, 4, 0.4),
                                                         (10, 25, 1.0)])
def test_tangent_warmup(warmup: int, iteration: int, expected: float) -> None:
    model = build(tiny(create_config, mode="ct", tangent_warmup_iters=warmup))
    assert model.warmup(iteration) == pytest.approx(expected)
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, iteration)
    assert torch.isfinite(loss_dict["total_loss"]) and float(loss_dict["tangent_warmup"]) == pytest.approx(expected)


def test_forward_ad_and_finite_differences_agree() -> None:
    model = build(tiny(create_config, mode="ct"))
    with torch.no_grad():
        for p in model.net.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x, t = torch.randn(6, 2), torch.linspace(0.2, 1.4, 6)
    tx, tt = torch.randn(6, 2), torch.cos(t) * torch.sin(t)
    fn = lambda x_, t_: model.velocity(model.net, x_, t_, None)  # noqa: E731
    exact = Tangents("forward_ad")(fn, (x, t), (tx, tt))
    approx = Tangents("finite_difference", fd_step=1e-3)(fn, (x, t), (tx, tt))
    torch.testing.assert_close(approx, exact, rtol=2e-2, atol=2e-3)


def test_automatic_fallback_to_finite_differences(caplog: pytest.LogCaptureFixture) -> None:
    net = LazyCall("fastgen.networks.diffusion_net.DiffusionNet")(
        backbone=LazyCall(f"{__name__}.NoForwardADBackbone")(), noise_scheduler=edm_schedule(sigma_data=0.5))
    strict = build(tiny(create_config, net=net, mode="ct", jvp="forward_ad"))
    with pytest.raises(RuntimeError):
        strict.single_train_step({"real": torch.randn(8, 2)}, 0)
    model = build(tiny(create_config, net=net, mode="ct", jvp="auto"))
    with caplog.at_level(logging.WARNING, logger="fastgen.methods.cm_utils"):
        loss_dict, _ = model.single_train_step({"real": torch.randn(8, 2)}, 0)
    assert model.tangents.mode == "finite_difference" and "finite differences" in caplog.text
    assert torch.isfinite(loss_dict["total_loss"])
    loss_dict["total_loss"].backward()
    assert has_grad(model.net)


@pytest.mark.parametrize("mode", ["ct", "cd"])
def test_gradients_and_modules(mode: str) -> None:
    model = build(tiny(create_config, mode=mode, tangent_warmup_iters=0))
    assert (model.teacher is None) == (mode == "ct")
    assert set(model.optimizer_dict) == {"net", "logvar"} and "logvar" in model.model_dict
    with torch.no_grad():
        for p in model.net.parameters():  # a student that differs from the teacher (or from zero output)
            p.add_(0.1 * torch.randn_like(p))
    loss_dict, _ = model.single_train_step({"real": torch.randn(32, 2)}, 0)
    assert set(loss_dict) == {"total_loss", "scm_loss", "tangent_warmup", "tangent_norm", "logvar"}
    loss_dict["total_loss"].backward()
    assert has_grad(model.net) and has_grad(model.logvar)
    assert model.teacher is None or not has_grad(model.teacher)


def test_the_loss_gradient_is_the_tangent() -> None:
    # Without adaptive weighting, d loss / d theta = -2/(B D) sum g^T dF/dtheta: the continuous-time consistency
    # gradient (sCM Eq. 7-8) that the surrogate ||F - sg(F) - g||^2 / D reproduces.
    model = build(tiny(create_config, mode="ct", adaptive_weighting=False, tangent_warmup_iters=0))
    assert "logvar" not in model.model_dict and set(model.optimizer_dict) == {"net"}
    with torch.no_grad():
        for p in model.net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    loss_dict, out = model.single_train_step({"real": torch.randn(8, 2)}, 0)
    loss_grads = torch.autograd.grad(loss_dict["total_loss"], list(model.net.parameters()))
    f = model.velocity(model.net, out["x_t"], out["t"], None) / model.sigma_data
    surrogate = -2.0 / f.numel() * (out["g"] * f).sum()
    for a, b in zip(loss_grads, torch.autograd.grad(surrogate, list(model.net.parameters()))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert bool((out["g"].square().mean(dim=1).sqrt() < 1.0).all())  # normalised: ||g|| / (||g|| + 0.1) < 1


@pytest.mark.parametrize("schedule", [flow_schedule(), trigflow_schedule(sigma_data=0.5)], ids=["rf", "trigflow"])
def test_other_schedules(schedule: object) -> None:
    model = build(tiny(create_config, net=small_toy_mlp(schedule, hidden_dim=16, num_layers=1), mode="cd"))
    low, high = model.time_range()
    assert 0 < low < high < math.pi / 2
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, 3)
    assert torch.isfinite(loss_dict["total_loss"])
    noise = model.noise_scheduler.prior_sample((4, 2))
    assert torch.isfinite(model.generator_fn(model.net, noise, None, None)).all()


@pytest.mark.parametrize("recipe", ["Toy/config_scm_toy", "Digits/config_scm_digits"])
def test_recipes_build(recipe: str) -> None:
    config = load_config(recipe)
    model = instantiate(config.model_class, config=config.model)
    assert model.teacher is not None
    noise = torch.randn(4, *config.model.input_shape)
    labels = torch.arange(4) if config.model.num_classes else None
    assert model.generator_fn(model.net, noise, None, labels).shape == noise.shape


def scm_config(teacher_ckpt: Path, seed: int = 0) -> BaseConfig:
    """sCD (forward-mode AD tangents) on the test's small network: 600 iterations, 100 of tangent warm-up."""
    config = toy_run_config(create_config(), "scm", max_iter=600)
    config.model.net = small_toy_mlp()
    config.model.teacher_ckpt = str(teacher_ckpt)
    config.model.mode = "cd"
    config.model.tangent_warmup_iters = 100
    config.model.net_optimizer.lr = 1e-4
    config.trainer.seed = seed
    return config


@pytest.mark.slow
def test_scd_improves_one_step_samples(toy_teacher_ckpt: Path, toy_teacher_energy: float) -> None:
    """1-step sCD energy distance over seeds 0-5 of ``tests/methods/measure_toy_quality.py``: 0.0201 0.0182 0.0161
    0.0207 0.0126 0.0216; the teacher (EMA, 18 Heun steps) 0.0021 - 0.0046 (0.0021 at seed 0, which the test uses).
    Worst student over best teacher 10.2 -> bound 13x (1.25x that, so that either random stream may change)."""
    config = scm_config(toy_teacher_ckpt)
    before = toy_energy(build(config))
    model = train(config)
    after = toy_energy(model)
    report("sCM (sCD, 1 step, forward-mode AD)", before, after)
    assert model.tangents.mode == "auto" and after < 0.1 * before
    assert after < 13.0 * toy_teacher_energy
    samples, _ = draw_samples(model, 64, seed=0)
    assert samples.shape == (64, 2)
