"""CM (Song et al. 2023; ECT, Geng et al. 2024): CT vs CD targets, the boundary at r = 0, the ECT ratio from
CTScheduleCallback, which modules get gradients, and an end-to-end run on toy data for both modes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from toy_distill import build, has_grad, report, small_toy_mlp, tiny, toy_energy, toy_run_config, train
from omegaconf import DictConfig

from fastgen.callbacks.ct_schedule import ct_ratio
from fastgen.configs.callbacks import CT_SCHEDULE_CALLBACK, GradClip_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.config_utils import load_config
from fastgen.configs.instantiate import instantiate
from fastgen.configs.methods.config_cm import create_config
from fastgen.methods.cm_utils import consistency_distance
from fastgen.networks.noise_schedules import expand_like


def test_ct_builds_no_teacher_and_cd_keeps_it_frozen() -> None:
    ct = build(tiny(create_config, mode="ct"))
    assert ct.teacher is None and "teacher" not in ct.model_dict
    cd = build(tiny(create_config, mode="cd"))
    assert "teacher" in cd.model_dict and not any(p.requires_grad for p in cd.teacher.parameters())
    cd.train()
    assert not cd.teacher.training
    for mode in ("ct", "cd"):
        model = build(tiny(create_config, mode=mode))
        loss_dict, _ = model.single_train_step({"real": torch.randn(32, 2)}, 0)
        loss_dict["total_loss"].backward()
        assert has_grad(model.net)
        assert model.teacher is None or not has_grad(model.teacher)
        assert set(loss_dict) == {"total_loss", "cm_loss", "unweighted_cm_loss", "ct_ratio"}


def test_ct_init_from_a_checkpoint_without_a_teacher(tmp_path: Path) -> None:
    path = tmp_path / "diffusion.pth"
    torch.manual_seed(5)
    torch.save(instantiate(small_toy_mlp(hidden_dim=16, num_layers=1)).state_dict(), path)  # a bare state dict
    model = build(tiny(create_config, mode="ct", teacher_ckpt=str(path), use_ema=True))
    cd = build(tiny(create_config, mode="cd", teacher_ckpt=str(path)))
    for a, b, c in zip(model.net.parameters(), cd.teacher.parameters(), model.ema_nets["ema"].parameters()):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_ratio_zero_is_denoising_on_the_data() -> None:
    # r = 0: the target is x_r = x0 itself (CT) - ECT's diffusion-pretraining limit - with weight 1/t.
    model = build(tiny(create_config, mode="ct", ct_ratio=0.0, distance="l2"))
    x0 = torch.randn(64, 2)
    torch.manual_seed(3)
    loss_dict, out = model.single_train_step({"real": x0}, 0)
    assert torch.all(out["r"] == 0)
    expected = (consistency_distance(out["pred"] - x0, "l2") / out["t"]).mean()
    torch.testing.assert_close(loss_dict["total_loss"].detach(), expected)


def test_ct_target_uses_the_same_noise_and_the_online_network() -> None:
    model = build(tiny(create_config, mode="ct", ct_ratio=0.75))
    x0, eps = torch.randn(8, 2), torch.randn(8, 2)
    t = torch.linspace(0.5, 20.0, 8)
    r = model.r_of(t)
    torch.testing.assert_close(r, 0.75 * t)
    x_t = model.noise_scheduler.add_noise(x0, eps, t)
    x_r = model.earlier_state(x0, eps, x_t, t, r, None)
    torch.testing.assert_close(x_r, x0 + expand_like(r, x0) * eps)
    with torch.no_grad():
        expected = model.net(x_r, r, fwd_pred_type="x0")
    torch.testing.assert_close(model.consistency_target(x_r, r, None), expected)
    # ECT's n(t) factor moves r below ratio * t (more so for small t) and clips it at 0.
    model.config.ratio_k, model.config.ratio_b = 8.0, 1.0
    r_k = model.r_of(t)
    assert torch.all(r_k <= r) and torch.all(r_k >= 0) and r_k[0] == 0


@pytest.mark.parametrize("solver", ["euler", "heun"])
def test_cd_takes_one_teacher_ode_step(solver: str) -> None:
    model = build(tiny(create_config, mode="cd", cd_solver=solver))
    x_t, t = torch.randn(6, 2), torch.tensor([0.5, 1.0, 2.0, 5.0, 10.0, 40.0])
    r = torch.tensor([0.25, 0.5, 0.0, 2.5, 5.0, 20.0])

    def flow(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:  # EDM: dx/dsigma = (x - D(x)) / sigma
        return (x - model.teacher(x, s, fwd_pred_type="x0")) / s[:, None]

    with torch.no_grad():
        d = flow(x_t, t)
        euler = x_t + (r - t)[:, None] * d
        expected = euler.clone()
        if solver == "heun":
            pos = r > 0
            expected[pos] = x_t[pos] + (r - t)[pos, None] * 0.5 * (d[pos] + flow(euler[pos], r[pos]))
    torch.testing.assert_close(model.teacher_step(x_t, t, r, None), expected)


def test_distances() -> None:
    delta = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    torch.testing.assert_close(consistency_distance(delta, "l2"), torch.tensor([12.5, 0.0]))
    torch.testing.assert_close(consistency_distance(delta, "pseudo_huber", c=1.0), torch.tensor([26**0.5 - 1, 0.0]))
    c = 0.00054 * 2**0.5
    torch.testing.assert_close(consistency_distance(delta, "pseudo_huber"), torch.tensor([(25 + c * c) ** 0.5 - c, 0.0]))


def test_the_ratio_follows_ct_schedule_callback() -> None:
    config = toy_run_config(tiny(create_config, mode="ct"), "cm_schedule", max_iter=5, batch_size=16)
    config.trainer.callbacks = DictConfig({**CT_SCHEDULE_CALLBACK})
    config.trainer.callbacks.ct_schedule.kimg_per_stage = 0.032  # a stage every 2 steps of 16
    model = train(config)
    assert model.ct_stage == 2 and model.ct_ratio == ct_ratio(2)
    _, out = model.single_train_step({"real": torch.randn(16, 2)}, 5)
    torch.testing.assert_close(out["r"], ct_ratio(2) * out["t"])


@pytest.mark.parametrize("recipe", ["Toy/config_cm_toy", "Digits/config_cm_digits"])
def test_recipes_build(recipe: str) -> None:
    config = load_config(recipe)
    model = instantiate(config.model_class, config=config.model)
    assert "ct_schedule" in config.trainer.callbacks
    if recipe.startswith("Digits"):  # consistency distillation from the shipped teacher, sampled from an EMA
        assert config.model.mode == "cd" and model.teacher is not None and list(model.ema_nets) == ["ema"]
        assert list(config.trainer.callbacks)[-1] == "wandb"  # the EMA updates before samples are logged
    else:
        assert model.teacher is None
    noise = torch.randn(4, *config.model.input_shape)
    labels = torch.arange(4) if config.model.num_classes else None
    assert model.generator_fn(model.net, noise, None, labels).shape == noise.shape


def cm_config(mode: str, teacher_ckpt: Path, seed: int = 0) -> BaseConfig:
    """CT or CD on the test's small network: 1,000 iterations, ECT's ratio schedule over four stages."""
    config = toy_run_config(create_config(), f"cm_{mode}", max_iter=1000)
    config.model.net = small_toy_mlp()
    config.model.teacher_ckpt = str(teacher_ckpt)
    config.model.mode = mode
    config.model.t_mean, config.model.t_std = -1.1, 2.0
    config.model.net_optimizer.lr = 3e-4
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **CT_SCHEDULE_CALLBACK})
    config.trainer.callbacks.ct_schedule.kimg_per_stage = 64.0  # 250 steps per stage: ratio 0.5 ... 0.9375
    config.trainer.seed = seed
    return config


# 1-step CM energy distance over seeds 0-5 of tests/methods/measure_toy_quality.py; the teacher (EMA, 18 Heun steps)
# scored 0.0021 - 0.0046 over the same seeds (0.0021 at seed 0, which the test uses). Bounds: 1.25x the worst
# student over the best teacher, so that either random stream may change.
#   CT 0.0162 0.0126 0.0249 0.0200 0.0335 0.0509  worst / best teacher 24.0 -> bound 30x
#   CD 0.0164 0.0070 0.0071 0.0088 0.0116 0.0189  8.9 -> 12x
TEACHER_FACTOR = {"ct": 30.0, "cd": 12.0}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ct", "cd"])
def test_training_improves_one_step_samples(mode: str, toy_teacher_ckpt: Path, toy_teacher_energy: float) -> None:
    config = cm_config(mode, toy_teacher_ckpt)
    before = toy_energy(build(config))  # the diffusion model evaluated as a 1-step generator
    after = toy_energy(train(config))
    report(f"CM ({mode.upper()}, 1 step)", before, after)
    assert after < 0.1 * before
    assert after < TEACHER_FACTOR[mode] * toy_teacher_energy
