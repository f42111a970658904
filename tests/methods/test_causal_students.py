"""CausalKD (the ODE initialisation) and CausVid (DMD2 on diffusion-forcing inputs): each chunk's training input
is at the time drawn for it - the teacher's trajectory state (CausalKD) or the data noised to it (CausVid) -
CausalKD regresses the x0 the teacher's next state implies; both sample chunk by chunk with the KV cache, the same
as re-running the prefix; the networks must be a causal student and a bidirectional teacher; the recipes train."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastgen.configs.config_utils import load_config
from fastgen.configs.instantiate import instantiate
from fastgen.configs.net_dit import causal_video_dit
from fastgen.distributed.keyed_rng import KeyedNoise
from fastgen.methods.causal import chunk_times
from fastgen.utils.errors import ConfigError

TIMES = [1.0, 0.75, 0.5]


def small_config(recipe: str):  # noqa: ANN201
    config = load_config(recipe)
    for name in ("net", "teacher", "fake_score"):
        if hasattr(config.model, name):
            setattr(config.model, name, causal_video_dit(hidden_size=32, depth=2, num_heads=2, causal=name == "net"))
    config.model.teacher_ckpt = None
    config.model.t_list = list(TIMES)
    return config


def build(recipe: str, **overrides):  # noqa: ANN003, ANN201
    config = small_config(recipe)
    for key, value in overrides.items():
        setattr(config.model, key, value)
    torch.manual_seed(0)
    model = instantiate(config.model_class, config=config.model)
    with torch.no_grad():
        for p in model.teacher.parameters():
            p.normal_(0.0, 0.1)
    model.init_weights()
    with torch.no_grad():  # a student that differs from the teacher (and whose outputs depend on the input)
        for p in model.net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


KD = "Digits/config_causal_kd_moving_digits"
CAUSVID = "Digits/config_causvid_moving_digits"


def capture_inputs(net: torch.nn.Module) -> tuple[list, torch.utils.hooks.RemovableHandle]:
    seen: list = []

    def hook(module, args, kwargs, out):  # noqa: ANN001, ANN202
        seen.append((args[0].detach().clone(), args[1].detach().clone(), out))

    return seen, net.register_forward_hook(hook, with_kwargs=True)


def test_causal_kd_inputs_and_targets_follow_the_teachers_trajectory() -> None:
    """Chunk c is given the teacher's state at its drawn time t_{i_c} (the noise for i = 0) and regresses the x0
    whose DDIM step lands on the teacher's state at t_{i_c + 1} (its sample after the last step)."""
    model = build(KD, kd_data_path=None)
    generator = torch.Generator().manual_seed(3)
    noise = torch.randn(3, 1, 8, 8, 16, generator=generator)
    trajectory = torch.randn(3, len(TIMES), 1, 8, 8, 16, generator=generator)
    labels = torch.tensor([1, 4, 7])
    seen, handle = capture_inputs(model.net)
    model._bound_noise = KeyedNoise(0, torch.arange(3), 5, "train")
    try:
        loss_dict, _ = model.single_train_step({"noise": noise, "trajectory": trajectory, "condition": labels,
                                                "real": trajectory[:, -1]}, 5)
    finally:
        model._bound_noise = None
        handle.remove()
    (x, t, x0), = seen
    states = [noise] + [trajectory[:, j] for j in range(len(TIMES))]
    grid = TIMES + [0.0]
    targets = torch.empty_like(x)
    drawn = set()
    for b in range(3):
        for start in range(0, 8, 2):
            times = t[b, start:start + 2]
            assert times[0] == times[1]
            i = min(range(len(TIMES)), key=lambda k: abs(TIMES[k] - float(times[0])))
            drawn.add(i)
            assert abs(TIMES[i] - float(times[0])) < 1e-6
            torch.testing.assert_close(x[b, :, start:start + 2], states[i][b, :, start:start + 2])
            a, bb = model.noise_scheduler.ddim_coefficients(grid[i], grid[i + 1])
            targets[b, :, start:start + 2] = (states[i + 1][b, :, start:start + 2]
                                              - float(bb) * states[i][b, :, start:start + 2]) / float(a)
    assert len(drawn) > 1  # the chunks sit at different times
    torch.testing.assert_close(loss_dict["kd_loss"], (x0.detach() - targets).square().mean(), rtol=1e-5, atol=1e-6)
    loss_dict["total_loss"].backward()
    assert model.net.backbone.final_layer.linear.weight.grad is not None


def test_causal_kd_samples_chunk_by_chunk_with_ddim_steps() -> None:
    """The cached rollout equals the student re-run on the whole prefix (finished chunks clean), chunk by chunk
    through the deterministic DDIM steps between the student times."""
    model = build(KD, kd_data_path=None)
    net = model.net
    noise = torch.randn(2, 1, 8, 8, 16, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([3, 8])
    with torch.no_grad():
        video = model.generate(net, noise, labels)
        done = []
        for start in range(0, 8, 2):
            x = noise[:, :, start:start + 2]
            for step, t in enumerate(TIMES):
                prefix = torch.cat([*done, x], dim=2)
                times = torch.cat([torch.zeros(2, start), torch.full((2, 2), t)], dim=1)
                x0 = net(prefix, times, condition=labels, fwd_pred_type="x0")[:, :, start:]
                if step + 1 < len(TIMES):
                    a, b = model.noise_scheduler.ddim_coefficients(t, TIMES[step + 1])
                    x = float(a) * x0 + float(b) * x
            done.append(x0)
    torch.testing.assert_close(video, torch.cat(done, dim=2), atol=1e-4, rtol=0)


def test_causvid_noises_data_to_a_student_time_per_chunk() -> None:
    """The student's input is the step's data noised with the step's keyed noise to an independent student time
    per chunk (drawn first), and its output carries gradients."""
    model = build(CAUSVID)
    real = torch.rand(4, 1, 8, 8, 16, generator=torch.Generator().manual_seed(2)) * 2 - 1
    labels = torch.tensor([0, 1, 2, 3])
    seen, handle = capture_inputs(model.net)
    model._bound_noise = KeyedNoise(0, torch.arange(4), 9, "train")
    try:
        x = model.generate_for_training(torch.randn_like(real), labels, real)
    finally:
        model._bound_noise = None
        handle.remove()
    (x_t, t, _), = seen
    again = KeyedNoise(0, torch.arange(4), 9, "train")
    _, expected_t = chunk_times(TIMES, 4, 8, 2, again, real.device)
    expected = model.noise_scheduler.add_noise(real, again.randn_like(real), expected_t.float())
    torch.testing.assert_close(t, expected_t.float())
    torch.testing.assert_close(x_t, expected)
    assert len(set(t[:, ::2].flatten().tolist())) > 1 and set(t.flatten().tolist()) <= set(TIMES)
    assert x.requires_grad
    with pytest.raises(ConfigError, match="noised data"):
        model.generate_for_training(torch.randn_like(real), labels, None)


def test_causvid_sampling_is_causal() -> None:
    """Chunk by chunk: new noise in the last chunk leaves the earlier chunks of the video as they were."""
    model = build(CAUSVID)
    noise = torch.randn(2, 1, 8, 8, 16, generator=torch.Generator().manual_seed(4))
    other = noise.clone()
    other[:, :, 6:] = torch.randn(2, 1, 2, 8, 16, generator=torch.Generator().manual_seed(5))
    labels = torch.tensor([2, 5])
    with torch.no_grad():
        a = model.generate(model.net, noise, labels, generator=torch.Generator().manual_seed(6))
        b = model.generate(model.net, other, labels, generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(a[:, :, :6], b[:, :, :6], atol=1e-5, rtol=0)
    assert not torch.allclose(a[:, :, 6:], b[:, :, 6:])


@pytest.mark.parametrize("recipe", [KD, CAUSVID])
def test_the_networks_must_be_a_causal_student_and_a_bidirectional_teacher(recipe: str) -> None:
    config = small_config(recipe)
    config.model.teacher = causal_video_dit(hidden_size=32, depth=2, num_heads=2, causal=True)
    with pytest.raises(ConfigError, match="bidirectional"):
        instantiate(config.model_class, config=config.model)
    config = small_config(recipe)
    config.model.net = causal_video_dit(hidden_size=32, depth=2, num_heads=2, causal=False)
    with pytest.raises(ConfigError, match="block-causal student"):
        instantiate(config.model_class, config=config.model)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [KD, CAUSVID])
def test_the_recipes_train_and_sample(recipe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CausalKD builds its trajectory cache from the teacher, then trains; CausVid alternates student and critic
    iterations; both then sample videos chunk by chunk."""
    from fastgen.trainer import Trainer

    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    config = small_config(recipe)
    if recipe == KD:
        from fastgen.configs.methods.config_kd import kd_pairs_loader

        path = str(tmp_path / "pairs.pt")
        config.model.kd_data_path = path
        config.model.kd_num_samples = 8
        config.model.kd_build_batch_size = 4
        config.model.sample_steps = 3
        config.dataloader_train = kd_pairs_loader(path, batch_size=4)
    else:
        config.model.student_update_freq = 2
        config.dataloader_train.batch_size = 4
    config.trainer.max_iter = 4
    config.trainer.save_ckpt_iter = 4
    config.trainer.callbacks = {"ema": config.trainer.callbacks["ema"]}
    model = Trainer(config).run()
    if recipe == KD:
        assert torch.load(tmp_path / "pairs.pt", weights_only=True)["trajectory"].shape == (8, 3, 1, 8, 8, 16)
    videos, _ = model.sample(2, generator=torch.Generator().manual_seed(0))
    assert videos.shape == (2, 1, 8, 8, 16) and torch.isfinite(videos).all()
