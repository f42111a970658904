"""diffusers-backed networks (``fastgen.networks.diffusers_nets``): SD-style U-Net, Flux-, Wan-, Qwen-Image- and
CogVideoX-style transformers built from tiny random configs (no weight downloads), in the network contract; SD's discrete VP
schedule against diffusers' own; weights from ``model.pretrained_model_path``; SFT and DMD2 on digits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastgen.configs.instantiate import instantiate
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
from fastgen.networks.diffusers_nets import pack_flux_condition
from fastgen.networks.noise_schedules import DiscreteVPScheduler

FAMILIES = {
    "sd": lambda **kw: sd_unet(TINY_SD_UNET, **kw),
    "sdxl": lambda **kw: sdxl_unet(TINY_SDXL_UNET, vae_scale_factor=2, **kw),
    "flux": lambda **kw: flux_transformer(TINY_FLUX, **kw),
    "wan": lambda **kw: wan_transformer(TINY_WAN, **kw),
    "qwenimage": lambda **kw: qwenimage_transformer(TINY_QWEN_IMAGE, **{"image_seq_len": 16, **kw}),
    "cogvideox": lambda **kw: cogvideox_transformer(TINY_COGVIDEOX, **kw),
}


def _net(family: str, **kwargs):
    torch.manual_seed(0)
    return instantiate(FAMILIES[family](**kwargs))


def _inputs(batch: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, 1, 8, 8, generator=g), torch.rand(batch, generator=g) * 0.9 + 0.05, torch.arange(batch) % 10


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_contract_labels_pick_prompts_and_zero_is_the_null_condition(family: str) -> None:
    """Output like the input; a label is its prompt's embeddings (the same output as passing those embeddings);
    the all-zero row and ``None`` are the null condition; a label changes the output; feature taps come back as
    ``(B, D, h, w)`` maps in the order asked; return_logvar and out-of-range taps are errors."""
    net = _net(family, num_prompts=10, prompt_tokens=3)
    x, t, y = _inputs()
    out = net(x, t, condition=y)
    assert out.shape == x.shape and torch.isfinite(out).all()
    bank = net.backbone.prompt_bank
    assert torch.allclose(net(x, t, condition=bank[y]), out, atol=1e-6)
    one_hot = torch.nn.functional.one_hot(y, 10).float()
    assert torch.allclose(net(x, t, condition=one_hot), out, atol=1e-6)
    null = net(x, t, condition=torch.zeros(4, 10))
    assert torch.allclose(net(x, t, condition=None), null, atol=1e-6)
    assert not torch.allclose(null, out, atol=1e-4)
    units = net.backbone.shard_units()
    last = len(units) - 1
    pred, features = net(x, t, condition=y, feature_indices=[last, 0])
    assert torch.allclose(pred, out, atol=1e-6) and len(features) == 2
    assert all(f.dim() == 4 and f.shape[0] == 4 for f in features)
    with pytest.raises(ValueError, match="log-variance"):
        net(x, t, return_logvar=True)
    with pytest.raises(ValueError, match="feature_indices"):
        net(x, t, feature_indices=[len(units)])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_it_is_the_wrapped_diffusers_model_called_as_its_pipeline_calls_it(family: str) -> None:
    """The adapter's output is the diffusers model's own forward on the pipeline's inputs: SD's step index
    ``t N - 1`` and unscaled latents; Flux's 2x2-packed tokens, ``(0, row, column)`` image ids and ``t``; Wan's
    one-frame video and ``1000 t``. The schedules' preconditioning is the identity here (``c_skip = 0``)."""
    net = _net(family, num_prompts=10, prompt_tokens=3)
    x, t, y = _inputs()
    text = net.backbone.prompt_bank[y]
    model = net.backbone.model
    with torch.no_grad():
        if family == "sd":
            want = model(x, t * 1000 - 1, encoder_hidden_states=text).sample
        elif family == "sdxl":  # row 0: the pooled vector (8) and the six time ids
            want = model(x, t * 1000 - 1, encoder_hidden_states=text[:, 1:],
                         added_cond_kwargs={"text_embeds": text[:, 0, :8], "time_ids": text[:, 0, 8:14]}).sample
        elif family == "flux":
            b, c, h, w = x.shape
            packed = x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)
            ids = torch.zeros(h // 2, w // 2, 3)
            ids[..., 1] += torch.arange(h // 2)[:, None]
            ids[..., 2] += torch.arange(w // 2)[None, :]
            tokens = model(hidden_states=packed, encoder_hidden_states=text[:, 1:], pooled_projections=text[:, 0, :8],
                           timestep=t, img_ids=ids.reshape(-1, 3), txt_ids=torch.zeros(3, 3)).sample
            want = tokens.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
        elif family == "qwenimage":  # the pipeline's call: packed latents, img_shapes, t (timestep / 1000), no mask
            b, c, h, w = x.shape
            packed = x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)
            tokens = model(hidden_states=packed, encoder_hidden_states=text, timestep=t,
                           img_shapes=[[(1, h // 2, w // 2)]] * b).sample
            want = tokens.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
        elif family == "cogvideox":  # the pipeline's call: frame-major latents, the step index, its rotary tables
            from diffusers import CogVideoXPipeline

            pipe = CogVideoXPipeline(tokenizer=None, text_encoder=None, vae=None, transformer=model, scheduler=None)
            # its pixel size: 8x8 latents at the default vae_scale_factor_spatial of 8 (no VAE here)
            rotary = pipe._prepare_rotary_positional_embeddings(64, 64, 1, torch.device("cpu"))
            want = model(hidden_states=x.unsqueeze(1), encoder_hidden_states=text, timestep=t * 1000 - 1,
                         image_rotary_emb=rotary).sample.squeeze(1)
        else:
            want = model(x.unsqueeze(2), t * 1000, text).sample.squeeze(2)
        got = net(x, t, condition=y)
    if family in ("sd", "sdxl"):  # eps prediction converted to nothing: the native prediction is the model's
        assert net.native_pred_type == "eps"
    if family == "cogvideox":
        assert net.native_pred_type == "v"
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


#: labels through a bank of 10 random 3-token prompts
BANK = {"num_prompts": 10, "prompt_tokens": 3}
#: LoRA targets of each tiny network and how many modules each pattern matches (attention queries of both kinds)
LORA_TARGETS = {"sd": (["*attn1.to_q", "*attn2.to_q"], 4), "sdxl": (["*attn1.to_q", "*attn2.to_q"], 4),
                "flux": (["*attn.to_q"], 3), "wan": (["*attn1.to_q", "*attn2.to_q"], 2),
                "qwenimage": (["*attn.to_q", "*attn.add_q_proj"], 2), "cogvideox": (["*attn1.to_q", "*attn1.to_v"], 2)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_activation_checkpointing_and_lora_keep_the_gradients(family: str) -> None:
    """Every family's wrapper under ``model.activation_checkpointing`` (torch's composable ``checkpoint`` on each of
    its ``shard_units``) gives the gradients it gives without; a LoRA adapter on its attention queries starts as the
    base network and trains only its branches, on every matched module."""
    from fastgen_testing import check_checkpointing_and_lora

    x, t, labels = _inputs(2)
    targets, per_pattern = LORA_TARGETS[family]
    adapted = check_checkpointing_and_lora(lambda: _net(family, **BANK), x, t, labels, targets, per_pattern)
    assert len(adapted) == per_pattern * len(targets)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_meta_build_loaded_is_the_network(family: str) -> None:
    """``model.meta_init``'s route (``to_empty``, then ``broadcast_full_weights`` from the real build: parameters,
    persistent buffers and the buffers outside the state dict, e.g. Wan's rotary frequencies) gives the same
    prediction, bit for bit: nothing the wrapper or the diffusers model keeps is left uninitialised."""
    from fastgen.distributed.parallelize import broadcast_full_weights

    net = _net(family, **BANK)
    x, t, labels = _inputs(2)
    with torch.device("meta"):
        meta = instantiate(FAMILIES[family](**BANK))
    meta.to_empty(device="cpu")
    broadcast_full_weights(meta, net)
    with torch.no_grad():
        assert torch.equal(meta(x, t, condition=labels), net(x, t, condition=labels))


def test_sdxl_zero_time_ids_are_the_sampled_size_uncropped() -> None:
    """All-zero time ids (the null condition, a prompt encoded without a size) mean the pipeline's default for the
    sampled size: (H, W, 0, 0, H, W) in pixels = latent size x vae_scale_factor; given ones are used as they are."""
    from fastgen.networks.diffusers_nets import pack_sdxl_condition

    net = _net("sdxl")
    x, t, _ = _inputs()
    tokens, pooled = torch.randn(4, 3, 16), torch.randn(4, 8)
    default = torch.tensor([[16.0, 16, 0, 0, 16, 16]]).expand(4, 6)
    with torch.no_grad():
        unset = net(x, t, condition=pack_sdxl_condition(tokens, pooled))
        explicit = net(x, t, condition=pack_sdxl_condition(tokens, pooled, default))
        other = net(x, t, condition=pack_sdxl_condition(tokens, pooled, torch.tensor([[64.0, 32, 8, 0, 16, 16]] * 4)))
    assert torch.equal(unset, explicit) and not torch.allclose(unset, other, atol=1e-5)


def test_qwenimage_zero_rows_are_the_text_mask_and_a_meta_build_runs() -> None:
    """Qwen-Image's condition carries its mask: zero rows are padding, masked out of the joint attention - the
    output of a prompt padded further with zero rows, or left unpadded with ``encoder_hidden_states_mask`` as the
    pipeline passes it, is the same; a nonzero row in the padding changes it. A meta-device build (``to_empty``,
    then weights loaded) rebuilds the rotary tables diffusers keeps outside the state dict and gives the same
    output."""
    net = _net("qwenimage")
    x, t, _ = _inputs(2)
    tokens = torch.randn(2, 5, 16)
    tokens[0, 3:] = 0  # prompt 0 has 3 tokens, prompt 1 has 5
    padded = torch.cat([tokens, torch.zeros(2, 4, 16)], dim=1)
    model = net.backbone.model
    with torch.no_grad():
        out = net(x, t, condition=tokens)
        longer = net(x, t, condition=padded)
        b, c, h, w = x.shape
        packed = x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)
        mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
        theirs = model(hidden_states=packed, encoder_hidden_states=tokens, encoder_hidden_states_mask=mask, timestep=t,
                       img_shapes=[[(1, h // 2, w // 2)]] * b).sample
        theirs = theirs.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
        noisy = padded.clone()
        noisy[0, 4] = 0.5
        other = net(x, t, condition=noisy)
    assert torch.allclose(out, longer, atol=1e-5) and torch.allclose(out, theirs, atol=1e-5)
    assert not torch.allclose(other[0], out[0], atol=1e-4) and torch.allclose(other[1], out[1], atol=1e-5)

    with torch.device("meta"):
        meta = instantiate(FAMILIES["qwenimage"]())
    meta.to_empty(device="cpu")
    meta.load_state_dict(net.state_dict())
    with torch.no_grad():
        assert torch.equal(meta(x, t, condition=tokens), out)


def test_qwenimage_guidance_is_the_pipelines_norm_rescaled_true_cfg() -> None:
    """``guide`` is ``QwenImagePipeline``'s ``true_cfg_scale`` step on its packed velocities: ``u + s (c - u)``
    rescaled so that each token (one 2x2 patch, all channels) has the conditional velocity's norm; the other
    families' guidance is the linear one."""
    net = _net("qwenimage")
    g = torch.Generator().manual_seed(4)
    cond, uncond = torch.randn(2, 3, 8, 8, generator=g), torch.randn(2, 3, 8, 8, generator=g)
    guided = net.backbone.guide(cond, uncond, 4.0)

    def packed(v: torch.Tensor) -> torch.Tensor:  # the pipeline's _pack_latents layout (B, H/2 * W/2, 4 C)
        return v.view(2, 3, 4, 2, 4, 2).permute(0, 2, 4, 1, 3, 5).reshape(2, 16, 12)

    combined = packed(uncond) + 4.0 * (packed(cond) - packed(uncond))
    want = combined * (torch.norm(packed(cond), dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))
    assert torch.allclose(packed(guided), want, atol=1e-6)
    assert torch.allclose(packed(guided).norm(dim=-1), packed(cond).norm(dim=-1), atol=1e-5)
    assert not net.backbone.linear_guidance and _net("flux").backbone.linear_guidance
    assert torch.equal(_net("flux").backbone.guide(cond, uncond, 4.0), uncond + 4.0 * (cond - uncond))


def test_a_distillation_guides_a_qwenimage_teacher_as_its_pipeline(tmp_path: Path) -> None:
    """DMD2's (every distillation's) guided teacher ``teacher_x0`` on a Qwen-Image teacher is the norm-rescaled
    true CFG of its velocities (``backbone.guide``), converted to the denoised estimate - not ``u + s (c - u)``
    on the estimate, which the rescale makes a different target."""
    from fastgen.configs.instantiate import instantiate

    config = _digits_config("dmd2", "qwenimage", tmp_path)
    config.model.guidance_scale = 4.0
    model = instantiate(config.model_class, config=config.model)
    teacher = model.teacher
    g = torch.Generator().manual_seed(2)
    x, t, y = torch.randn(2, 1, 8, 8, generator=g), torch.tensor([0.8, 0.4]), torch.tensor([1, 7])
    with torch.no_grad():
        got = model.teacher_x0(x, t, y)
        c = teacher(x, t, condition=torch.nn.functional.one_hot(y, 10).float(), fwd_pred_type="flow")
        u = teacher(x, t, condition=torch.zeros(2, 10), fwd_pred_type="flow")
        want = x - t.view(2, 1, 1, 1) * teacher.backbone.guide(c, u, 4.0)  # x0 = x_t - t v under rectified flow
        linear = x - t.view(2, 1, 1, 1) * (u + 4.0 * (c - u))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert float((got - linear).abs().max()) > 1e-3


@pytest.mark.parametrize("image_seq_len", [16, 1024, 4096])
def test_qwenimage_schedule_samples_at_its_pipelines_times(image_seq_len: int) -> None:
    """The network's sampling grid is what ``QwenImagePipeline`` gives its scheduler (Qwen-Image's config: dynamic
    exponential shift, shift_terminal 0.02) for latents of ``image_seq_len`` packed tokens: ``sigmas =
    linspace(1, 1/N, N)`` and ``mu = calculate_shift(image_seq_len, ...)``, then 0."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    from fastgen.configs.net_diffusers import QWEN_IMAGE_SCHEDULER

    schedule = _net("qwenimage", image_seq_len=image_seq_len).noise_scheduler
    scheduler = FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER, use_dynamic_shifting=True,
                                                time_shift_type="exponential")
    config = scheduler.config
    mu = calculate_shift(image_seq_len, config.base_image_seq_len, config.max_image_seq_len, config.base_shift,
                         config.max_shift)
    for steps in (2, 3, 8, 50):
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        torch.testing.assert_close(schedule.sampling_times(steps), scheduler.sigmas, atol=1e-6, rtol=0)
    assert schedule.sampling_times(1).tolist() == [1.0, 0.0]  # one step: nothing to stretch


def test_flux_condition_packs_the_pooled_vector_in_row_zero() -> None:
    tokens, pooled = torch.randn(2, 5, 16), torch.randn(2, 8)
    packed = pack_flux_condition(tokens, pooled)
    assert packed.shape == (2, 6, 16)
    assert torch.equal(packed[:, 0, :8], pooled) and not packed[:, 0, 8:].any() and torch.equal(packed[:, 1:], tokens)
    net = _net("flux")
    x, t, _ = _inputs(2)
    assert net(x, t, condition=packed).shape == x.shape
    with pytest.raises(ValueError, match="no prompt bank"):
        net(x, t, condition=torch.tensor([1, 2]))


def test_sd_schedule_is_diffusers_ddpm_schedule() -> None:
    """At the trained steps ``t = (k + 1) / N`` the schedule's ``alpha^2`` is diffusers' ``alphas_cumprod[k]`` for
    SD's betas; ``t = 0`` is clean; the derivatives are those of ``alpha`` and ``sigma`` (finite differences inside
    a segment); eps -> x0 -> eps round-trips; training times are trained steps."""
    from diffusers import DDPMScheduler

    theirs = DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    ours = DiscreteVPScheduler()
    k = torch.tensor([0, 1, 10, 500, 998, 999])
    t = (k.double() + 1) / 1000
    assert torch.allclose(ours.alpha(t) ** 2, theirs.alphas_cumprod[k].double(), rtol=1e-5)
    assert torch.allclose(ours.alpha(t) ** 2 + ours.sigma(t) ** 2, torch.ones_like(t))
    assert ours.alpha(torch.zeros(1, dtype=torch.float64)).item() == 1.0
    s = torch.tensor([0.3004, 0.7502], dtype=torch.float64)
    h = 1e-6
    assert torch.allclose(ours.d_alpha(s), (ours.alpha(s + h) - ours.alpha(s - h)) / (2 * h), rtol=1e-4)
    assert torch.allclose(ours.d_sigma(s), (ours.sigma(s + h) - ours.sigma(s - h)) / (2 * h), rtol=1e-4)
    x_t, eps = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    x0 = ours.convert(eps, x_t, s, "eps", "x0")
    assert torch.allclose(ours.convert(x0, x_t, s, "x0", "eps"), eps)
    drawn = ours.sample_t(1000, generator=torch.Generator().manual_seed(0)) * 1000
    assert torch.allclose(drawn, drawn.round()) and drawn.min() >= 1 and drawn.max() <= 1000
    assert ours.precondition(torch.tensor([1.0]))[3].item() == 999.0


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_cogvideox_schedule_is_its_schedulers(shift: float) -> None:
    """CogVideoX-5b's (``snr_shift_scale`` 1) and 2b's (3) schedules: at the trained steps ``alpha^2`` is
    ``CogVideoXDDIMScheduler``'s ``alphas_cumprod`` (the SNR shift, then zero terminal SNR: exactly 0 at the last
    step); every quantity is finite on ``(0, 1]`` (the last segment's ``alpha`` falls linearly to 0) and the
    derivatives are those of ``alpha`` and ``sigma``; ``v`` at ``t = 1`` is ``-x0``; the teacher ODE's DDIM step is
    the scheduler's ``step``."""
    from diffusers import CogVideoXDDIMScheduler

    from fastgen.configs.instantiate import instantiate
    from fastgen.configs.net_diffusers import COGVIDEOX_5B_SCHEDULER, cogvideox_schedule

    config = {**COGVIDEOX_5B_SCHEDULER, "snr_shift_scale": shift}
    theirs = CogVideoXDDIMScheduler(**config, timestep_spacing="trailing", clip_sample=False)
    ours = instantiate(cogvideox_schedule(config))
    assert ours.native_pred_type == "v" and ours.zero_terminal_snr
    t = (torch.arange(1000, dtype=torch.float64) + 1) / 1000
    torch.testing.assert_close(ours.alpha(t) ** 2, theirs.alphas_cumprod, atol=1e-12, rtol=0)
    assert ours.alpha(t[-1:]).item() == 0.0 and ours.sigma(t[-1:]).item() == 1.0 and ours.prior_sample((3,)).std() > 0
    grid = torch.linspace(1e-4, 1, 20001, dtype=torch.float64)
    assert all(torch.isfinite(f(grid)).all() for f in (ours.alpha, ours.sigma, ours.d_alpha, ours.d_sigma))
    torch.testing.assert_close(ours.alpha(grid) ** 2 + ours.sigma(grid) ** 2, torch.ones_like(grid))
    s = torch.tensor([0.3004, 0.9983, 0.9996], dtype=torch.float64)  # the last two on the final segment
    h = 1e-7
    torch.testing.assert_close(ours.d_alpha(s), (ours.alpha(s + h) - ours.alpha(s - h)) / (2 * h), rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(ours.d_sigma(s), (ours.sigma(s + h) - ours.sigma(s - h)) / (2 * h), rtol=1e-5, atol=1e-8)
    x0, x_t = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    one = torch.ones(2, dtype=torch.float64)
    torch.testing.assert_close(ours.convert(-x0, x_t, one, "v", "x0"), x0)
    theirs.set_timesteps(4)
    v = torch.randn(2, 3, dtype=torch.float64)
    for k, k_next in ((999, 749), (499, 249), (249, None)):
        t_now, t_next = (k + 1) / 1000, 0.0 if k_next is None else (k_next + 1) / 1000
        denoised = ours.convert(v, x_t, torch.full((2,), t_now, dtype=torch.float64), "v", "x0")
        a, b = ours.ddim_coefficients(t_now, t_next)
        torch.testing.assert_close(a * denoised + b * x_t, theirs.step(v, k, x_t).prev_sample)
    assert DiscreteVPScheduler().alpha(t[-1:]).item() > 0  # SD's: untouched


def test_cogvideox_2b_sincos_positions_and_a_meta_build() -> None:
    """CogVideoX-2b's sincos positions (a non-persistent buffer of the model): the null condition is the pipeline's
    text length of zero tokens; a video of 3 latent frames is the model's frame-major call; after a meta-device
    build the buffer comes like any buffer outside the state dict (``broadcast_full_weights``) and the output is
    the same. CogVideoX 1.5's ``patch_size_t`` is refused in one line."""
    from fastgen.distributed.parallelize import broadcast_full_weights
    from fastgen.utils.errors import UsageError

    config = {**TINY_COGVIDEOX, "use_rotary_positional_embeddings": False, "in_channels": 2, "out_channels": 2}
    torch.manual_seed(0)
    net = instantiate(cogvideox_transformer(config))
    x, t = torch.randn(2, 2, 3, 8, 8), torch.tensor([0.7, 0.2])  # 2 channels: (C, F) and (F, C) orders differ
    model = net.backbone.model
    with torch.no_grad():
        out = net(x, t, condition=None)
        want = model(hidden_states=x.transpose(1, 2), encoder_hidden_states=torch.zeros(2, 8, 16),
                     timestep=t * 1000 - 1).sample.transpose(1, 2)
    assert out.shape == x.shape and torch.allclose(out, want, atol=1e-6)
    with torch.device("meta"):
        meta = instantiate(cogvideox_transformer(config))
    meta.to_empty(device="cpu")
    broadcast_full_weights(meta, net)
    with torch.no_grad():
        assert torch.equal(meta(x, t, condition=None), out)
    with pytest.raises(UsageError, match="patch_size_t=2"):
        instantiate(cogvideox_transformer({**TINY_COGVIDEOX, "patch_size_t": 2}))


def test_a_missing_diffusers_package_is_one_line_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from fastgen.utils.errors import UsageError

    monkeypatch.setitem(sys.modules, "diffusers", None)
    with pytest.raises(UsageError, match=r"pip install 'fastgen\[diffusers\]'"):
        _net("flux")


def _digits_config(method: str, family: str, tmp_path: Path, **net_kwargs):
    """A digits recipe (``sft`` or ``dmd2``) with the tiny ``family`` network, 3 iterations, no W&B/validation."""
    from fastgen_testing import tiny_digits_recipe

    return tiny_digits_recipe(method, FAMILIES[family](num_prompts=10, **net_kwargs), f"{method}_{family}",
                              iterations=3, batch_size=8)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sft_then_dmd2_train_on_digits(family: str, output_root: Path, tmp_path: Path) -> None:
    """SFT trains the tiny network for 3 iterations (labels through the prompt bank, 10% label dropout); DMD2 then
    distils it (its teacher from ``model.pretrained_model_path``: the SFT network saved as a diffusers folder)
    with the GAN head on the fake score's middle block. Every trained network's weights move, and the teacher is
    exactly the saved network."""
    from fastgen.trainer import Trainer

    sft = Trainer(_digits_config("sft", family, tmp_path)).run()
    start = _net(family, num_prompts=10)
    moved = [n for n, p in sft.net.backbone.model.named_parameters()
             if not torch.equal(p, dict(start.backbone.model.named_parameters())[n])]
    assert moved, "SFT changed no weight"
    folder = tmp_path / "pipeline"
    sft.net.backbone.model.save_pretrained(folder / sft.net.backbone.weights_subfolder)

    config = _digits_config("dmd2", family, tmp_path)
    config.model.pretrained_model_path = str(folder)
    config.model.gan_loss_weight_gen = 1e-2
    dmd2 = Trainer(config).run()
    for name, p in dmd2.teacher.backbone.model.state_dict().items():
        assert torch.equal(p, sft.net.backbone.model.state_dict()[name]), name
    for name in ("net", "fake_score"):
        trained = getattr(dmd2, name).backbone.model.state_dict()
        assert any(not torch.equal(v, dmd2.teacher.backbone.model.state_dict()[k]) for k, v in trained.items()), name
    assert (output_root / "fastgen" / "digits" / f"dmd2_{family}" / "checkpoints" / "0000003.pth").is_file()


def test_text_embeddings_from_data_train_with_label_dropout() -> None:
    """Per-sample text embeddings ``(B, T, D)`` (what the real recipes' shards hold) go straight to the network;
    SFT's condition dropout zeroes whole samples' embeddings (the null condition), not single rows."""
    from fastgen.configs.config_utils import load_config
    from fastgen.methods.sft import SFTModel

    config = load_config("Digits/config_sft_digits").model
    config.net = sd_unet(TINY_SD_UNET)
    config.condition_dropout = 0.5
    torch.manual_seed(0)
    model = SFTModel(config)
    seen: list[torch.Tensor] = []
    model.net.backbone.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw["condition"]), with_kwargs=True)
    text = torch.randn(16, 5, 16) + 3.0
    losses, _ = model.single_train_step({"real": torch.randn(16, 1, 8, 8), "condition": text}, 0)
    losses["total_loss"].backward()
    assert torch.isfinite(losses["total_loss"])
    used = seen[0]
    dropped = (used == 0).flatten(1).all(dim=1)
    kept = (used == text).flatten(1).all(dim=1)
    assert bool((dropped | kept).all()) and 0 < int(dropped.sum()) < 16


def test_the_weights_folder_decides_the_architecture(tmp_path: Path) -> None:
    """Issue 34, point 3: with ``model.pretrained_model_path`` the network is built as the folder's ``config.json``
    says - here a smaller fine-tune than the recipe's U-Net - and its weights load into it (strictly). Without the
    folder's architecture the load fails (the shapes differ); a folder without ``config.json`` keeps the recipe's."""
    from diffusers import UNet2DConditionModel

    from fastgen.configs.config_utils import load_config
    from fastgen.methods.sft import SFTModel

    torch.manual_seed(1)
    other = {**TINY_SD_UNET, "block_out_channels": [8, 16], "norm_num_groups": 4}
    UNet2DConditionModel(**other).save_pretrained(tmp_path / "weights" / "unet")
    config = load_config("Digits/config_sft_digits").model
    config.net = sd_unet(TINY_SD_UNET)
    config.pretrained_model_path = str(tmp_path / "weights")
    model = SFTModel(config)
    assert list(model.net.backbone.model.config.block_out_channels) == [8, 16]
    assert list(config.net.backbone.config["block_out_channels"]) == [8, 16]  # what config.yaml then records
    model.init_weights()
    saved = UNet2DConditionModel.from_pretrained(tmp_path / "weights" / "unet").state_dict()
    assert all(torch.equal(model.net.backbone.model.state_dict()[k], v) for k, v in saved.items())

    (tmp_path / "empty").mkdir()
    config.net = sd_unet(TINY_SD_UNET)
    config.pretrained_model_path = str(tmp_path / "empty")
    assert list(SFTModel(config).net.backbone.model.config.block_out_channels) == [16, 32]
