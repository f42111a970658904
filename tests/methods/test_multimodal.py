"""Multimodal samples (``fastgen.networks.modalities``): the network contract preconditions each modality with its
own time, Heun integrates a dict of modalities as it integrates each alone, multimodal SFT draws shared or
independent times and sums the weighted per-modality losses, and the config is checked."""

from __future__ import annotations

import pytest
import torch
from multimodal_nets import two_stream_net as shared_two_stream_net
from torch import nn

from fastgen.configs.instantiate import LazyCall, instantiate
from fastgen.configs.methods.config_sft import create_config
from fastgen.distributed.keyed_rng import KeyedNoise
from fastgen.networks.noise_schedules import EDMNoiseScheduler, RectifiedFlowScheduler
from fastgen.networks.sampling import heun_sample
from fastgen.utils.errors import ConfigError

SHAPES = {"video": [1, 4, 4, 6], "audio": [2, 4, 5]}


def two_stream_net(schedule=None, num_classes: int = 0):  # noqa: ANN001, ANN201
    return shared_two_stream_net(SHAPES, num_classes=num_classes, schedule=schedule)


def sample_of(batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(batch, *shape, generator=g) for name, shape in SHAPES.items()}


@pytest.mark.parametrize("schedule", [RectifiedFlowScheduler, EDMNoiseScheduler])
def test_each_modality_is_preconditioned_with_its_own_time(schedule) -> None:  # noqa: ANN001
    """The dict forward equals preconditioning each modality by hand (Karras et al. 2022, Eq. 7) and converting."""
    torch.manual_seed(0)
    net = instantiate(two_stream_net(LazyCall(schedule)()))
    sched = net.noise_scheduler
    x = sample_of(3)
    t = {"video": torch.tensor([0.2, 0.5, 0.9]) * sched.t_max, "audio": torch.tensor([0.7, 0.1, 0.4]) * sched.t_max}
    pred = net(x, t, fwd_pred_type="x0")
    coeff = {name: sched.precondition(t[name]) for name in x}
    raw = net.backbone({n: coeff[n][2].reshape(-1, *[1] * (x[n].dim() - 1)) * x[n] for n in x},
                       {n: coeff[n][3] for n in x})
    for name in x:
        shape = (-1, *[1] * (x[name].dim() - 1))
        native = coeff[name][0].reshape(shape) * x[name] + coeff[name][1].reshape(shape) * raw[name]
        expected = sched.convert(native, x[name], t[name], sched.native_pred_type, "x0")
        torch.testing.assert_close(pred[name], expected)
    shared = net(x, torch.tensor([0.3, 0.3, 0.3]) * sched.t_max)
    split = net(x, {n: torch.full((3,), 0.3) * sched.t_max for n in x})
    for name in x:
        torch.testing.assert_close(shared[name], split[name])


def test_heun_integrates_a_dict_of_modalities_as_each_alone() -> None:
    """With a flow that treats the modalities separately, Heun over the dict equals Heun over each modality."""
    sched = RectifiedFlowScheduler()
    x = sample_of(2)
    flows = {"video": lambda v, t: -v * t[:, None, None, None, None], "audio": lambda a, t: torch.sin(a) * t[:, None, None, None]}
    joint = heun_sample(lambda s, t: {n: flows[n](s[n], t) for n in s}, x, sched, 5)
    for name in x:
        torch.testing.assert_close(joint[name], heun_sample(lambda v, t: flows[name](v, t), x[name], sched, 5))


def build(**fields):  # noqa: ANN003, ANN201
    config = create_config()
    config.model.num_classes = fields.pop("num_classes", 0)
    config.model.net = two_stream_net(num_classes=config.model.num_classes)
    config.model.modality_shapes = dict(SHAPES)
    for key, value in fields.items():
        setattr(config.model, key, value)
    torch.manual_seed(0)
    return instantiate(config.model_class, config=config.model)


@pytest.mark.parametrize("times", ["shared", "independent"])
def test_multimodal_sft_draws_times_and_sums_weighted_losses(times: str) -> None:
    model = build(modality_times=times, modality_loss_weights={"audio": 0.25})
    data = {"real": sample_of(4, seed=1)}
    seen = []
    handle = model.net.register_forward_hook(lambda m, args, kwargs, out: seen.append((args, kwargs)), with_kwargs=True)
    model._bound_noise = KeyedNoise(0, torch.arange(4), 3, "train")
    try:
        loss, out = model.single_train_step(data, 3)
    finally:
        model._bound_noise = None
        handle.remove()
    t = out["t"]
    assert set(t) == {"video", "audio"}
    assert torch.equal(t["video"], t["audio"]) == (times == "shared")
    torch.testing.assert_close(loss["total_loss"], loss["denoising_loss_video"] + 0.25 * loss["denoising_loss_audio"])
    # the per-modality loss is the flow-matching regression of that modality
    sched = model.noise_scheduler
    for name in ("video", "audio"):
        x0, x_t, pred = data["real"][name], out["x_t"][name], out["pred"][name]
        eps = (x_t - (1 - t[name]).reshape(-1, *[1] * (x0.dim() - 1)) * x0) / t[name].reshape(-1, *[1] * (x0.dim() - 1))
        expected = (pred - sched.target(x0, eps, t[name])).square().mean()
        torch.testing.assert_close(loss[f"denoising_loss_{name}"], expected, rtol=1e-4, atol=1e-5)
    loss["total_loss"].backward()
    assert model.net.backbone.heads.audio.weight.grad is not None and model.net.backbone.heads.video.weight.grad is not None


def test_multimodal_sampling_returns_every_modality() -> None:
    model = build(num_classes=3, guidance_scale=2.0)
    samples, labels = model.sample(4, generator=torch.Generator().manual_seed(0), steps=3)
    assert {n: list(v.shape[1:]) for n, v in samples.items()} == SHAPES and labels.tolist() == [0, 1, 2, 0]


def test_the_config_is_checked() -> None:
    model = build()
    with pytest.raises(ConfigError, match="modalities"):
        model.single_train_step({"real": {"video": sample_of(2)["video"]}}, 0)
    bad = sample_of(2)
    bad["audio"] = bad["audio"][:, :1]
    with pytest.raises(ConfigError, match="'audio' has samples of shape"):
        model.single_train_step({"real": bad}, 0)
    with pytest.raises(ConfigError, match="modality_loss_weights"):
        build(modality_loss_weights={"sound": 1.0}).single_train_step({"real": sample_of(2)}, 0)
    from fastgen.configs.methods.config_cm import create_config as cm_config

    config = cm_config()
    config.model.net = two_stream_net()
    config.model.modality_shapes = dict(SHAPES)
    with pytest.raises(ConfigError, match="modality_shapes"):
        instantiate(config.model_class, config=config.model)


def build_dmd2(**fields):  # noqa: ANN003, ANN201
    from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config

    config = dmd2_config()
    config.model.num_classes = fields.pop("num_classes", 0)
    config.model.net = two_stream_net(num_classes=config.model.num_classes)
    config.model.modality_shapes = dict(SHAPES)
    for key, value in fields.items():
        setattr(config.model, key, value)
    torch.manual_seed(0)
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    with torch.no_grad():  # a fake score that differs from the teacher
        for p in model.fake_score.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("times", ["shared", "independent"])
def test_multimodal_dmd2_gradient_is_the_per_modality_formula(times: str) -> None:
    """d L / d x_m = w_m (D_fake,m - D_real,m) / mean|x_m - D_real,m| / numel_m (DMD Eq. 7-8 per modality), with
    the teacher guided linearly per modality; the loss sums the weighted modality losses."""
    model = build_dmd2(num_classes=3, guidance_scale=1.5, modality_times=times, modality_loss_weights={"video": 2.0})
    x = {name: v.requires_grad_(True) for name, v in sample_of(4, seed=2).items()}
    model.generate_for_training = lambda noise, condition, real=None: x  # type: ignore[method-assign]
    labels = torch.tensor([0, 1, 2, 0])
    model._bound_noise = KeyedNoise(0, torch.arange(4), 0, "train")
    try:
        loss, out = model.single_train_step({"real": sample_of(4), "condition": labels}, 0)
    finally:
        model._bound_noise = None
    grads = torch.autograd.grad(loss["total_loss"], [x["video"], x["audio"]])
    assert torch.equal(out["t"]["video"], out["t"]["audio"]) == (times == "shared")
    with torch.no_grad():
        onehot = nn.functional.one_hot(labels, 3).float()
        c = model.teacher(out["x_t"], out["t"], condition=onehot, fwd_pred_type="x0")
        u = model.teacher(out["x_t"], out["t"], condition=torch.zeros_like(onehot), fwd_pred_type="x0")
        d_fake = model.fake_score(out["x_t"], out["t"], condition=labels, fwd_pred_type="x0")
    for (name, weight), grad in zip((("video", 2.0), ("audio", 1.0)), grads):
        d_real = u[name] + 1.5 * (c[name] - u[name])
        gap = (x[name].detach() - d_real).abs().flatten(1).mean(1).reshape(-1, *[1] * (x[name].dim() - 1))
        torch.testing.assert_close(grad, weight * (d_fake[name] - d_real) / gap / x[name].numel(), rtol=1e-4, atol=1e-8)


def test_multimodal_dmd2_trains_both_iterations_and_samples() -> None:
    model = build_dmd2(t_list=[1.0, 0.5], student_update_freq=2)
    data = {"real": sample_of(4)}
    student, _ = model.single_train_step(data, 0)
    critic, out = model.single_train_step(data, 1)
    assert {"vsd_loss_video", "vsd_loss_audio", "dmd_grad_norm_audio"} <= set(student)
    assert {"fake_score_loss_video", "fake_score_loss_audio"} <= set(critic)
    critic["total_loss"].backward()
    assert model.fake_score.backbone.heads.audio.weight.grad is not None
    samples, _ = model.sample(3, generator=torch.Generator().manual_seed(0))
    assert {n: list(v.shape[1:]) for n, v in samples.items()} == SHAPES


def test_multimodal_dmd2_refuses_what_it_does_not_do() -> None:
    with pytest.raises(ConfigError, match="vsd_num_noise"):
        build_dmd2(vsd_num_noise=2)
    from fastgen.configs.methods.config_sid import create_config as sid_config

    config = sid_config()
    config.model.net = two_stream_net()
    config.model.modality_shapes = dict(SHAPES)
    with pytest.raises(ConfigError, match="modality_shapes"):
        instantiate(config.model_class, config=config.model)
