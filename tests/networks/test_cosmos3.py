"""Cosmos 3 (``fastgen.networks.cosmos3``): diffusers' ``Cosmos3OmniTransformer`` and ``Cosmos3OmniPipeline`` at
tiny random size (``tests/tiny_cosmos3.py``: the real classes, a tokenizer built here) are the oracles - the batched
packed forward against the model's own ``forward`` on each sample's packed sequence as the pipeline builds it, the
null condition against the pipeline's negative prompt, fastgen's teacher ODE against the pipeline's denoising loop;
the network contract (feature taps, frozen parameters, meta builds); SFT and DMD2 through the real trainer; the
exports reloaded as the pipeline, rendering what ``fastgen sample --prompt`` writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_cosmos3 import SPATIAL, TEMPORAL, cosmos3_pipeline, tiny_transformer

from fastgen.configs.instantiate import instantiate
from fastgen.configs.net_cosmos3 import TINY_COSMOS3, TINY_COSMOS3_SOUND, cosmos3_transformer

PROMPTS = ["a red cat", "two dogs running in the rain"]
SIZES = {"temporal_compression": TEMPORAL, "spatial_compression": SPATIAL}


def _net(config: dict[str, Any] = TINY_COSMOS3, seed: int = 0, **kwargs: Any) -> Any:
    """A ``DiffusionNet`` around the tiny model of ``config`` (weights from ``tiny_transformer(seed)``)."""
    kwargs = {**SIZES, "shift": 1.0, **kwargs}
    net = instantiate(cosmos3_transformer(config, **kwargs))
    net.backbone.model.load_state_dict(tiny_transformer(config, seed).state_dict())
    return net


def _embedded(model: Any, ids: list[list[int]], tokens: int) -> torch.Tensor:
    """The condition of token ids: their rows of the model's table, zero-padded to ``tokens``."""
    out = torch.zeros(len(ids), tokens, model.config.hidden_size)
    with torch.no_grad():
        for i, row in enumerate(ids):
            out[i, : len(row)] = model.embed_tokens(torch.tensor(row))
    return out


def pipeline_forward(pipe: Any, ids: list[int], latents: torch.Tensor, t: float, fps: float = 24.0,
                     sound: torch.Tensor | None = None, t_sound: float | None = None) -> tuple[torch.Tensor, Any]:
    """The model's own ``forward`` on one sample packed as ``Cosmos3OmniPipeline.__call__`` packs it (its
    ``_prepare_*_segment`` methods; every frame noisy; the scheduler's timestep ``1000 t``)."""
    model = pipe.transformer
    text = pipe._prepare_text_segment(ids, device="cpu")
    offset = text["vision_start_temporal_offset"]
    vision = pipe._prepare_vision_segment(latents[None], False, offset, fps, text["und_len"], "cpu")
    positions = [text["text_mrope_ids"], vision["vision_mrope_ids"]]
    length = text["und_len"] + vision["num_vision_tokens"]
    extra: dict[str, Any] = {}
    if sound is not None:
        segment = pipe._prepare_sound_segment(sound, offset, float(model.config.sound_latent_fps), length, "cpu")
        positions.append(segment["sound_mrope_ids"])
        length += segment["sound_len"]
        extra = {"sound_tokens": [sound], "sound_token_shapes": segment["sound_token_shapes"],
                 "sound_sequence_indexes": segment["sound_sequence_indexes"],
                 "sound_mse_loss_indexes": segment["sound_mse_loss_indexes"],
                 "sound_timesteps": torch.full((segment["sound_len"],), float(t_sound) * 1000),
                 "sound_noisy_frame_indexes": segment["sound_noisy_frame_indexes"]}
    with torch.no_grad():
        out = model(input_ids=text["input_ids"], text_indexes=text["text_indexes"],
                    position_ids=torch.cat(positions, dim=1), und_len=text["und_len"], sequence_length=length,
                    vision_tokens=[latents[None]], vision_token_shapes=vision["vision_token_shapes"],
                    vision_sequence_indexes=vision["vision_sequence_indexes"],
                    vision_mse_loss_indexes=vision["vision_mse_loss_indexes"],
                    vision_timesteps=torch.full((vision["num_noisy_vision_tokens"],), float(t) * 1000),
                    vision_noisy_frame_indexes=vision["vision_noisy_frame_indexes"], return_dict=False, **extra)
    return out[0][0][0], (out[1][0] if sound is not None else None)


@pytest.mark.parametrize("config", [TINY_COSMOS3, TINY_COSMOS3_SOUND], ids=["qwen3", "nemotron_sound"])
def test_a_batch_is_the_models_own_forward_on_each_packed_sample(config: dict[str, Any]) -> None:
    """Three samples in one batch - prompts of different lengths (the shorter zero-padded, the padding masked) and
    one null condition (the negative ids) - over odd-width latents (the model's zero padding to whole patches),
    each at its own time; with the sound path, audio at other times: every sample's velocities are the model's
    own ``forward`` on that sample's sequence as the pipeline packs it (to 1e-5)."""
    net = _net(config, negative_ids=[5, 6, 7])
    model = net.backbone.model
    pipe = cosmos3_pipeline(model)
    ids = [pipe.tokenize_prompt(p, None, num_frames=5, height=16, width=18)[0] for p in PROMPTS] + [[5, 6, 7]]
    condition = _embedded(model, ids[:2], max(map(len, ids)) + 3)
    condition = torch.cat([condition, torch.zeros_like(condition[:1])])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 1, 3, 8, 9, generator=g)
    t = torch.tensor([0.3, 0.7, 0.95])
    sound = torch.randn(3, 2, 5, generator=g) if config.get("sound_gen") else None
    with torch.no_grad():
        if sound is None:
            got = {"video": net(x, t, condition=condition)}
        else:
            got = net({"video": x, "audio": sound}, {"video": t, "audio": t.flip(0)}, condition=condition)
    for i in range(3):
        video, audio = pipeline_forward(pipe, ids[i], x[i], float(t[i]), sound=None if sound is None else sound[i],
                                        t_sound=float(t.flip(0)[i]))
        torch.testing.assert_close(got["video"][i], video, atol=1e-5, rtol=0)
        if sound is not None:
            torch.testing.assert_close(got["audio"][i], audio, atol=1e-5, rtol=0)


def _digits_config(method: str, tmp_path: Path, config: dict[str, Any] = TINY_COSMOS3) -> Any:
    """A digits recipe (``sft`` or ``dmd2``) with the tiny Cosmos 3 (labels through a bank of 10 stand-in embedded
    prompts, the null condition ids 1..3), 2 iterations, no W&B / validation."""
    from fastgen_testing import tiny_digits_recipe

    net = cosmos3_transformer(config, negative_ids=[1, 2, 3], num_prompts=10, prompt_tokens=3, **SIZES)
    recipe = tiny_digits_recipe(method, net, f"{method}_cosmos3")
    if method == "dmd2":
        recipe.model.gan_loss_weight_gen = 1e-2  # the GAN head reads the feature taps of the fake score's middle layer
    return recipe


@pytest.mark.slow
def test_sft_then_dmd2_train_two_iterations_on_digits(output_root: Path, tmp_path: Path) -> None:
    """The real trainer, on CPU: SFT trains the tiny Cosmos 3 two iterations on 8x8 digits (one-frame latents, the
    text-to-image path; 10% label dropout to the null condition) and its weights move; DMD2 then distils the SFT
    network saved as a diffusers folder (``model.pretrained_model_path``: teacher, student and fake score from it)
    two iterations with the GAN head on the fake score's feature taps; the teacher is exactly the folder's weights
    and the student and fake score move."""
    from fastgen_testing import sft_then_dmd2_from_its_folder

    sft, _ = sft_then_dmd2_from_its_folder(_digits_config("sft", tmp_path), _digits_config("dmd2", tmp_path),
                                           tmp_path / "pipeline")
    start = instantiate(cosmos3_transformer(TINY_COSMOS3, negative_ids=[1, 2, 3], num_prompts=10, prompt_tokens=3))
    moved = [n for n, p in sft.net.backbone.model.named_parameters() if p.requires_grad
             and not torch.equal(p, dict(start.backbone.model.named_parameters())[n])]
    assert moved, "SFT changed no weight"
    assert (output_root / "fastgen" / "digits" / "dmd2_cosmos3" / "checkpoints" / "0000002.pth").is_file()


@pytest.fixture(scope="module")
def pipeline_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny pipeline (the teacher's folder) with rectified-flow Euler over the grid (1, 2/3, 1/3): its
    ``set_timesteps(3)`` then evaluates exactly fastgen's 3-step uniform grid (``shift_terminal`` = the last time)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    folder = tmp_path_factory.mktemp("cosmos3") / "pipeline"
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, shift_terminal=1 / 3)
    cosmos3_pipeline(tiny_transformer(TINY_COSMOS3), scheduler).save_pretrained(folder)
    return folder


def _pipeline(folder: Path) -> Any:
    from diffusers import Cosmos3OmniPipeline

    pipe = Cosmos3OmniPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("frames", [5, 1], ids=["video", "image"])
def test_the_null_condition_is_the_pipelines_negative_prompt(pipeline_folder: Path, frames: int) -> None:
    """An all-zero condition (what classifier-free-guidance dropout and the methods' unconditional branch pass) and
    ``None`` are the pipeline's unconditional input: its ``tokenize_prompt`` negative ids (``""`` with the inverse
    duration / resolution sentences, the system turn) for the sample's pixel size - a video's and an image's
    differ - through the model's own table. ``model.pretrained_model_path`` hands the folder's tokenizer to the
    network (``adopt_folder``)."""
    from fastgen.configs.config_utils import load_config
    from fastgen.methods.sft import SFTModel

    config = load_config("Digits/config_sft_digits").model
    config.net = cosmos3_transformer(TINY_COSMOS3, **SIZES)
    config.pretrained_model_path = str(pipeline_folder)
    config.input_shape = [1, 8, 8]
    model = SFTModel(config)
    assert config.net.backbone.tokenizer == str(pipeline_folder)
    model.init_weights()
    net = model.net
    pipe = _pipeline(pipeline_folder)
    negative = pipe.tokenize_prompt("a red cat", None, num_frames=frames, height=16, width=16)[1]
    latent_frames = (frames - 1) // TEMPORAL + 1
    x = torch.randn(2, 1, latent_frames, 8, 8, generator=torch.Generator().manual_seed(2))
    t = torch.tensor([0.4, 0.8])
    with torch.no_grad():
        null = net(x, t, condition=torch.zeros(2, 7, 16))
        none = net(x, t, condition=None)
    torch.testing.assert_close(none, null, atol=0, rtol=0)
    for i in range(2):
        want, _ = pipeline_forward(pipe, negative, x[i], float(t[i]))
        torch.testing.assert_close(null[i], want, atol=1e-5, rtol=0)
    other = pipe.tokenize_prompt("a red cat", None, num_frames=6 - frames, height=16, width=16)[1]
    assert other != negative  # the image's sentences and system turn are not the video's


@pytest.mark.parametrize("frames", [5, 1], ids=["video", "image"])
def test_teacher_sampling_with_guidance_is_the_pipelines(pipeline_folder: Path, frames: int) -> None:
    """fastgen's teacher ODE (``ode_sample``: DDIM over the 3-step grid, guidance 3 on the denoised estimate)
    from the pipeline's noise (``torch.Generator().manual_seed(seed)``), conditioned on the codec's encoding of the
    prompt, against the negative prompt's encoding - and against the all-zero null condition - gives the latents of
    ``Cosmos3OmniPipeline`` (the same scheduler grid, ``guidance_scale`` 3: ``u + s (c - u)`` on the velocities) to
    1e-4, for a 5-frame video and an image; decoded, the frames the pipeline renders (to 1/255)."""
    from fastgen.networks.cosmos3_codec import Cosmos3Codec
    from fastgen.pipelines.prompts import ode_sample, to_uint8
    from fastgen.pipelines.schedulers import SamplingPlan

    pipe = _pipeline(pipeline_folder)
    net = instantiate(cosmos3_transformer(TINY_COSMOS3, tokenizer=str(pipeline_folder), shift=1.0, **SIZES))
    net.backbone.load_pretrained(str(pipeline_folder))
    codec = Cosmos3Codec.from_pretrained(pipeline_folder, num_frames=frames, height=16, width=16)
    plan = SamplingPlan("ode", (1.0, 2 / 3, 1 / 3), 3.0)
    assert net.noise_scheduler.sampling_times(3).tolist()[:-1] == pytest.approx(list(plan.times))
    latent_frames = (frames - 1) // TEMPORAL + 1
    for prompt, seed in zip(PROMPTS, (4, 5)):
        call = {"num_frames": frames, "height": 16, "width": 16, "num_inference_steps": 3, "guidance_scale": 3.0}
        theirs = pipe(prompt, generator=torch.Generator().manual_seed(seed), output_type="latent", **call).video
        noise = torch.randn(1, 1, latent_frames, 8, 8, generator=torch.Generator().manual_seed(seed))
        condition = codec.condition(codec.encode_prompts([prompt]))
        for uncondition in (codec.condition(codec.encode_negative([""])), torch.zeros_like(condition)):
            ours = ode_sample(net, noise if frames > 1 else noise[:, :, 0], condition, uncondition, plan)
            torch.testing.assert_close(ours if frames > 1 else ours.unsqueeze(2), theirs, atol=1e-4, rtol=0)
        frames_np = pipe(prompt, generator=torch.Generator().manual_seed(seed), output_type="np", **call).video
        pixels = to_uint8(codec.decode_latents(ours)).numpy()
        pixels = pixels[0] if frames > 1 else pixels
        rendered = (frames_np * 255).round().astype(int)
        assert abs(rendered - pixels.astype(int)).max() <= 1


def test_the_codec_encodes_as_the_pipeline(pipeline_folder: Path) -> None:
    """The codec's ids are ``tokenize_prompt``'s (prompt and negative, video and image, with and without the system
    turn and templates), its condition rows are the transformer's ``embed_tokens`` rows zero-padded, and its latents
    are the pipeline's ``_encode_video`` (Wan's posterior mode, ``(z - mu) * (1 / sigma)``); decoding inverts that
    normalisation as the pipeline does before its VAE."""
    from fastgen.networks.cosmos3_codec import Cosmos3Codec

    pipe = _pipeline(pipeline_folder)
    for frames, options in ((5, {}), (1, {}), (5, {"use_system_prompt": False, "add_duration_template": False}),
                            (1, {"add_resolution_template": False})):
        codec = Cosmos3Codec.from_pretrained(pipeline_folder, num_frames=frames, height=16, width=32, fps=12.0,
                                             max_tokens=256, **options)
        cond, uncond = pipe.tokenize_prompt(PROMPTS[1], "blurry", num_frames=frames, height=16, width=32, fps=12.0,
                                            **options)
        assert codec.token_ids([PROMPTS[1]]) == [cond] and codec.token_ids(["blurry"], negative=True) == [uncond]
    encoded = codec.encode_prompts(PROMPTS)
    ids = codec.token_ids(PROMPTS)
    torch.testing.assert_close(encoded["text"], _embedded(pipe.transformer, ids, 256), atol=0, rtol=0)
    assert encoded["text_mask"].sum(1).tolist() == [len(row) for row in ids]
    with pytest.raises(Exception, match="max_tokens"):
        Cosmos3Codec.from_pretrained(pipeline_folder, max_tokens=8).encode_prompts(PROMPTS)

    pixels = torch.rand(2, 3, 5, 16, 16, generator=torch.Generator().manual_seed(3)) * 2 - 1
    with torch.no_grad():
        torch.testing.assert_close(codec.encode_images(pixels), pipe._encode_video(pixels), atol=0, rtol=0)
        image = codec.encode_images(pixels[:, :, 0])
        torch.testing.assert_close(image, pipe._encode_video(pixels[:, :, :1]), atol=0, rtol=0)
        latents = torch.randn(1, 1, 3, 8, 8)
        mean, inv_std = pipe._vae_latents_mean.view(1, -1, 1, 1, 1), pipe._vae_latents_inv_std.view(1, -1, 1, 1, 1)
        want = pipe.vae.decode(latents / inv_std + mean).sample
        torch.testing.assert_close(codec.decode_latents(latents), want, atol=0, rtol=0)


def test_contract_labels_taps_and_refusals() -> None:
    """A label is its prompt-bank row (the same output as passing that row); feature taps are the chosen layers'
    vision tokens as ``(B, D, F h, w)`` maps (odd widths padded to whole patches); an audio modality without the
    model's sound path, a log-variance and taps outside the layers are one-line errors; a missing tokenizer is
    named when the null condition is needed."""
    from fastgen_testing import check_bank_labels_and_taps

    from fastgen.utils.errors import ConfigError

    net = _net(negative_ids=[1, 2], num_prompts=4, prompt_tokens=3)
    x = torch.randn(2, 1, 3, 8, 7)
    t = torch.tensor([0.2, 0.6])
    labels = torch.tensor([1, 3])
    check_bank_labels_and_taps(net, x, t, labels, (2, 16, 3 * 4, 4))
    with pytest.raises(ConfigError, match="sound_gen"):
        net({"video": x, "audio": torch.randn(2, 2, 4)}, t, condition=labels)
    bare = _net()
    with pytest.raises(ConfigError, match="tokenizer"):
        bare(x, t, condition=None)


@pytest.mark.parametrize("config", [TINY_COSMOS3, TINY_COSMOS3_SOUND], ids=["qwen3", "nemotron_sound"])
def test_the_frozen_parameters_are_exactly_those_no_prediction_depends_on(config: dict[str, Any]) -> None:
    """With every parameter trainable, a backward of the predictions (video, and sound where the model has it)
    leaves without a gradient exactly the parameters the wrapper freezes (the LM head, the token table, the text
    stream's final norm, the last layer's text-only parts) - so freezing them changes no gradient - and every other
    parameter gets one."""
    net = _net(config, negative_ids=[1, 2, 3])
    backbone = net.backbone
    frozen = {id(p) for p in backbone.unused_parameters()}
    assert frozen and all(not p.requires_grad for p in backbone.unused_parameters())
    backbone.requires_grad_(True)
    x = {"video": torch.randn(2, 1, 3, 8, 8)}
    if config.get("sound_gen"):
        x["audio"] = torch.randn(2, 2, 4)
    out = net(x, torch.tensor([0.3, 0.6]), condition=torch.randn(2, 5, 16))
    sum(v.square().sum() for v in out.values()).backward()
    names = {id(p): n for n, p in backbone.model.named_parameters()}
    without = {id(p) for p in backbone.model.parameters() if p.grad is None or not p.grad.abs().sum()}
    assert without == frozen, sorted(names[i] for i in without ^ frozen)


def test_a_meta_build_filled_from_a_real_one_predicts_the_same() -> None:
    """``model.meta_init``: the network built on the meta device (no memory; a forward there gives the feature
    shapes), allocated with ``to_empty`` and filled from a real build (``broadcast_full_weights``: parameters, buffers, and the rotary table outside the
    state dict) predicts exactly what the real build does; the frozen parameters are frozen there too."""
    from fastgen.distributed.parallelize import broadcast_full_weights
    from fastgen.networks.discriminator import probe_feature_shapes

    real = _net(negative_ids=[1, 2, 3], num_prompts=2)
    with torch.device("meta"):
        meta = instantiate(cosmos3_transformer(TINY_COSMOS3, shift=1.0, num_prompts=2, **SIZES))
        # DMD2 sizes its GAN heads by a forward there: no values, so no text lengths, tokenizer or rotary table
        assert probe_feature_shapes(meta, [1, 3, 8, 8], [1], 2, t=1.0) == [[16, 3 * 4, 4]]
    assert all(p.is_meta for p in meta.parameters())
    meta.negative_ids = [1, 2, 3]
    meta.to_empty(device="cpu")
    broadcast_full_weights(meta, real)
    x, t, text = torch.randn(2, 1, 3, 8, 8), torch.tensor([0.3, 0.9]), torch.randn(2, 4, 16)
    with torch.no_grad():
        assert torch.equal(meta(x, t, condition=text), real(x, t, condition=text))
    assert [p.requires_grad for p in meta.parameters()] == [p.requires_grad for p in real.parameters()]


def test_activation_checkpointing_and_lora_keep_the_gradients() -> None:
    """Activation checkpointing of every decoder layer (torch's composable ``checkpoint``, what
    ``model.activation_checkpointing`` applies to ``shard_units``) gives the same gradients; a LoRA adapter on the
    layers' attention projections (both streams) trains only its branches and starts as the base network."""
    from fastgen_testing import check_checkpointing_and_lora

    x, t, text = torch.randn(2, 1, 3, 8, 8), torch.tensor([0.3, 0.9]), torch.randn(2, 4, 16)
    adapted = check_checkpointing_and_lora(lambda: _net(negative_ids=[1]), x, t, text,
                                           ["*self_attn.to_q", "*self_attn.add_q_proj"])
    assert {path.split(".")[-1] for path in adapted} == {"to_q", "add_q_proj"}


@pytest.mark.parametrize("method", ["sft", "dmd2"])
def test_video_and_sound_train_as_one_multimodal_sample(method: str) -> None:
    """With the sound path, a sample is ``{"video": (B, C, F, H, W), "audio": (B, C_s, T_s)}``
    (``model.modality_shapes``): SFT's step gives a loss per modality and gradients reach both streams' input and
    output projections; DMD2's student and critic iterations train both modalities (each modality's own
    distribution-matching gradient; the teacher guided against the null condition)."""
    from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config
    from fastgen.configs.methods.config_sft import create_config as sft_config

    config = (sft_config if method == "sft" else dmd2_config)()
    config.model.net = cosmos3_transformer(TINY_COSMOS3_SOUND, negative_ids=[1, 2], num_prompts=3, prompt_tokens=2,
                                           **SIZES)
    config.model.num_classes = 3
    config.model.modality_shapes = {"video": [1, 2, 8, 8], "audio": [2, 6]}
    if method == "dmd2":
        config.model.t_list = [1.0, 0.5]
        config.model.student_update_freq = 2
        config.model.guidance_scale = 2.0
    else:
        config.model.condition_dropout = 0.5
    torch.manual_seed(0)
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    g = torch.Generator().manual_seed(3)
    data = {"real": {"video": torch.randn(3, 1, 2, 8, 8, generator=g), "audio": torch.randn(3, 2, 6, generator=g)},
            "condition": torch.tensor([0, 1, 2])}
    steps = [0] if method == "sft" else [0, 1]
    for iteration in steps:
        loss, _ = model.single_train_step(data, iteration)
        model.zero_grad()
        loss["total_loss"].backward()
        trained = model.net if iteration == 0 else model.fake_score
        for name in ("proj_in", "proj_out", "audio_proj_in", "audio_proj_out"):
            grad = getattr(trained.backbone.model, name).weight.grad
            assert grad is not None and grad.abs().sum() > 0, (iteration, name)
    key = "denoising_loss" if method == "sft" else "fake_score_loss"
    assert {f"{key}_video", f"{key}_audio"} <= set(loss)


def test_exports_reload_in_diffusers_and_render_as_fastgen_samples(pipeline_folder: Path, output_root: Path,
                                                                  tmp_path: Path) -> None:
    """A 2-step DMD2 student of the tiny Cosmos 3 (2 iterations on digits from the pipeline folder) and its teacher
    (3-step ODE, guidance 2 against the negative prompt), exported with ``convert-ckpt --to diffusers``'s
    ``export_diffusers``: ``DiffusionPipeline.from_pretrained`` gives a ``Cosmos3OmniPipeline`` with the exported
    rectified-flow Euler scheduler, whose latents for a prompt and seed are fastgen's ``PromptSampler``'s (the
    codec sized for the sampled latents, as ``fastgen sample`` samples; 1e-4) and whose frames are its pixels
    (1/255); the student's re-noising comes from torch's global generator in both. The command line, ``fastgen
    sample --prompt`` from the run directory, writes the PNGs the exported pipelines render for the same prompts
    and seeds (1/255): the student's for one prompt (seed 5: its re-noising draws from the global generator
    seeded with the first seed, for the whole batch), the teacher's (``--teacher --steps 3 --guidance 2``) for
    two (seeds 5 and 6, each its own generator's)."""
    import json

    import numpy as np
    from diffusers import DiffusionPipeline
    from fastgen_testing import run_in_process
    from PIL import Image

    from fastgen.checkpoint.run import load_run, select_net
    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.export import export_diffusers
    from fastgen.pipelines.prompts import PromptSampler
    from fastgen.trainer import Trainer

    config = _digits_config("dmd2", tmp_path)
    config.model.net = cosmos3_transformer(TINY_COSMOS3, num_prompts=10, prompt_tokens=3, shift=1.0, **SIZES)
    config.model.pretrained_model_path = str(pipeline_folder)
    config.model.t_list = [1.0, 0.5]
    config.model.gan_loss_weight_gen = 0.0
    config.log_config.name = "export_cosmos3"
    Trainer(config).run()
    run = load_run(output_root / "fastgen" / "digits" / "export_cosmos3")
    codec = load_codec(pipeline_folder)
    calls = {}
    for which, options in (("net", {}), ("teacher", {"steps": 3, "guidance": 2.0})):
        info = export_diffusers(str(run.checkpoint), str(tmp_path / which), only=which, **options)
        assert info["family"] == "cosmos3" and info["scheduler"] == "FlowMatchEulerDiscreteScheduler"
        calls[which] = info["call"]
        assert info["global_seed"] == (which == "net")
        pipe = DiffusionPipeline.from_pretrained(tmp_path / which)
        pipe.set_progress_bar_config(disable=True)
        assert type(pipe).__name__ == "Cosmos3OmniPipeline"
        sampler = PromptSampler(run.model, select_net(run, which), which, codec, **options)
        latents = sampler.latents(PROMPTS[:1], [5], [1, 8, 8])
        pixels = sampler.pixels(latents).numpy()

        def theirs(output_type: str) -> Any:
            torch.manual_seed(5)  # the student's re-noising: torch's global generator (info["global_seed"])
            return pipe(PROMPTS[0], generator=torch.Generator().manual_seed(5), num_frames=1, height=16, width=16,
                        output_type=output_type, **info["call"]).video

        torch.testing.assert_close(latents, theirs("latent")[:, :, 0], atol=1e-4, rtol=0)
        rendered = (theirs("np") * 255).round().astype(int)
        assert abs(rendered - pixels.astype(int)).max() <= 1, which

    # ``fastgen sample --prompt`` from the run directory: the files it writes are the exported pipelines' renders
    for which, extra, prompts in (("net", [], PROMPTS[:1]),
                                  ("teacher", ["--teacher", "--steps", "3", "--guidance", "2"], PROMPTS)):
        out = tmp_path / f"cli_{which}"
        result = run_in_process("sample", str(output_root / "fastgen" / "digits" / "export_cosmos3"), *extra,
                                *[arg for prompt in prompts for arg in ("--prompt", prompt)], "--seed", "5",
                                "--out", str(out))
        assert result.returncode == 0, result.stderr[-2000:]
        records = json.loads((out / "samples.json").read_text())
        assert [(r["file"], r["prompt"], r["seed"]) for r in records] == [
            (f"{i:04d}.png", prompt, 5 + i) for i, prompt in enumerate(prompts)]
        pipe = DiffusionPipeline.from_pretrained(tmp_path / which)
        pipe.set_progress_bar_config(disable=True)
        for record in records:
            with Image.open(out / record["file"]) as png:
                written = np.asarray(png.convert("RGB")).astype(int)
            torch.manual_seed(record["seed"])  # the student's re-noising (the teacher draws none)
            frames = pipe(record["prompt"], generator=torch.Generator().manual_seed(record["seed"]), num_frames=1,
                          height=16, width=16, output_type="np", **calls[which]).video
            assert frames.shape == (1, 16, 16, 3) == (1, *written.shape)  # one frame: an image per prompt
            # equal but for rounding: the tiny VAE damps latent differences, so another prompt moves only a few
            # percent of the 8-bit values, each by 1 - at most 0.5% may differ
            difference = abs((frames[0] * 255).round().astype(int) - written)
            assert difference.max() <= 1 and (difference > 0).mean() <= 0.005, (which, record, difference.max(),
                                                                                 (difference > 0).mean())


def test_encode_data_writes_the_pipelines_latents_and_prompt_embeddings(pipeline_folder: Path, tmp_path: Path) -> None:
    """``fastgen encode-data`` with a Cosmos 3 pipeline folder: each captioned 16x16 image becomes one-frame latents
    ``(1, 1, 8, 8)`` equal to the pipeline's ``_encode_video`` and a ``text.npy`` of 512 rows - the transformer's
    embeddings of the ids ``tokenize_prompt`` gives the caption for an image of 16x16 (the codec sized from the
    latents), then zeros."""
    from fastgen_testing import encode_captioned_images

    images, members, index = encode_captioned_images(tmp_path, pipeline_folder, PROMPTS)
    assert index["latent_shape"] == [1, 1, 8, 8]
    pipe = _pipeline(pipeline_folder)
    for image, caption in zip(images, PROMPTS):
        text = torch.from_numpy(members[caption]["text"])
        ids = pipe.tokenize_prompt(caption, None, num_frames=1, height=16, width=16)[0]
        torch.testing.assert_close(text, _embedded(pipe.transformer, [ids], 512)[0], atol=0, rtol=0)
        pixels = torch.from_numpy(image).float().permute(2, 0, 1)[None, :, None] / 127.5 - 1
        with torch.no_grad():
            want = pipe._encode_video(pixels)[0]
        torch.testing.assert_close(torch.from_numpy(members[caption]["latent"]), want, atol=1e-6, rtol=0)


def test_a_widened_output_projection_gives_one_prediction_per_head() -> None:
    """PDD's heads (``check_widened_heads``): ``proj_out`` widened into 3 copies of itself (rows per token ``(p, p,
    head, channel)``) gives 3 predictions ``(B, 3, C, F, H, W)``, each the base network's at initialisation (odd
    widths cropped as the single head's), and each head's rows are its own."""
    from fastgen_testing import check_widened_heads

    x, t, text = torch.randn(2, 1, 3, 8, 7), torch.tensor([0.3, 0.9]), torch.randn(2, 4, 16)
    check_widened_heads(_net(negative_ids=[1]), x, t, text)
