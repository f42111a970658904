"""DMD2, f-distill and LADD on tiny networks: which modules get gradients, the DMD gradient (DMD Eq. 7-8), the
two-time-scale alternation with per-module optimizer/scheduler steps, CFG, R1, multi-step students."""

from __future__ import annotations

import pytest
import torch
from omegaconf import DictConfig

from fastgen.configs.config import BaseConfig
from fastgen.configs.data import digits_loader, toy_loader
from fastgen.configs.instantiate import LazyCall, instantiate
from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config
from fastgen.configs.methods.config_f_distill import create_config as f_distill_config
from fastgen.configs.methods.config_ladd import create_config as ladd_config
from fastgen.configs.net import edm_unet_8x8, toy_mlp
from fastgen.methods.dmd2 import DMD2Model, frozen
from fastgen.methods.f_distill import f_divergence_weight
from fastgen.trainer import Trainer
from fastgen.utils.errors import ConfigError


DMD2 = "fastgen.methods.dmd2.DMD2Model"
SID = "fastgen.methods.sid.SiDModel"  # DMD2 with SiD's generator loss: every shared behaviour is tested for both


def toy_dmd2(gan: bool = False, method: str = DMD2, **model: object) -> BaseConfig:
    config = dmd2_config()
    config.model_class = LazyCall(method)()
    config.model.net = toy_mlp(hidden_dim=32, num_layers=2)
    config.model.input_shape = [2]
    config.model.gan_loss_weight_gen = 0.1 if gan else 0.0
    for key, value in model.items():
        setattr(config.model, key, value)
    config.dataloader_train = toy_loader("eight_gaussians", batch_size=16, num_samples=256)
    config.trainer.max_iter = 6
    config.trainer.logging_iter = 2
    config.trainer.save_ckpt_iter = 100
    config.trainer.callbacks = DictConfig({})
    config.log_config.wandb_mode = "disabled"
    return config


def digits_dmd2(**model: object) -> BaseConfig:
    config = dmd2_config()
    config.model.net = edm_unet_8x8(num_classes=10, model_channels=8, channel_mult=[1, 2])
    config.model.num_classes = 10
    config.model.gan_loss_weight_gen = 0.1
    for key, value in model.items():
        setattr(config.model, key, value)
    config.dataloader_train = digits_loader(batch_size=8)
    return config


def build(config: BaseConfig) -> DMD2Model:
    torch.manual_seed(0)
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    model.init_optimizers()
    return model


def grads(module: torch.nn.Module) -> bool:
    return any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def perturb(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))


@pytest.mark.parametrize("method", [DMD2, SID])
@pytest.mark.parametrize("gan", [False, True])
def test_student_iteration_trains_only_the_student(gan: bool, method: str) -> None:
    model = build(toy_dmd2(gan=gan, method=method))
    perturb(model.fake_score)  # a fake score equal to the teacher gives a zero DMD gradient
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, iteration=0)
    loss_dict["total_loss"].backward()
    assert grads(model.net)
    assert not grads(model.teacher) and not grads(model.fake_score)
    if gan:
        assert not grads(model.discriminator) and "gan_gen_loss" in loss_dict
    assert all(p.requires_grad for p in model.fake_score.parameters())  # `frozen` restored the flags
    assert model.get_optimizers(0) == ["net"]


@pytest.mark.parametrize("method", [DMD2, SID])
@pytest.mark.parametrize("gan", [False, True])
def test_critic_iteration_trains_fake_score_and_discriminator_only(gan: bool, method: str) -> None:
    model = build(toy_dmd2(gan=gan, method=method))
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, iteration=1)
    loss_dict["total_loss"].backward()
    assert grads(model.fake_score) and not grads(model.net) and not grads(model.teacher)
    assert "fake_score_loss" in loss_dict
    if gan:
        assert grads(model.discriminator) and "gan_disc_loss" in loss_dict
        assert model.get_optimizers(1) == ["fake_score", "discriminator"]
    else:
        assert model.get_optimizers(1) == ["fake_score"]


@pytest.mark.parametrize("weighting", ["schedule", "uniform"])
def test_fake_score_loss_follows_its_weighting(weighting: str) -> None:
    """The critic's denoising loss is the mean of ``w(t) ||D_fake(x_t, t) - x||^2 / d`` over the batch, with
    ``w = lambda(sigma)`` of EDM (the schedule's weight) or ``w = 1`` ("uniform"), on the student's samples."""
    model = build(toy_dmd2(fake_score_loss_weighting=weighting))
    perturb(model.fake_score)
    torch.manual_seed(5)
    loss_dict, out = model.single_train_step({"real": torch.randn(16, 2)}, iteration=1)
    with torch.no_grad():
        x, t = out["generated"], out["t"]
        per_sample = (model.fake_score(out["x_t"], t, fwd_pred_type="x0") - x).square().mean(dim=1)
        weight = model.noise_scheduler.loss_weight(t) if weighting == "schedule" else torch.ones_like(t)
    torch.testing.assert_close(loss_dict["fake_score_loss"], (weight * per_sample).mean())


def student_step_on(model: DMD2Model, x: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict, torch.Tensor]:
    """One student iteration with ``x`` standing in for the generator's output (fake score perturbed first, so
    that it differs from the teacher): ``(loss_dict, outputs, d total_loss / d x)``."""
    perturb(model.fake_score)
    x.requires_grad_(True)
    model.generate_for_training = lambda noise, condition, real=None: x  # type: ignore[method-assign]
    torch.manual_seed(3)
    loss_dict, out = model.single_train_step({"real": torch.randn(x.shape[0], 2)}, iteration=0)
    (grad_x,) = torch.autograd.grad(loss_dict["total_loss"], x, retain_graph=True)
    return loss_dict, out, grad_x


def denoised_pair(model: DMD2Model, out: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(D_real, D_fake, w)`` at the step's ``x_t`` and ``t``, with DMD's weight ``w = 1 / mean|x - D_real|``."""
    with torch.no_grad():
        d_real = model.teacher(out["x_t"], out["t"], fwd_pred_type="x0")
        d_fake = model.fake_score(out["x_t"], out["t"], fwd_pred_type="x0")
        return d_real, d_fake, 1.0 / (x.detach() - d_real).abs().mean(dim=1, keepdim=True)


def test_dmd_gradient_matches_the_formula() -> None:
    """d L_VSD / d x = (D_fake - D_real) / mean|x - D_real| / numel (DMD Eq. 7-8 through the surrogate)."""
    model = build(toy_dmd2())
    x = torch.randn(8, 2)
    _, out, grad_x = student_step_on(model, x)
    d_real, d_fake, w = denoised_pair(model, out, x)
    torch.testing.assert_close(grad_x, (d_fake - d_real) * w / x.numel(), rtol=1e-4, atol=1e-7)


def test_dmd_gradient_averages_several_noisings_per_sample() -> None:
    """``vsd_num_noise = k``: each sample's gradient is the mean of the formula over its k (t, eps) draws."""
    model = build(toy_dmd2(vsd_num_noise=3))
    perturb(model.fake_score)
    x = torch.randn(4, 2, requires_grad=True)
    model.generate_for_training = lambda noise, condition, real=None: x  # type: ignore[method-assign]
    loss_dict, out = model.single_train_step({"real": torch.randn(4, 2)}, iteration=0)
    (grad_x,) = torch.autograd.grad(loss_dict["total_loss"], x)
    assert out["x_t"].shape == (12, 2)
    with torch.no_grad():
        d_real = model.teacher(out["x_t"], out["t"], fwd_pred_type="x0")
        d_fake = model.fake_score(out["x_t"], out["t"], fwd_pred_type="x0")
        w = 1.0 / (x.repeat(3, 1) - d_real).abs().mean(dim=1, keepdim=True)
        expected = ((d_fake - d_real) * w).view(3, 4, 2).mean(dim=0) / x.numel()
    torch.testing.assert_close(grad_x, expected, rtol=1e-4, atol=1e-7)
    with pytest.raises(ConfigError, match="vsd_num_noise"):
        build(toy_dmd2(vsd_num_noise=0))


@pytest.mark.parametrize(("method", "key"), [(DMD2, "vsd_loss"), (SID, "sid_loss")])
def test_fake_score_equal_to_teacher_gives_zero_dmd_gradient(method: str, key: str) -> None:
    model = build(toy_dmd2(method=method))
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, iteration=0)
    assert float(loss_dict[key]) == 0.0
    loss_dict["total_loss"].backward()
    assert not grads(model.net)


def test_classifier_free_guidance_of_the_teacher() -> None:
    model = build(digits_dmd2())
    perturb(model.teacher)
    x_t, t = torch.randn(4, 1, 8, 8), torch.full((4,), 2.0)
    labels = torch.tensor([0, 1, 2, 3])
    cond = model.teacher(x_t, t, condition=labels, fwd_pred_type="x0")
    uncond = model.teacher(x_t, t, condition=torch.zeros(4, 10), fwd_pred_type="x0")
    torch.testing.assert_close(model.teacher_x0(x_t, t, labels, guidance_scale=1.0), cond, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.teacher_x0(x_t, t, labels, guidance_scale=0.0), uncond, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.teacher_x0(x_t, t, labels, guidance_scale=3.0), uncond + 3.0 * (cond - uncond),
                               rtol=1e-4, atol=1e-5)


def test_r1_penalty_on_noised_real_data() -> None:
    model = build(digits_dmd2(r1_weight=1.0))
    batch = {"real": torch.rand(4, 1, 8, 8) * 2 - 1, "condition": torch.tensor([0, 1, 2, 3])}
    loss_dict, _ = model.single_train_step(batch, iteration=1)
    assert float(loss_dict["r1_loss"]) > 0
    loss_dict["total_loss"].backward()
    assert grads(model.discriminator) and grads(model.fake_score)
    with torch.no_grad():  # validation: no R1 (needs autograd), nothing breaks
        assert "r1_loss" not in model.single_train_step(batch, iteration=1)[0]


@pytest.mark.parametrize("features", ["teacher", "fake_score"])
def test_finite_difference_r1_estimates_the_exact_penalty(features: str) -> None:
    """The finite-difference R1 (one more forward pass) agrees with the double-backward one on the same noised real
    samples (same seed: everything up to the perturbation is drawn alike), trains the same modules and leaves the
    logits of the real samples unchanged: the perturbed copies are a separate part of the batch."""
    real = torch.randn(512, 2)
    penalties, real_logits = {}, {}
    for estimator in ("exact", "finite_difference"):
        model = build(toy_dmd2(gan=True, r1_weight=1.0, r1_estimator=estimator, discriminator_features=features,
                               discriminator_minibatch_std=4))
        logits: list[torch.Tensor] = []
        model.discriminator.register_forward_hook(lambda _m, _a, out: logits.append(out.detach()))
        torch.manual_seed(3)
        loss_dict, _ = model.single_train_step({"real": real}, iteration=1)
        penalties[estimator] = float(loss_dict["r1_loss"])
        real_logits[estimator] = logits[-1][-1024:-512] if estimator == "finite_difference" else logits[-1][-512:]
        loss_dict["total_loss"].backward()
        assert grads(model.discriminator) and not grads(model.teacher) and not grads(model.net)
        assert grads(model.fake_score)
    assert penalties["exact"] > 0
    assert penalties["finite_difference"] == pytest.approx(penalties["exact"], rel=0.2)
    torch.testing.assert_close(real_logits["exact"], real_logits["finite_difference"])


def test_finite_difference_r1_needs_a_positive_step() -> None:
    with pytest.raises(ConfigError, match="model.r1_fd_sigma must be > 0"):
        build(toy_dmd2(gan=True, r1_weight=1.0, r1_estimator="finite_difference", r1_fd_sigma=0.0))


def test_multi_step_student_backward_simulation_and_sampling() -> None:
    model = build(digits_dmd2(t_list=[80.0, 1.0, 0.2]))
    noise = torch.randn(4, 1, 8, 8) * 80
    labels = torch.tensor([0, 1, 2, 3])
    for seed in range(4):  # each k in {0, 1, 2} gives a student output with a graph to the student only
        torch.manual_seed(seed)
        x = model.generate_for_training(noise, labels)
        assert x.shape == noise.shape and x.requires_grad
    samples, sample_labels = model.sample(6, generator=torch.Generator().manual_seed(0))
    assert samples.shape == (6, 1, 8, 8) and sample_labels.tolist() == [0, 1, 2, 3, 4, 5]
    again, _ = model.sample(6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(samples, again)  # the re-noising draws from the sampling generator


def test_teacher_samples_with_heun_and_students_in_one_step() -> None:
    model = build(toy_dmd2())
    calls: list[int] = []
    model.net.register_forward_hook(lambda *a: calls.append(1))
    model.sample(5, net=model.net)
    assert len(calls) == 1
    model.teacher.register_forward_hook(lambda *a: calls.append(2))
    model.sample(5, net=model.teacher, steps=3)
    assert calls.count(2) == 5  # Heun: 2 * 3 - 1 evaluations


def test_only_stepped_modules_and_their_schedulers_advance(tmp_path: object) -> None:
    config = toy_dmd2(gan=True, student_update_freq=3)
    step_lr = LazyCall("torch.optim.lr_scheduler.StepLR")(step_size=1000, gamma=0.5)
    config.model.net_scheduler = step_lr
    config.model.fake_score_scheduler = step_lr
    config.model.discriminator_scheduler = step_lr
    config.trainer.max_iter = 7
    trainer = Trainer(config)
    model = trainer.run()
    # iterations 0, 3, 6 train the student; 1, 2, 4, 5 the critic
    assert model.scheduler_dict["net"].last_epoch == 3
    assert model.scheduler_dict["fake_score"].last_epoch == 4
    assert model.scheduler_dict["discriminator"].last_epoch == 4
    assert model.optimizer_dict["net"].state[model.optimizer_dict["net"].param_groups[0]["params"][0]]["step"] == 3


def test_frozen_restores_flags_after_an_exception() -> None:
    layer = torch.nn.Linear(2, 2)
    layer.bias.requires_grad_(False)
    with pytest.raises(RuntimeError), frozen(layer):
        assert not layer.weight.requires_grad
        raise RuntimeError
    assert layer.weight.requires_grad and not layer.bias.requires_grad


def test_f_divergence_weights() -> None:
    log_r = torch.tensor([-1.0, 0.0, 2.0])
    r = log_r.exp()
    torch.testing.assert_close(f_divergence_weight(log_r, "reverse_kl"), torch.ones(3))
    torch.testing.assert_close(f_divergence_weight(log_r, "forward_kl"), r)
    torch.testing.assert_close(f_divergence_weight(log_r, "js"), r / (r + 1))
    torch.testing.assert_close(f_divergence_weight(log_r, "jeffreys"), r + 1)
    torch.testing.assert_close(f_divergence_weight(log_r, "squared_hellinger"), r.sqrt() / 2)
    with pytest.raises(ValueError):
        f_divergence_weight(log_r, "tv")


def test_f_distill_needs_the_discriminator_and_weights_the_gradient() -> None:
    config = f_distill_config()
    config.model.net = toy_mlp(hidden_dim=32, num_layers=2)
    config.model.input_shape = [2]
    model = build(config)
    perturb(model.fake_score)
    perturb(model.discriminator)
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, iteration=0)
    assert float(loss_dict["f_weight_max"]) > 1.0  # non-uniform weights, normalised to mean 1
    config.model.gan_loss_weight_gen = 0.0
    with pytest.raises(ConfigError, match="gan_loss_weight_gen"):
        instantiate(config.model_class, config=config.model)


@pytest.mark.parametrize("minibatch_std", [0, 2])
def test_ladd_trains_heads_on_frozen_teacher_features(minibatch_std: int) -> None:
    config = ladd_config()
    config.model.net = edm_unet_8x8(num_classes=10, model_channels=8, channel_mult=[1, 2])
    config.model.num_classes = 10
    config.model.distill_loss_weight = 0.5
    config.model.discriminator_minibatch_std = minibatch_std
    model = build(config)
    assert all(head.minibatch_std_group == minibatch_std for head in model.discriminator.heads)
    batch = {"real": torch.rand(4, 1, 8, 8) * 2 - 1, "condition": torch.tensor([0, 1, 2, 3])}
    loss_dict, _ = model.single_train_step(batch, iteration=0)
    loss_dict["total_loss"].backward()
    assert grads(model.net) and not grads(model.teacher) and not grads(model.discriminator)
    assert {"gan_gen_loss", "distill_loss"} <= set(loss_dict)
    model.zero_grad(set_to_none=True)
    loss_dict, _ = model.single_train_step(batch, iteration=1)
    loss_dict["total_loss"].backward()
    assert grads(model.discriminator) and not grads(model.net) and not grads(model.teacher)
    assert model.get_optimizers(0) == ["net"] and model.get_optimizers(1) == ["discriminator"]


def test_ladd_r1_penalty_estimates_the_squared_gradient_of_the_heads_on_noised_real_data() -> None:
    """LADD's finite-difference R1 (``r1_weight``) agrees with ``||grad_x D(real_t)||^2`` computed by autograd on the
    same noised real samples, and only discriminator steps pay it. The generated, real and moved real samples go
    through the frozen teacher in one pass, and judging them one at a time gives the same losses."""
    config = ladd_config()
    config.model.net = edm_unet_8x8(num_classes=10, model_channels=8, channel_mult=[1, 2])
    config.model.num_classes = 10
    config.model.r1_weight = 2.0
    model = build(config)
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]] = []
    discriminate = model.discriminate
    model.discriminate = lambda x_t, t, c, parts=1: (seen.append((x_t.detach(), t, c, parts))
                                                     or discriminate(x_t, t, c, parts))
    teacher_passes = []
    model.teacher.register_forward_hook(lambda *args: teacher_passes.append(1))
    batch = {"real": torch.rand(512, 1, 8, 8) * 2 - 1, "condition": torch.arange(512) % 10}
    torch.manual_seed(0)
    loss_dict, _ = model.single_train_step(batch, iteration=1)
    assert len(seen) == 1 and seen[0][3] == 3 and len(teacher_passes) == 1  # one pass: generated, real, moved real
    fake_t, real_t, moved_t = seen[0][0].chunk(3)
    t, condition = seen[0][1][:512], seen[0][2][:512]
    with torch.no_grad():
        d_fake, d_real, d_moved = (discriminate(x, t, condition) for x in (fake_t, real_t, moved_t))
    hinge = float(torch.relu(1.0 - d_real).mean() + torch.relu(1.0 + d_fake).mean())
    assert float(loss_dict["gan_disc_loss"]) == pytest.approx(hinge, rel=1e-5)
    fd_r1 = float((d_moved - d_real).square().mean()) / config.model.r1_fd_sigma ** 2
    assert float(loss_dict["r1_loss"]) == pytest.approx(fd_r1, rel=1e-4)
    real_t = real_t.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(discriminate(real_t, t, condition).sum(), real_t)
    exact = float(grad.square().flatten(1).sum(dim=1).mean())
    assert exact > 0 and float(loss_dict["r1_loss"]) == pytest.approx(exact, rel=0.25)
    assert float(loss_dict["total_loss"].detach()) == pytest.approx(hinge + 0.5 * 2.0 * float(loss_dict["r1_loss"]), rel=1e-5)
    assert "r1_loss" not in model.single_train_step(batch, iteration=0)[0]  # a student step


def test_ema_follows_only_the_student_updates() -> None:
    """The student's EMA moves only in student iterations, and the power schedule's t counts those updates."""
    from fastgen.configs.callbacks import EMA_POWER_CALLBACK

    config = toy_dmd2(student_update_freq=3, use_ema=True)
    config.trainer.max_iter = 7  # student iterations: 0, 3, 6
    config.trainer.callbacks = DictConfig({**EMA_POWER_CALLBACK})
    trainer = Trainer(config)
    seen: list[tuple[int, float]] = []
    ema_callback = trainer.callbacks["ema"]
    original = ema_callback.update

    def record(model: object, beta: float) -> None:
        seen.append((trainer.iteration, beta))
        original(model, beta)

    ema_callback.update = record  # type: ignore[method-assign]
    trainer.run()
    gamma = ema_callback.gamma
    assert [it for it, _ in seen] == [1, 4, 7]  # completed-step counts after iterations 0, 3, 6
    assert [beta for _, beta in seen] == pytest.approx([(1 - 1 / t) ** (gamma + 1) for t in (1, 2, 3)])
    assert ema_callback.num_updates == 3


def test_regression_loss_regresses_onto_the_teachers_own_samples() -> None:
    """DMD Eq. 9: with the fake score equal to the teacher (zero DMD gradient), the student's only loss is
    mean ||G(z) - ODE(z)||^2 over pairs the teacher solved with its Heun sampler; it trains only the student."""
    model = build(toy_dmd2(regression_loss_weight=0.5, regression_num_pairs=12, regression_batch_size=5,
                           sample_steps=4))
    noise, labels, target = model.regression_pairs(torch.device("cpu"))
    assert labels is None and noise.shape == target.shape == (12, 2)
    torch.testing.assert_close(target, model.generator_fn(model.teacher, noise, steps=4))
    again = build(toy_dmd2(regression_loss_weight=0.5, regression_num_pairs=12, sample_steps=4))
    torch.testing.assert_close(again.regression_pairs(torch.device("cpu"))[2], target)  # seeded: same pairs

    torch.manual_seed(1)
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, iteration=0)
    assert float(loss_dict["vsd_loss"]) == 0.0 and float(loss_dict["regression_loss"]) > 0
    torch.manual_seed(1)  # replay the step's draws up to the pairs' index: data, noise, t, re-noising
    torch.randn(16, 2)
    model.sample_noise(16, torch.zeros(1))
    model.sample_vsd_t(16, torch.device("cpu"))
    torch.randn(16, 2)
    index = torch.randint(12, (5,))
    with torch.no_grad():
        expected = ((model.net(noise[index], torch.full((5,), 80.0), fwd_pred_type="x0") - target[index]) ** 2).mean()
    torch.testing.assert_close(loss_dict["regression_loss"], expected)
    torch.testing.assert_close(loss_dict["total_loss"], 0.5 * expected)
    loss_dict["total_loss"].backward()
    assert grads(model.net) and not grads(model.fake_score) and not grads(model.teacher)


def test_regression_pairs_are_class_balanced_for_conditional_models() -> None:
    model = build(digits_dmd2(regression_loss_weight=1.0, regression_num_pairs=20, sample_steps=2))
    noise, labels, target = model.regression_pairs(torch.device("cpu"))
    assert labels is not None and labels.tolist() == [i % 10 for i in range(20)]
    assert noise.shape == target.shape == (20, 1, 8, 8) and torch.isfinite(target).all()


def test_regression_needs_pairs() -> None:
    with pytest.raises(ConfigError, match="regression_num_pairs"):
        build(toy_dmd2(regression_loss_weight=1.0, regression_num_pairs=0))


def test_gan_on_fake_score_features_reads_real_samples_without_the_decoder() -> None:
    """Default ``discriminator_features="fake_score"``: one full fake-score pass gives the denoiser output and the
    fake samples' features; the real samples' features come from a pass that stops at the features."""
    model = build(toy_dmd2(gan=True))
    calls: list[tuple[bool, bool, int]] = []
    model.fake_score.register_forward_pre_hook(
        lambda _m, args, kwargs: calls.append((bool(kwargs.get("feature_indices")), bool(kwargs.get("features_only")),
                                               args[0].shape[0])), with_kwargs=True)
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, iteration=1)
    assert calls == [(True, False, 16), (True, True, 16)]
    loss_dict["total_loss"].backward()
    assert grads(model.fake_score) and grads(model.discriminator) and not grads(model.teacher)


def test_discriminator_on_teacher_features_leaves_the_fake_score_to_denoising() -> None:
    """``discriminator_features="teacher"``: the head reads the frozen teacher's features, so in a critic step the
    fake score runs once, without features, and gets only the denoising loss's gradient. The teacher reads the
    fake and the real batch in one pass that stops at the features (``features_only``)."""
    model = build(toy_dmd2(gan=True, discriminator_features="teacher"))
    calls: dict[str, list[tuple[bool, bool, int]]] = {"teacher": [], "fake_score": []}
    for name in calls:
        getattr(model, name).register_forward_pre_hook(
            lambda _m, args, kwargs, name=name: calls[name].append(
                (bool(kwargs.get("feature_indices")), bool(kwargs.get("features_only")), args[0].shape[0])),
            with_kwargs=True)
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, iteration=1)
    assert calls == {"teacher": [(True, True, 32)], "fake_score": [(False, False, 16)]}
    loss_dict["total_loss"].backward()
    assert grads(model.fake_score) and grads(model.discriminator) and not grads(model.teacher)

    calls["teacher"].clear()
    perturb(model.fake_score)
    for module in model.model_dict.values():
        module.zero_grad(set_to_none=True)
    loss_dict, _ = model.single_train_step({"real": torch.randn(16, 2)}, iteration=0)
    loss_dict["total_loss"].backward()
    assert (True, True, 16) in calls["teacher"] and "gan_gen_loss" in loss_dict
    assert grads(model.net) and not grads(model.discriminator) and not grads(model.teacher)


@pytest.mark.parametrize(("recipe", "max_iter"), [("Digits/config_dmd2_digits_long", 15000),
                                                   ("Digits/config_dmd2_digits_kdinit", 4000)])
def test_long_digits_recipe_decays_every_learning_rate_to_a_tenth_by_its_last_iteration(recipe: str,
                                                                                         max_iter: int) -> None:
    """``Digits/config_dmd2_digits_long`` and the same started from a KD student: each module's scheduler spans
    exactly the updates that module gets in ``max_iter`` iterations, so every learning rate reaches 0.1x on the
    run's last iteration, not before or after."""
    from fastgen.configs.config_utils import load_config, validate_config
    from fastgen.configs.experiments.Digits.config_dmd2_digits_kdinit import kd_run_dir

    config = validate_config(load_config(recipe))
    assert config.trainer.max_iter == max_iter
    if recipe.endswith("kdinit"):  # the KD recipe's run directory, which this test has not trained
        assert config.model.student_ckpt == kd_run_dir() and kd_run_dir().endswith("fastgen/digits/config_kd_digits")
        config.model.student_ckpt = None
    assert config.trainer.callbacks.ema.type == "power" and config.trainer.callbacks.ema.gamma == 6.94
    assert list(config.model.feature_indices) == [0, 1, 3] and config.model.discriminator_hidden == 128
    model = build(config)
    start = {name: opt.param_groups[0]["lr"] for name, opt in model.optimizers.items()}
    history: dict[str, list[float]] = {name: [] for name in model.optimizers}
    for iteration in range(config.trainer.max_iter):
        for name in model.get_optimizers(iteration):
            model.optimizers[name].step()  # no gradients: a no-op that keeps the scheduler-order check quiet
            model.schedulers[name].step()
            history[name].append(model.optimizers[name].param_groups[0]["lr"])
    for name, lrs in history.items():
        assert lrs[-1] == pytest.approx(0.1 * start[name]), name
        assert lrs[-2] > 0.1 * start[name] * (1 + 1e-6), name  # still decaying one update before the end


@pytest.mark.parametrize("features", ["teacher", "fake_score"])
def test_minibatch_std_groups_never_mix_generated_and_real_samples(features: str) -> None:
    """With ``discriminator_minibatch_std`` the critic's logits for the generated half do not depend on the real
    half, even where the teacher scores both in one batch (6 + 6 samples, groups of 4: a naive grouping of the
    12 would straddle them)."""
    model = build(toy_dmd2(gan=True, discriminator_features=features, discriminator_minibatch_std=4))
    logits: list[torch.Tensor] = []
    model.discriminator.register_forward_hook(lambda _m, _a, out: logits.append(out.detach()))
    fake_halves = []
    for shift in (0.0, 3.0):
        logits.clear()
        torch.manual_seed(1)
        real = torch.randn(6, 2) + shift
        model.single_train_step({"real": real}, iteration=1)
        fake_halves.append(logits[0][:6])
    assert torch.allclose(*fake_halves)


@pytest.mark.parametrize("features", ["teacher", "fake_score"])
def test_minibatch_std_groups_share_a_noise_level_and_a_class(features: str) -> None:
    """Each minibatch-std group holds one class and one noise level, in the critic's and the student's
    iterations, so its feature spread measures the student's variety within a class rather than the mix of noise
    levels and classes; and a class's logits do not depend on the other classes' samples."""
    model = build(digits_dmd2(discriminator_features=features, discriminator_minibatch_std=4))
    labels = torch.tensor([3, 1, 3, 3, 1, 3, 3, 7])
    real = torch.rand(8, 1, 8, 8) * 2 - 1
    groups = model.gan_groups(model.condition_of({"real": real, "condition": labels}), 8, real.device)
    assert groups is not None and int(groups.max()) + 1 == 4  # 3: groups of 4 and 1; 1: one of 2; 7: one of 1
    logits: list[torch.Tensor] = []
    model.discriminator.register_forward_hook(lambda _m, _a, out: logits.append(out.detach()))
    for iteration in (0, 1):
        torch.manual_seed(iteration)
        _, outputs = model.single_train_step({"real": real, "condition": labels}, iteration=iteration)
        for g in groups.unique():
            assert outputs["t"][groups == g].unique().numel() == 1
        assert outputs["t"].unique().numel() == 4
    changed = real.clone()
    changed[labels == 1] += 0.5
    critic_logits = []
    for batch in (real, changed):
        logits.clear()
        torch.manual_seed(5)
        model.single_train_step({"real": batch, "condition": labels}, iteration=1)
        critic_logits.append(logits[-1][-8:])  # the real half
    assert torch.allclose(critic_logits[0][labels != 1], critic_logits[1][labels != 1])
    assert not torch.allclose(critic_logits[0][labels == 1], critic_logits[1][labels == 1])


@pytest.mark.parametrize("make", [lambda: toy_dmd2(gan=True), ladd_config])
def test_a_negative_minibatch_std_group_is_a_config_error(make) -> None:
    config = make()
    if config.model.net is None:
        config.model.net = toy_mlp(hidden_dim=32, num_layers=2)
        config.model.input_shape = [2]
    config.model.discriminator_minibatch_std = -1
    with pytest.raises(ConfigError, match="model.discriminator_minibatch_std must be >= 0"):
        build(config)
