"""PDD (``fastgen.methods.pdd``) and the widened heads it trains (``fastgen.networks.heads``): at initialisation
every head is the teacher (loss 0 when the target interval is the start interval), a fused block of one interval
is that interval's Euler step, a fused block of ``m`` intervals is ``m`` Euler steps when the heads do not depend
on the state, the grid travels with the weights and a checkpoint trained on another grid is refused, and the
recipe trains and samples with any step count from one student."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastgen.configs.experiments.Digits.common import digits_distillation
from fastgen.configs.instantiate import instantiate
from fastgen.configs.methods.config_pdd import create_config
from fastgen.configs.net_dit import dit_digits
from fastgen.methods.pdd import PDDModel, even_blocks, fusion_weights, shifted_grid
from fastgen.networks.heads import HeadProjection, fuse_heads, head_projection_of
from fastgen.utils.errors import ConfigError

LABELS = torch.tensor([1, 2, 3, 4])


def build(net: str = "unet", **model: object) -> PDDModel:
    config = digits_distillation(create_config(), net=dit_digits(num_classes=10) if net == "dit" else None)
    config.model.teacher_ckpt = None
    for key, value in model.items():
        setattr(config.model, key, value)
    torch.manual_seed(0)
    pdd = instantiate(config.model_class, config=config.model)
    with torch.no_grad():  # a teacher whose output layer is not zero (the U-Net initialises it to zero)
        for p in pdd.teacher.parameters():
            p.normal_(0.0, 0.05)
    pdd.init_weights()
    return pdd


@pytest.mark.parametrize("net", ["unet", "dit"])
def test_every_head_starts_as_the_teacher_and_the_loss_is_zero_at_k_equal_n(net: str) -> None:
    pdd = build(net, block_size_max=1)  # k = n
    projection = head_projection_of(pdd.net)
    assert isinstance(projection, HeadProjection) and projection.heads == 8
    assert projection.spec.layout == ("channel_major" if net == "unet" else "patch_major")
    x = torch.randn(4, 1, 8, 8)
    t = torch.tensor([0.9, 0.6, 0.3, 0.1])
    heads = pdd.student_velocity(pdd.net, x, t, LABELS)
    teacher = pdd.teacher_velocity(x, t, LABELS)
    assert heads.shape == (4, 8, 1, 8, 8)
    assert float(teacher.abs().mean()) > 0.1  # a real velocity, not zeros
    torch.testing.assert_close(heads, teacher[:, None].expand_as(heads), rtol=1e-5, atol=1e-5)
    loss, _ = pdd.single_train_step({"real": torch.randn(4, 1, 8, 8), "condition": LABELS}, 0)
    assert float(loss["total_loss"].detach()) < 1e-10
    loss, _ = build(net, teacher_integrator="euler").single_train_step(  # k > n: the student's path differs
        {"real": torch.randn(32, 1, 8, 8), "condition": torch.arange(32) % 10}, 0)
    assert float(loss["pdd_target_span"]) > 0 and float(loss["pdd_loss"]) > 1e-4


def perturbed_heads(pdd: PDDModel) -> None:
    """Make the heads differ from each other (a trained student's do)."""
    with torch.no_grad():
        for net in (pdd.net, *pdd.ema_nets.values()):
            projection = head_projection_of(net)
            projection.weight.add_(torch.randn_like(projection.weight) * 0.05)
            projection.bias.add_(torch.randn_like(projection.bias) * 0.05)


@pytest.mark.parametrize("net", ["unet", "dit"])
def test_a_fused_block_of_one_interval_is_that_intervals_euler_step(net: str) -> None:
    pdd = build(net)
    perturbed_heads(pdd)
    noise = torch.randn(4, 1, 8, 8) * float(pdd.noise_scheduler.sigma(torch.tensor(pdd.noise_scheduler.t_max)))
    grid = pdd.grid.float()
    with torch.no_grad():
        sampled = pdd.generate(pdd.net, noise, LABELS, blocks=[1] * 8)
        x = grid[0] * noise / float(pdd.noise_scheduler.sigma(torch.tensor(pdd.noise_scheduler.t_max)))
        for j in range(8):  # head j of the all-heads pass at x_j: the per-interval Euler step
            v = pdd.student_velocity(pdd.net, x, grid[j].expand(4), LABELS)[:, j]
            x = x + (grid[j + 1] - grid[j]) * v
    torch.testing.assert_close(sampled, x, rtol=1e-4, atol=1e-4)


def test_a_fused_block_of_m_intervals_is_m_euler_steps_when_the_heads_do_not_depend_on_the_state() -> None:
    """Heads that ignore the state (zero weights, a different bias per head, on a rectified-flow DiT whose output
    is the velocity): the m Euler steps of heads s..e-1 and the one fused evaluation land on the same point, and
    one block of all intervals equals eight blocks of one."""
    config = dit_digits(num_classes=10)
    config.noise_scheduler = {"_target_": "fastgen.networks.noise_schedules.RectifiedFlowScheduler"}
    pdd = build("dit")
    pdd.net = instantiate(config)
    pdd.adapt_net(pdd.net)
    projection = head_projection_of(pdd.net)
    with torch.no_grad():
        projection.weight.zero_()
        projection.bias.copy_(torch.randn_like(projection.bias))
    noise = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        outs = [pdd.generate(pdd.net, noise, LABELS, blocks=b) for b in ([8], [1] * 8, [2, 2, 2, 2], [3, 5])]
        grid = pdd.grid.float()
        x = grid[0] * noise
        for j in range(8):
            x = x + (grid[j + 1] - grid[j]) * pdd.student_velocity(pdd.net, x, grid[j].expand(4), LABELS)[:, j]
    for out in outs:
        torch.testing.assert_close(out, x, rtol=1e-5, atol=1e-5)


def test_fused_weights_are_the_weighted_heads() -> None:
    pdd = build()
    perturbed_heads(pdd)
    x, t = torch.randn(4, 1, 8, 8), torch.full((4,), 0.7)
    weights = fusion_weights(pdd.grid, 2, 5)
    assert float(weights.sum()) == pytest.approx(1.0) and weights[:2].abs().sum() == 0 and weights[5:].abs().sum() == 0
    with torch.no_grad():
        heads = pdd.student_velocity(pdd.net, x, t, LABELS)
        with fuse_heads(pdd.net, weights):
            fused = pdd.student_velocity(pdd.net, x, t, LABELS)
    torch.testing.assert_close(fused, torch.einsum("h,bh...->b...", weights.float(), heads), rtol=1e-4, atol=1e-5)


def test_the_grid_is_saved_with_the_heads_and_another_grid_is_refused() -> None:
    pdd = build()
    state = pdd.net.state_dict()
    torch.testing.assert_close(state["backbone.conv_out.grid"], pdd.grid)
    assert float(pdd.grid[0]) == pytest.approx(80 / 81) and float(pdd.grid[-1]) == 0.0
    build().net.load_state_dict(state)  # the same grid loads
    with pytest.raises(RuntimeError, match="trained on the time grid"):
        build(grid_shift=3.0).net.load_state_dict(state)
    torch.testing.assert_close(shifted_grid(4, 3.0, 1.0), torch.tensor([1.0, 0.9, 0.75, 0.5, 0.0], dtype=torch.float64))


def test_config_errors_and_block_partitions() -> None:
    assert even_blocks(8, 3) == [2, 3, 3] and even_blocks(8, 8) == [1] * 8 and even_blocks(8, 1) == [8]
    with pytest.raises(ValueError, match="1 to 8 steps"):
        even_blocks(8, 9)
    with pytest.raises(ConfigError, match="t_list"):
        build(t_list=[80.0])
    with pytest.raises(ConfigError, match="inference_blocks"):
        build(inference_blocks=[4, 3])
    with pytest.raises(ConfigError, match="block_size_min"):
        build(block_size_min=3)


def test_the_draw_keeps_k_in_the_window_after_n() -> None:
    pdd = build(block_size_min=2, block_size_max=3)
    n, k = pdd.draw_intervals(4000, torch.device("cpu"))
    assert set(n.tolist()) == {0, 2, 4, 6}
    assert bool(((k >= n) & (k < torch.clamp(n + 3, max=8))).all())
    assert set((k - n).tolist()) == {0, 1, 2}


@pytest.mark.slow
def test_the_recipe_trains_and_samples_with_any_step_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Digits/config_pdd_digits`` for 60 iterations through the trainer, then ``fastgen sample --steps 1/2/8``
    from the one checkpoint: the heads learn (the loss falls) and every partition samples."""
    import subprocess
    import sys

    monkeypatch.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    fastgen = [sys.executable, "-m", "fastgen"]
    train = subprocess.run([*fastgen, "train", "--config", "Digits/config_pdd_digits", "-", "trainer.max_iter=60",
                            "trainer.logging_iter=20", "trainer.save_ckpt_iter=60", "log_config.name=pdd",
                            "trainer.callbacks.wandb.sample_iter=1000"],
                           capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    run = tmp_path / "fastgen" / "digits" / "pdd"
    for steps in (1, 2, 8):
        out = tmp_path / f"s{steps}.npz"
        sample = subprocess.run([*fastgen, "sample", str(run), "--steps", str(steps), "--num-samples", "20",
                                 "-o", str(out)], capture_output=True, text=True, timeout=300)
        assert sample.returncode == 0, sample.stderr[-3000:]
        assert out.is_file()


@pytest.mark.parametrize("family", ["sd", "sdxl", "flux", "wan", "qwenimage", "cogvideox", "cosmos2"])
def test_diffusers_backbones_widen_in_their_layout(family: str) -> None:
    """The diffusers-backed networks (tiny random configs of the real classes): widened into 3 heads, every head
    equals the network; changing head 1's rows of the projection changes head 1's prediction only - the layout
    (channel major for a convolution, Flux's / Qwen-Image's packed tokens and CogVideoX's ``(channel, p, p)`` rows,
    patch major for Wan and Cosmos Predict2) puts each head's rows where
    the code after the projection reads that head's channels."""
    from fastgen_testing import check_widened_heads

    from fastgen.configs.net_cosmos_predict2 import TINY_COSMOS_PREDICT2, cosmos_predict2_transformer
    from fastgen.configs.net_diffusers import (
        TINY_COGVIDEOX,
        TINY_FLUX,
        TINY_QWEN_IMAGE,
        TINY_SD_UNET,
        TINY_SDXL_UNET,
        TINY_WAN,
        cogvideox_transformer,
        flux_transformer,
        qwenimage_transformer,
        sd_unet,
        sdxl_unet,
        wan_transformer,
    )

    build = {"sd": lambda: sd_unet(TINY_SD_UNET, num_prompts=4),
             "sdxl": lambda: sdxl_unet(TINY_SDXL_UNET, vae_scale_factor=2, num_prompts=4),
             "flux": lambda: flux_transformer(TINY_FLUX, num_prompts=4),
             "wan": lambda: wan_transformer(TINY_WAN, num_prompts=4),
             "qwenimage": lambda: qwenimage_transformer(TINY_QWEN_IMAGE, num_prompts=4, image_seq_len=16),
             "cogvideox": lambda: cogvideox_transformer(TINY_COGVIDEOX, num_prompts=4),
             "cosmos2": lambda: cosmos_predict2_transformer(TINY_COSMOS_PREDICT2, text_tokens=4, num_prompts=4)}[family]
    torch.manual_seed(0)
    net = instantiate(build())
    check_widened_heads(net, torch.randn(2, 1, 8, 8), torch.tensor([0.7, 0.3]), torch.tensor([0, 3]))
