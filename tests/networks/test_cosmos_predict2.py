"""Cosmos Predict2 (``fastgen.networks.cosmos_predict2``, ``EDMFlowScheduler``, ``CosmosPredict2Codec``): diffusers'
``CosmosTransformer3DModel`` and ``Cosmos2TextToImagePipeline`` at tiny random size (``tests/tiny_cosmos_predict2.py``:
the real classes, tokenizers built here) are the oracles - the wrapper against the model's own ``forward``, the
schedule against the pipeline's preconditioning and grid, the codec against the pipeline's encoding, fastgen's
teacher ODE against the pipeline's denoising loop, exports against fastgen's samples (and ``fastgen sample --prompt``'s
PNGs); the network contract (labels, feature taps, meta builds, activation checkpointing, LoRA - the last three for
the video-to-world model too -, PDD heads); SFT and DMD2 through the real trainer."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tiny_cosmos_predict2 import (
    TEXT_TOKENS,
    cosmos_predict2_pipeline,
    load_pipeline,
    save_pipeline,
    stand_in_torchvision,
    tiny_transformer,
)

from fastgen.configs.instantiate import instantiate
from fastgen.configs.net_cosmos_predict2 import (
    TINY_COSMOS_PREDICT2,
    TINY_COSMOS_PREDICT2_V2W,
    cosmos_predict2_transformer,
)

PROMPTS = ["a red cat", "two dogs"]
CONFIGS = {"t2i": TINY_COSMOS_PREDICT2, "v2w": TINY_COSMOS_PREDICT2_V2W}


def _net(config: dict[str, Any] = TINY_COSMOS_PREDICT2, seed: int = 0, **kwargs: Any) -> Any:
    """A ``DiffusionNet`` around the tiny model of ``config`` (weights from ``tiny_transformer(seed)``)."""
    net = instantiate(cosmos_predict2_transformer(config, **{"text_tokens": TEXT_TOKENS, **kwargs}))
    net.backbone.model.load_state_dict(tiny_transformer(config, seed).state_dict())
    return net


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_the_wrapper_is_the_models_own_forward(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper's pass through the model's submodules (no torchvision) equals the model's ``forward`` as the
    pipelines call it - the zero padding mask at the pixel size, resized by torchvision's nearest resize (stood in
    for here), and for the video-to-world model an all-zero condition mask - exactly: for a video at ``fps`` 16, an
    image (no fps), one time per frame (the ``(B, 1, F, 1, 1)`` timestep), and a condition shorter than the
    pipeline's ``max_sequence_length`` (the wrapper pads it with the zero rows the pipeline pads with)."""
    stand_in_torchvision(monkeypatch)
    config = CONFIGS[kind]
    net = _net(config)
    model = net.backbone.model
    g = torch.Generator().manual_seed(1)
    x, text = torch.randn(2, 1, 3, 8, 8, generator=g), torch.randn(2, TEXT_TOKENS, 16, generator=g)
    text[:, 11:] = 0  # the pipeline's padding past the prompt
    u, per_frame = torch.tensor([0.3, 0.8]), torch.tensor([[0.3, 0.5, 0.9], [0.8, 0.1, 0.2]])
    padding = torch.zeros(1, 1, 16, 16)  # the pipelines' mask, at the pixel size

    def theirs(latents: torch.Tensor, timestep: torch.Tensor, fps: int | None) -> torch.Tensor:
        extra = {"condition_mask": torch.zeros_like(latents)} if kind == "v2w" else {}
        return model(latents, timestep, text, fps=fps, padding_mask=padding, return_dict=False, **extra)[0]

    with torch.no_grad():
        assert torch.equal(net.backbone(x, u, condition=text), theirs(x, u, 16))
        assert torch.equal(net.backbone(x, u, condition=text[:, :11]), theirs(x, u, 16))
        assert torch.equal(net.backbone(x[:, :, 0], u, condition=text), theirs(x[:, :, :1], u, None)[:, :, 0])
        assert torch.equal(net.backbone(x, per_frame, condition=text), theirs(x, per_frame[:, None, :, None, None], 16))


def test_the_schedule_is_the_pipelines_preconditioning_and_grid() -> None:
    """``EDMFlowScheduler``: ``c_in``, ``c_skip``, ``c_out`` and the time the network sees are the pipeline's
    (``u = sigma / (sigma + 1)``, ``1 - u``, ``1 - u``, ``-u``), bit for bit; the network's input is the
    rectified-flow state at ``u`` and the exact velocity ``eps - x0`` preconditions to ``x0``; the sampling grid is
    the pipeline scheduler's Karras sigmas (``set_timesteps(sigmas=linspace(0, 1, n))`` with its registered
    ``sigma_min`` / ``sigma_max``); training's ``ln sigma ~ N(0, 1)`` is a logit-normal flow time."""
    from fastgen.networks.noise_schedules import EDMFlowScheduler

    pipe = cosmos_predict2_pipeline(tiny_transformer(TINY_COSMOS_PREDICT2))
    schedule = EDMFlowScheduler()
    pipe.scheduler.set_timesteps(sigmas=torch.linspace(0, 1, 6, dtype=torch.float64).tolist())
    sigmas = pipe.scheduler.sigmas[:-1]
    torch.testing.assert_close(schedule.sampling_times(6)[:-1], sigmas, atol=0, rtol=1e-6)
    c_skip, c_out, c_in, c_noise = schedule.precondition(sigmas)
    current_t = sigmas / (sigmas + 1)
    for ours, theirs in ((c_noise, current_t), (c_in, 1 - current_t), (c_skip, 1 - current_t), (c_out, -current_t)):
        assert torch.equal(ours, theirs)
    x0, eps = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(0)).unbind(0)
    sigma = torch.tensor([0.01, 0.5, 1.0, 9.0, 80.0])
    x = schedule.add_noise(x0, eps, sigma)  # x0 + sigma eps
    c_skip, c_out, c_in, u = schedule.precondition(sigma)
    torch.testing.assert_close(c_in[:, None] * x, (1 - u[:, None]) * x0 + u[:, None] * eps)  # the flow state at u
    torch.testing.assert_close(c_skip[:, None] * x + c_out[:, None] * (eps - x0), x0)  # its exact velocity: x0
    draws = schedule.sample_t(20000, generator=torch.Generator().manual_seed(1))
    logit = torch.logit(draws / (1 + draws))
    assert abs(float(logit.mean())) < 0.03 and abs(float(logit.std()) - 1) < 0.03


@pytest.fixture(scope="module")
def pipeline_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny ``Cosmos2TextToImagePipeline`` (the teacher's folder)."""
    folder = tmp_path_factory.mktemp("cosmos_predict2") / "pipeline"
    save_pipeline(cosmos_predict2_pipeline(tiny_transformer(TINY_COSMOS_PREDICT2)), folder)
    return folder


def test_the_codec_encodes_as_the_pipeline(pipeline_folder: Path) -> None:
    """The codec's text is ``encode_prompt``'s (T5 under the attention mask, zero past each prompt, padded to
    ``max_sequence_length``; the negative prompt the same way), its image latents are one frame of Wan's posterior
    mode normalised as ``Cosmos2VideoToWorldPipeline.prepare_latents`` normalises (a video's every frame), and its
    decoding is the pipeline's before ``vae.decode``."""
    from diffusers.pipelines.cosmos.pipeline_cosmos2_video2world import retrieve_latents

    from fastgen.networks.codecs import CosmosPredict2Codec, load_codec

    pipe = load_pipeline(pipeline_folder)
    codec = load_codec(pipeline_folder, max_sequence_length=TEXT_TOKENS)
    assert isinstance(codec, CosmosPredict2Codec) and codec.family == "cosmos2"
    with torch.no_grad():
        cond, uncond = pipe.encode_prompt(PROMPTS, negative_prompt=["blurry", ""], max_sequence_length=TEXT_TOKENS)
    assert torch.equal(codec.encode_prompts(PROMPTS)["text"], cond)
    assert torch.equal(codec.encode_negative(["blurry", ""])["text"], uncond)
    assert cond[0, 11:].abs().sum() == 0 and cond[0, 10].abs().sum() > 0  # 10 tokens and </s>, then zeros

    config = pipe.vae.config
    mean = torch.tensor(config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(config.latents_std).view(1, -1, 1, 1, 1)
    pixels = torch.rand(2, 3, 5, 16, 16, generator=torch.Generator().manual_seed(3)) * 2 - 1
    with torch.no_grad():
        video = (retrieve_latents(pipe.vae.encode(pixels), sample_mode="argmax") - mean) / std
        torch.testing.assert_close(codec.encode_images(pixels), video, atol=1e-6, rtol=0)
        image = (retrieve_latents(pipe.vae.encode(pixels[:, :, :1]), sample_mode="argmax") - mean) / std
        torch.testing.assert_close(codec.encode_images(pixels[:, :, 0]), image[:, :, 0], atol=1e-6, rtol=0)
        latents = torch.randn(1, 1, 8, 8)
        want = pipe.vae.decode(latents[:, :, None] / (1.0 / std) / 1.0 + mean).sample[:, :, 0]
        torch.testing.assert_close(codec.decode_latents(latents), want, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("steps", "guidance"), [(4, 0.0), (5, 3.0)], ids=["plain", "guided"])
def test_teacher_sampling_is_the_pipelines(pipeline_folder: Path, monkeypatch: pytest.MonkeyPatch, steps: int,
                                           guidance: float) -> None:
    """fastgen's teacher ODE over its plan (``plan_of``: ``steps`` Karras sigmas, the last one only reached -
    ``SamplingPlan.end``) from the pipeline's noise (``torch.Generator().manual_seed(seed)`` times ``sigma_max``,
    ``PipelineNoise``), guided ``s = g + 1`` against the negative prompt's encoding, gives the latents of
    ``Cosmos2TextToImagePipeline`` with ``num_inference_steps=steps``, ``guidance_scale=g`` (1e-5); decoded, the
    image the pipeline renders (to 1/255)."""
    from fastgen.configs.config_utils import load_config
    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.noise import PipelineNoise, seeded
    from fastgen.pipelines.prompts import ode_sample, to_uint8
    from fastgen.pipelines.schedulers import plan_of

    stand_in_torchvision(monkeypatch)
    pipe = load_pipeline(pipeline_folder)
    net = _net()
    net.backbone.load_pretrained(str(pipeline_folder))
    codec = load_codec(pipeline_folder, max_sequence_length=TEXT_TOKENS)
    model = SimpleNamespace(config=load_config("Digits/config_sft_digits").model, noise_scheduler=net.noise_scheduler)
    plan = plan_of(model, "teacher", steps, guidance + 1.0)
    assert len(plan.times) == steps - 1 and plan.end == pytest.approx(0.002)
    for prompt, seed in zip(PROMPTS, (4, 5)):
        call = {"height": 16, "width": 16, "num_inference_steps": steps, "guidance_scale": guidance,
                "negative_prompt": "", "max_sequence_length": TEXT_TOKENS}
        theirs = pipe(prompt, generator=torch.Generator().manual_seed(seed), output_type="latent", **call).images
        noise = PipelineNoise("cosmos2", seeded([seed]), seed).initial([1, 8, 8], sigma_max=80.0)
        condition = codec.condition(codec.encode_prompts([prompt]))
        ours = ode_sample(net, noise, condition, codec.condition(codec.encode_negative([""])), plan)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
        rendered = pipe(prompt, generator=torch.Generator().manual_seed(seed), output_type="np", **call).images
        pixels = to_uint8(codec.decode_latents(ours)).numpy()
        assert abs((rendered * 255).round().astype(int) - pixels.astype(int)).max() <= 1


def test_contract_labels_taps_and_refusals() -> None:
    """A label is its prompt-bank row (the same output as passing that row; the bank's rows shorter than the
    pipeline's text are padded like any condition); feature taps are the chosen blocks' tokens as ``(B, D, F h, w)``
    maps; architectures the wrapper does not reproduce, a log-variance, taps outside the blocks, a condition
    longer than ``text_tokens`` and latents of the wrong width are one-line errors."""
    from fastgen_testing import check_bank_labels_and_taps

    from fastgen.utils.errors import ConfigError

    net = _net(num_prompts=4, prompt_tokens=5)
    x = torch.randn(2, 1, 3, 8, 8)
    t = torch.tensor([0.5, 20.0])
    labels = torch.tensor([1, 3])
    check_bank_labels_and_taps(net, x, t, labels, (2, 24, 3 * 4, 4))
    with torch.no_grad():
        assert torch.equal(net(x, t, condition=None), net(x, t, condition=torch.zeros(2, 1, 16)))
    for change, match in (({"img_context_dim_in": 8}, "img_context"), ({"use_crossattn_projection": True}, "2.5"),
                          ({"patch_size": [2, 2, 2]}, "temporal"), ({"in_channels": 3}, "condition mask")):
        with pytest.raises(ConfigError, match=match):
            instantiate(cosmos_predict2_transformer({**TINY_COSMOS_PREDICT2, **change}))
    with pytest.raises(ValueError, match="text_tokens"):
        net(x, t, condition=torch.randn(2, TEXT_TOKENS + 1, 16))
    with pytest.raises(ValueError, match="1-channel"):
        net(torch.randn(2, 2, 8, 8), t, condition=labels)


#: per config: the sample shape the network-contract tests use (an image; for the video-to-world model a 3-frame
#: video, its first latent frame given) and the keyword arguments of its calls
SAMPLES = {"t2i": ([1, 8, 8], {}), "v2w": ([1, 3, 8, 8], {"conditioning_frames": 1})}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_meta_build_filled_from_a_real_one_predicts_the_same(kind: str) -> None:
    """``model.meta_init``: the network built on the meta device (a forward there gives the feature shapes DMD2's
    GAN heads are sized by), allocated with ``to_empty`` and filled from a real build (``broadcast_full_weights``)
    predicts exactly what the real build does - for the video-to-world model also with its first frame given (the
    condition-mask channel's patch-embedding weights filled like the others)."""
    from fastgen.distributed.parallelize import broadcast_full_weights
    from fastgen.networks.discriminator import probe_feature_shapes

    config, (shape, given) = CONFIGS[kind], SAMPLES[kind]
    real = _net(config, num_prompts=2)
    with torch.device("meta"):
        meta = instantiate(cosmos_predict2_transformer(config, text_tokens=TEXT_TOKENS, num_prompts=2))
        tokens = 4 * (shape[1] if len(shape) == 4 else 1)  # the taps' (D, F h, w) maps: 4 x 4 patches a frame
        assert probe_feature_shapes(meta, shape, [1], 2, t=80.0) == [[24, tokens, 4]]
    assert all(p.is_meta for p in meta.parameters())
    meta.to_empty(device="cpu")
    broadcast_full_weights(meta, real)
    x, t, text = torch.randn(2, *shape), torch.tensor([0.3, 9.0]), torch.randn(2, 4, 16)
    with torch.no_grad():
        assert torch.equal(meta(x, t, condition=text), real(x, t, condition=text))
        if given:
            assert torch.equal(meta(x, t, condition=text, **given), real(x, t, condition=text, **given))


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_activation_checkpointing_and_lora_keep_the_gradients(kind: str) -> None:
    """Activation checkpointing of every block (torch's composable ``checkpoint``, what
    ``model.activation_checkpointing`` applies to ``shard_units``) gives the same gradients; a LoRA adapter on the
    self- and cross-attention queries trains only its branches and starts as the base network. The video-to-world
    model is called as its training calls it: a video with its first latent frame given (``WithConditioningFrames``,
    the condition mask on)."""
    from fastgen_testing import check_checkpointing_and_lora

    from fastgen.networks.conditioning_frames import WithConditioningFrames

    config, (shape, given) = CONFIGS[kind], SAMPLES[kind]

    def make_net() -> Any:
        net = _net(config)
        return WithConditioningFrames(net, given["conditioning_frames"]) if given else net

    x, t, text = torch.randn(2, *shape), torch.tensor([0.3, 9.0]), torch.randn(2, 4, 16)
    adapted = check_checkpointing_and_lora(make_net, x, t, text, ["*attn1.to_q", "*attn2.to_q"])
    assert {".".join(path.split(".")[-2:]) for path in adapted} == {"attn1.to_q", "attn2.to_q"}


def test_a_widened_output_projection_gives_one_prediction_per_head() -> None:
    """PDD's heads on a video of the video-to-world model (``check_widened_heads``; images of the text-to-image model:
    ``tests/methods/test_pdd.py``): ``proj_out``'s rows per token ``(p_h, p_w, p_t, head, channel)``."""
    from fastgen_testing import check_widened_heads

    x, t, text = torch.randn(2, 1, 3, 8, 8), torch.tensor([0.3, 9.0]), torch.randn(2, 4, 16)
    check_widened_heads(_net(TINY_COSMOS_PREDICT2_V2W), x, t, text)


def _digits_config(method: str) -> Any:
    """A digits recipe (``sft`` or ``dmd2``) with the tiny Cosmos Predict2 (labels through a bank of 10 stand-in
    prompts), 2 iterations; DMD2 with the GAN head on the fake score's middle block and the teacher guided."""
    from fastgen_testing import tiny_digits_recipe

    net = cosmos_predict2_transformer(TINY_COSMOS_PREDICT2, text_tokens=TEXT_TOKENS, num_prompts=10, prompt_tokens=3)
    recipe = tiny_digits_recipe(method, net, f"{method}_cosmos_predict2")
    if method == "dmd2":
        recipe.model.gan_loss_weight_gen = 1e-2
        recipe.model.guidance_scale = 3.0
    return recipe


def test_sft_then_dmd2_train_two_iterations_on_digits(output_root: Path, tmp_path: Path) -> None:
    """The real trainer, on CPU: SFT trains the tiny Cosmos Predict2 two iterations on 8x8 digits (images, its
    EDM-time schedule, 10% label dropout to the null condition) and its weights move; DMD2 then distils the SFT
    network saved as a diffusers folder (``model.pretrained_model_path``: teacher, student and fake score from it)
    two iterations with the GAN head on the fake score's feature taps and the teacher guided; the teacher is
    exactly the folder's weights and the student and fake score move."""
    from fastgen_testing import sft_then_dmd2_from_its_folder

    sft, _ = sft_then_dmd2_from_its_folder(_digits_config("sft"), _digits_config("dmd2"), tmp_path / "pipeline")
    start = _net(num_prompts=10, prompt_tokens=3).backbone.model.state_dict()
    assert any(not torch.equal(p, start[n]) for n, p in sft.net.backbone.model.state_dict().items()), "SFT moved nothing"
    assert (output_root / "fastgen" / "digits" / "dmd2_cosmos_predict2" / "checkpoints" / "0000002.pth").is_file()


def test_exports_reload_in_diffusers_and_render_as_fastgen_samples(pipeline_folder: Path, output_root: Path,
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-step DMD2 student of the tiny Cosmos Predict2 (2 iterations on digits from the pipeline folder) and its
    teacher (4 steps, guidance 3 against the negative prompt ""), exported with ``convert-ckpt --to diffusers``'s
    ``export_diffusers``: ``DiffusionPipeline.from_pretrained`` gives a ``Cosmos2TextToImagePipeline`` with the
    exported Karras-sigma scheduler. The teacher's latents for a prompt and seed are fastgen's ``PromptSampler``'s
    (1e-5) and its image is fastgen's pixels (1/255). The student's pipeline takes fastgen's one step and then stops
    at ``sigma_min``, as it always does: its latents are ``x0 + 0.002 (x_T - x0) / 80`` of fastgen's sample ``x0``
    (1e-4: float32 Euler from ``|x_T|`` near 250), and its image within 2/255 of fastgen's. ``fastgen sample RUN
    --prompt`` (``--teacher --steps 4 --guidance 3`` for the teacher) writes that same image as ``0000.png``: the
    PNG is within the same tolerance of what the exported pipeline renders. A multi-step student, guidance the
    pipeline cannot apply and times off its grid are refused in one line."""
    import json

    import numpy as np
    from fastgen_testing import run_in_process
    from PIL import Image

    from fastgen.checkpoint.run import load_run, select_net
    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.export import export_diffusers
    from fastgen.pipelines.noise import PipelineNoise, seeded
    from fastgen.pipelines.prompts import PromptSampler
    from fastgen.pipelines.schedulers import SamplingPlan, diffusers_sampling
    from fastgen.trainer import Trainer
    from fastgen.utils.errors import UsageError

    stand_in_torchvision(monkeypatch)
    config = _digits_config("dmd2")
    config.model.pretrained_model_path = str(pipeline_folder)
    config.model.gan_loss_weight_gen = 0.0
    config.log_config.name = "export_cosmos_predict2"
    Trainer(config).run()
    run = load_run(output_root / "fastgen" / "digits" / "export_cosmos_predict2")
    codec = load_codec(pipeline_folder, max_sequence_length=TEXT_TOKENS)
    for which, options in (("teacher", {"steps": 4, "guidance": 3.0}), ("net", {})):
        info = export_diffusers(str(run.checkpoint), str(tmp_path / which), only=which, **options)
        assert info["family"] == "cosmos2" and info["scheduler"] == "FlowMatchEulerDiscreteScheduler"
        assert info["call"]["num_inference_steps"] == (4 if which == "teacher" else 2)
        pipe = load_pipeline(tmp_path / which)
        assert type(pipe).__name__ == "Cosmos2TextToImagePipeline"
        sampler = PromptSampler(run.model, select_net(run, which), which, codec, **options)
        latents = sampler.latents(PROMPTS[:1], [5], [1, 8, 8])
        pixels = sampler.pixels(latents).numpy()

        def theirs(output_type: str) -> Any:
            return pipe(PROMPTS[0], generator=torch.Generator().manual_seed(5), height=16, width=16,
                        max_sequence_length=TEXT_TOKENS, output_type=output_type, **info["call"]).images

        rendered = (theirs("np") * 255).round().astype(int)
        if which == "teacher":
            torch.testing.assert_close(latents, theirs("latent"), atol=1e-5, rtol=0)
            assert abs(rendered - pixels.astype(int)).max() <= 1
        else:
            start = PipelineNoise("cosmos2", seeded([5]), 5).initial([1, 8, 8], sigma_max=80.0)
            torch.testing.assert_close(theirs("latent"), latents + 0.002 * (start - latents) / 80.0, atol=1e-4, rtol=0)
            assert abs(rendered - pixels.astype(int)).max() <= 2
        # the command line: `fastgen sample RUN --prompt` writes the PNG the exported pipeline renders
        flags = ["--teacher", "--steps", "4", "--guidance", "3"] if which == "teacher" else []
        result = run_in_process("sample", str(run.run_dir), "--prompt", PROMPTS[0], "--seed", "5", "--device", "cpu",
                                "--out", str(tmp_path / f"cli_{which}"), *flags)
        assert result.returncode == 0, result.stderr[-2000:]
        records = json.loads((tmp_path / f"cli_{which}" / "samples.json").read_text())
        assert [(r["file"], r["prompt"], r["seed"]) for r in records] == [("0000.png", PROMPTS[0], 5)]
        with Image.open(tmp_path / f"cli_{which}" / "0000.png") as image:
            png = np.asarray(image.convert("RGB")).astype(int)
        assert png.shape == rendered.shape[1:] == (16, 16, 3)
        assert abs(png - rendered[0]).max() <= (1 if which == "teacher" else 2)
        assert np.array_equal(png, pixels[0].astype(int))  # the same sampler as PromptSampler's, to the bit
    net = select_net(run, "net")
    with pytest.raises(UsageError, match="multi-step student"):
        diffusers_sampling("cosmos2", SamplingPlan("renoise", (80.0, 1.0)), net)
    with pytest.raises(UsageError, match="above 2"):
        diffusers_sampling("cosmos2", SamplingPlan("ode", (80.0, 1.0), 1.5, 0.002), net)
    with pytest.raises(UsageError, match="Karras"):
        diffusers_sampling("cosmos2", SamplingPlan("ode", (80.0, 1.0), 1.0, 0.002), net)


def test_encode_data_writes_the_pipelines_latents_and_prompt_embeddings(pipeline_folder: Path, tmp_path: Path) -> None:
    """``fastgen encode-data`` with a Cosmos Predict2 pipeline folder: each captioned 16x16 image becomes ``(1, 8,
    8)`` latents (one frame, dropped) equal to the pipeline's normalised VAE mode, and a ``text.npy`` equal to the
    pipeline's ``encode_prompt`` (512 rows: the codec's default ``max_sequence_length``, the pipeline's)."""
    from diffusers.pipelines.cosmos.pipeline_cosmos2_video2world import retrieve_latents
    from fastgen_testing import encode_captioned_images

    images, members, index = encode_captioned_images(tmp_path, pipeline_folder, PROMPTS)
    assert index["latent_shape"] == [1, 8, 8]
    pipe = load_pipeline(pipeline_folder)
    config = pipe.vae.config
    for image, caption in zip(images, PROMPTS):
        with torch.no_grad():
            want = pipe.encode_prompt(caption, do_classifier_free_guidance=False)[0][0]
        text = torch.from_numpy(members[caption]["text"])
        assert text.shape == (512, 16)
        torch.testing.assert_close(text, want, atol=1e-6, rtol=0)
        pixels = torch.from_numpy(image).float().permute(2, 0, 1)[None, :, None] / 127.5 - 1
        with torch.no_grad():
            raw = retrieve_latents(pipe.vae.encode(pixels), sample_mode="argmax")[0, :, 0]
        want = (raw - torch.tensor(config.latents_mean)[:, None, None]) / torch.tensor(config.latents_std)[:, None, None]
        torch.testing.assert_close(torch.from_numpy(members[caption]["latent"]), want, atol=1e-6, rtol=0)
