"""Cosmos Predict 2.5 (``fastgen.networks.cosmos_predict25``, ``fastgen.networks.cosmos_predict25_codec``): diffusers'
``Cosmos2_5_PredictBasePipeline`` at tiny random size (``tests/tiny_cosmos_predict25.py``) is the oracle - the
wrapper against the model's own ``forward``, the codec against ``encode_prompt`` and ``prepare_latents``, teacher
sampling (text-to-world, and an image continued with guidance) against the pipeline with fastgen's exported
scheduler, the network contract (labels, feature taps, meta builds, activation checkpointing, LoRA), SFT and DMD2
through the real trainer, the export reloaded as the 2.5 pipeline and rendering what ``fastgen sample --prompt`` /
``--image`` writes, and ``fastgen encode-data`` of images and clips against the pipeline's VAE encoding."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from fastgen_testing import random_frames
from tiny_cosmos_predict25 import (
    TEXT_TOKENS,
    cosmos_predict25_pipeline,
    load_pipeline,
    save_pipeline,
    stand_in_torchvision25,
    tiny_transformer,
)

from fastgen.configs.instantiate import instantiate
from fastgen.configs.net_cosmos_predict25 import TINY_COSMOS_PREDICT25, cosmos_predict25_transformer

PROMPT = "a red cat"


def _net(seed: int = 0, **kwargs: Any) -> Any:
    """The tiny Predict 2.5 network with the tiny model's weights (shift 1 unless asked: exportable grids)."""
    net = instantiate(cosmos_predict25_transformer(TINY_COSMOS_PREDICT25, **{"text_tokens": TEXT_TOKENS, "shift": 1.0,
                                                                             **kwargs}))
    net.backbone.model.load_state_dict(tiny_transformer(TINY_COSMOS_PREDICT25, seed).state_dict())
    return net


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny ``Cosmos2_5_PredictBasePipeline`` (16x16 pixels, 5 frames -> 3 latent frames of 8x8)."""
    path = tmp_path_factory.mktemp("cosmos_predict25") / "pipeline"
    save_pipeline(cosmos_predict25_pipeline(tiny_transformer(TINY_COSMOS_PREDICT25)), path)
    return path


def _clip(frame: Any) -> torch.Tensor:
    """The image as ``fastgen.pipelines.world.load_clip`` reads a file: ``(1, 3, 1, 16, 16)`` in ``[-1, 1]``."""
    from diffusers.video_processor import VideoProcessor

    return VideoProcessor(vae_scale_factor=8).preprocess(frame, 16, 16).unsqueeze(2)


@pytest.mark.parametrize("given", [0, 1], ids=["text-to-world", "one-frame-given"])
def test_the_wrapper_is_the_models_own_forward(given: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper's call (the submodules in the order of ``forward``, the text projected by ``crossattn_proj``, the
    condition mask from ``conditioning_frames``, the zero padding mask, no fps) is ``CosmosTransformer3DModel.forward``
    as the pipeline calls it (per-frame ``timestep`` ``(B, 1, T, 1, 1)``, ``condition_mask``, ``padding_mask``), to
    the last bit; a ``(B,)`` time is the per-frame path with every frame at it."""
    stand_in_torchvision25(monkeypatch)
    net = _net()
    model = net.backbone.model
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 1, 3, 8, 8, generator=g)
    text = torch.randn(2, TEXT_TOKENS, 32, generator=g)
    sigma = torch.tensor([0.7, 0.2])
    per_frame = torch.stack([torch.where(torch.arange(3) < given, 1e-4, s) for s in sigma]).float()
    mask = torch.zeros(2, 1, 3, 8, 8)
    mask[:, :, :given] = 1.0
    with torch.no_grad():
        theirs = model(hidden_states=x, timestep=per_frame.view(2, 1, 3, 1, 1), encoder_hidden_states=text,
                       condition_mask=mask, padding_mask=torch.zeros(1, 1, 16, 16), return_dict=False)[0]
        ours = net.backbone._call(x, per_frame, text, **({"conditioning_frames": given} if given else {}))
        assert torch.equal(ours, theirs)
        if not given:
            torch.testing.assert_close(net.backbone._call(x, sigma, text), theirs, atol=1e-6, rtol=0)
        # the condition is the projection's input width: 32 = 2 Qwen layers x 16
        assert net.backbone.text_dim == 32


def test_the_codec_encodes_as_the_pipeline(folder: Path) -> None:
    """``encode_prompts`` is ``encode_prompt``'s prompt embeddings, and ``encode_negative`` its negative ones (the
    pipeline's default negative prompt too); the VAE's latents of a padded image are ``prepare_latents``'
    ``cond_latents`` (zero-frame padding, the posterior's mode, ``(z - mean) * (1 / std)``), and ``denormalise``
    undoes them as ``__call__`` does before decoding."""
    from diffusers.pipelines.cosmos.pipeline_cosmos2_5_predict import DEFAULT_NEGATIVE_PROMPT

    from fastgen.networks.codecs import load_codec
    from fastgen.networks.cosmos_predict25 import conditioning_latents

    pipe = load_pipeline(folder)
    codec = load_codec(folder, max_sequence_length=TEXT_TOKENS)
    assert codec.family == "cosmos25" and not codec.text_in_shards
    prompts = [PROMPT, "two dogs on a beach"]
    with torch.no_grad():
        positive, negative = pipe.encode_prompt(prompts, negative_prompt=["", "blurry"],
                                                max_sequence_length=TEXT_TOKENS)
        default = pipe.encode_prompt(PROMPT, max_sequence_length=TEXT_TOKENS)[1]
    text = codec.condition(codec.encode_prompts(prompts))
    assert text.shape == (2, TEXT_TOKENS, 32)
    torch.testing.assert_close(text, positive, atol=0, rtol=0)
    torch.testing.assert_close(codec.condition(codec.encode_negative(["", "blurry"])), negative, atol=0, rtol=0)
    torch.testing.assert_close(codec.condition(codec.encode_negative([DEFAULT_NEGATIVE_PROMPT])), default, atol=0,
                               rtol=0)
    # each 16-wide layer state is normalised: zero mean, unit (unbiased) std over its width
    layers = text.view(2, TEXT_TOKENS, 2, 16)
    torch.testing.assert_close(layers.mean(-1), torch.zeros(2, TEXT_TOKENS, 2), atol=1e-5, rtol=0)

    frame = random_frames(1, 4)[0]
    from tiny_cosmos_predict25 import to_tensor

    image = to_tensor(frame).unsqueeze(0)
    video = torch.cat([image, torch.zeros_like(image).repeat(4, 1, 1, 1)]).unsqueeze(0)
    video = pipe.video_processor.preprocess_video(video, 16, 16)
    with torch.no_grad():
        noise, cond, _, indicator = pipe.prepare_latents(video, 1, 1, 16, 16, num_frames_in=1, num_frames_out=5,
                                                         dtype=torch.float32, device=torch.device("cpu"),
                                                         generator=torch.Generator().manual_seed(9))
    ours, given = conditioning_latents(codec, [_clip(frame)], 5)
    assert given == 1 and indicator.flatten().tolist() == [1.0, 0.0, 0.0]
    torch.testing.assert_close(ours, cond, atol=0, rtol=0)
    from fastgen.pipelines.noise import PipelineNoise, seeded

    start = PipelineNoise("cosmos25", seeded([9]), 9).initial([1, 3, 8, 8], sigma_max=1.0)
    torch.testing.assert_close(start, noise, atol=0, rtol=0)  # no draw for the conditioning: the noise comes first
    hook, frames = codec.conditioning_latents([_clip(frame)], 5, seeded([9]))  # the samplers' hook: the same
    assert frames == 1 and torch.equal(hook, ours)
    torch.testing.assert_close(codec.denormalise(cond), cond / pipe.latents_std + pipe.latents_mean, atol=0, rtol=0)


@pytest.mark.parametrize(("image", "guidance"), [(False, 0.0), (True, 3.0)], ids=["text-to-world", "image-guided"])
def test_teacher_sampling_is_the_pipelines(folder: Path, monkeypatch: pytest.MonkeyPatch, image: bool,
                                           guidance: float) -> None:
    """fastgen's teacher ODE (4 uniform steps, guidance ``g`` as ``s = g + 1`` against ``""``) gives the latents of
    ``Cosmos2_5_PredictBasePipeline`` with the scheduler fastgen's export writes (``diffusers_sampling``), 1e-5 on
    the generated frames: text to world, and an image continued (one latent frame given in band: the image padded
    with zero frames and encoded to the posterior's mode, ``conditioning_latents``). The given frame is the clean
    latents in fastgen's sample, and the pipeline's state there (stepped with ``gt_velocity``) ends there too."""
    from fastgen.configs.config_utils import load_config
    from fastgen.networks.codecs import load_codec
    from fastgen.networks.conditioning_frames import WithConditioningFrames, with_given_frames
    from fastgen.networks.cosmos_predict25 import conditioning_latents
    from fastgen.pipelines.noise import PipelineNoise, seeded
    from fastgen.pipelines.prompts import ode_sample
    from fastgen.pipelines.schedulers import diffusers_sampling, plan_of

    stand_in_torchvision25(monkeypatch)
    pipe = load_pipeline(folder)
    net = _net(seed=5)  # not the folder's weights until loaded: load_pretrained reads them
    net.backbone.load_pretrained(str(folder))
    codec = load_codec(folder, max_sequence_length=TEXT_TOKENS)
    model = SimpleNamespace(config=load_config("Digits/config_sft_digits").model, noise_scheduler=net.noise_scheduler)
    plan = plan_of(model, "teacher", 4, guidance + 1.0)
    sampling = diffusers_sampling("cosmos25", plan, net)
    assert sampling.call["guidance_scale"] == guidance
    pipe.scheduler = sampling.scheduler
    frame = random_frames(1, 2)[0]
    seed = 7
    media = {"image": frame} if image else {}
    theirs = pipe(prompt=PROMPT, height=16, width=16, num_frames=5, max_sequence_length=TEXT_TOKENS,
                  output_type="latent", generator=torch.Generator().manual_seed(seed), **media, **sampling.call).frames
    start = PipelineNoise("cosmos25", seeded([seed]), seed).initial([1, 3, 8, 8], sigma_max=1.0)
    x, k, sampled = start, 0, net
    if image:
        clean, k = conditioning_latents(codec, [_clip(frame)], 5)
        x, sampled = with_given_frames(start, clean, k), WithConditioningFrames(net, k)
    negative = codec.condition(codec.encode_negative([""])) if guidance else None
    with torch.no_grad():
        ours = ode_sample(sampled, x, codec.condition(codec.encode_prompts([PROMPT])), negative, plan)
    torch.testing.assert_close(ours[:, :, k:], theirs[:, :, k:], atol=1e-5, rtol=0)
    if image:
        torch.testing.assert_close(ours[:, :, :k], clean[:, :, :k], atol=1e-6, rtol=0)  # DDIM steps keep them
        torch.testing.assert_close(theirs[:, :, :k], clean[:, :, :k], atol=1e-5, rtol=0)


def test_contract_refusals_in_one_line() -> None:
    """A config without the text projection, or without the condition-mask channel, is a ConfigError naming it;
    guidance the pipeline cannot apply and a shifted grid are refused by the export."""
    from fastgen.pipelines.schedulers import SamplingPlan, diffusers_sampling
    from fastgen.utils.errors import ConfigError, UsageError

    for change, match in (({"use_crossattn_projection": False}, "use_crossattn_projection"),
                          ({"in_channels": 1}, "condition-mask"),
                          ({"encoder_hidden_states_channels": 8}, "text_embed_dim")):
        with pytest.raises(ConfigError, match=match):
            instantiate(cosmos_predict25_transformer({**TINY_COSMOS_PREDICT25, **change}))
    net = _net()
    with pytest.raises(UsageError, match="above 2"):
        diffusers_sampling("cosmos25", SamplingPlan("ode", (1.0, 0.5), 1.5), net)
    shifted = instantiate(cosmos_predict25_transformer(TINY_COSMOS_PREDICT25, shift=5.0))
    times = tuple(shifted.noise_scheduler.sampling_times(4).tolist()[:-1])
    with pytest.raises(UsageError, match="Cosmos2_5_PredictBasePipeline sets its times"):
        diffusers_sampling("cosmos25", SamplingPlan("ode", times), shifted)


def test_contract_labels_taps_and_refusals() -> None:
    """A label is its prompt-bank row - 32 wide, the projection's input, so the bank goes through ``crossattn_proj``
    as an encoded prompt does (the same output as passing that row); feature taps are the chosen blocks' tokens as
    ``(B, D, F h, w)`` maps; no condition is the zero rows; a log-variance, taps outside the blocks, a condition
    longer than ``text_tokens`` and latents of the wrong width are one-line errors."""
    from fastgen_testing import check_bank_labels_and_taps

    net = _net(num_prompts=4, prompt_tokens=5)
    assert tuple(net.backbone.prompt_bank.shape[1:]) == (5, 32)
    x = torch.randn(2, 1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.3, 0.9])
    labels = torch.tensor([1, 3])
    check_bank_labels_and_taps(net, x, t, labels, (2, 24, 3 * 4, 4))
    with torch.no_grad():
        assert torch.equal(net(x, t, condition=None), net(x, t, condition=torch.zeros(2, 1, 32)))
    with pytest.raises(ValueError, match="text_tokens"):
        net(x, t, condition=torch.randn(2, TEXT_TOKENS + 1, 32))
    with pytest.raises(ValueError, match="1-channel"):
        net(torch.randn(2, 2, 3, 8, 8), t, condition=labels)


def test_a_meta_build_filled_from_a_real_one_predicts_the_same() -> None:
    """``model.meta_init``: the network built on the meta device (a forward there gives the feature shapes DMD2's
    GAN heads are sized by - through the text projection, with no values), allocated with ``to_empty`` and filled
    from a real build (``broadcast_full_weights``) predicts exactly what the real build does, on a video and an
    image."""
    from fastgen.distributed.parallelize import broadcast_full_weights
    from fastgen.networks.discriminator import probe_feature_shapes

    real = _net(num_prompts=2)
    with torch.device("meta"):
        meta = instantiate(cosmos_predict25_transformer(TINY_COSMOS_PREDICT25, text_tokens=TEXT_TOKENS, shift=1.0,
                                                        num_prompts=2))
        assert probe_feature_shapes(meta, [1, 3, 8, 8], [1], 2, t=1.0) == [[24, 3 * 4, 4]]
    assert all(p.is_meta for p in meta.parameters())
    meta.to_empty(device="cpu")
    broadcast_full_weights(meta, real)
    g = torch.Generator().manual_seed(2)
    x, t, text = torch.randn(2, 1, 3, 8, 8, generator=g), torch.tensor([0.3, 0.9]), torch.randn(2, 4, 32, generator=g)
    with torch.no_grad():
        assert torch.equal(meta(x, t, condition=text), real(x, t, condition=text))
        assert torch.equal(meta(x[:, :, 0], t, condition=text), real(x[:, :, 0], t, condition=text))


def test_activation_checkpointing_and_lora_keep_the_gradients() -> None:
    """Activation checkpointing of every block (torch's composable ``checkpoint``, what
    ``model.activation_checkpointing`` applies to ``shard_units``) gives the same gradients - the text projection's
    too, which sits outside the blocks; a LoRA adapter on the self-attention queries and the cross-attention keys
    (which read the projected text) trains only its branches and starts as the base network."""
    from fastgen_testing import check_checkpointing_and_lora

    g = torch.Generator().manual_seed(3)
    x, t, text = torch.randn(2, 1, 3, 8, 8, generator=g), torch.tensor([0.3, 0.9]), torch.randn(2, 4, 32, generator=g)
    reached = []

    def make_net() -> Any:
        net = _net()
        reached.append(net)
        return net

    adapted = check_checkpointing_and_lora(make_net, x, t, text, ["*attn1.to_q", "*attn2.to_k"])
    assert {".".join(path.split(".")[-2:]) for path in adapted} == {"attn1.to_q", "attn2.to_k"}
    projection = reached[1].backbone.model.crossattn_proj[0].weight  # the checkpointed build's
    assert projection.grad is not None and projection.grad.abs().sum() > 0


def _digits_config(method: str, name: str | None = None) -> Any:
    """A digits recipe (``sft`` or ``dmd2``) with the tiny Predict 2.5 (labels through a bank of 10 stand-in prompts
    32 wide), 2 iterations; DMD2 with the GAN head and the teacher guided."""
    from fastgen_testing import tiny_digits_recipe

    net = cosmos_predict25_transformer(TINY_COSMOS_PREDICT25, text_tokens=TEXT_TOKENS, num_prompts=10, prompt_tokens=3,
                                       shift=1.0)
    recipe = tiny_digits_recipe(method, net, name or f"{method}_cosmos_predict25")
    if method == "dmd2":
        recipe.model.gan_loss_weight_gen = 1e-2
        recipe.model.guidance_scale = 3.0
    return recipe


def test_sft_then_dmd2_train_two_iterations_on_digits(output_root: Path, tmp_path: Path) -> None:
    """The real trainer on CPU: SFT trains the tiny Predict 2.5 two iterations on 8x8 digits (rectified flow, label
    dropout) and its weights move - the text projection too; DMD2 then distils the SFT network saved as a diffusers
    folder two iterations (GAN head, guided teacher): the teacher is the folder's weights, student and fake score
    move."""
    from fastgen_testing import sft_then_dmd2_from_its_folder

    sft, _ = sft_then_dmd2_from_its_folder(_digits_config("sft"), _digits_config("dmd2"), tmp_path / "pipeline")
    start = _net(num_prompts=10, prompt_tokens=3).backbone.model.state_dict()
    tuned = sft.net.backbone.model.state_dict()
    assert not torch.equal(tuned["crossattn_proj.0.weight"], start["crossattn_proj.0.weight"])
    assert (output_root / "fastgen" / "digits" / "dmd2_cosmos_predict25" / "checkpoints" / "0000002.pth").is_file()


def _same_8bit(ours: Any, theirs: Any, what: Any) -> None:
    """Two 8-bit renders of the same latents: equal but for rounding - at most 1 apart, in at most 0.5% of the
    values. The tiny VAE damps the latents' differences: another prompt, or the prompt encoded 8 tokens shorter,
    moves only 1.4 - 10% of the values, each by 1, so ``max <= 1`` alone would pass them."""
    difference = abs(ours.astype(int) - theirs.astype(int))
    assert difference.max() <= 1 and (difference > 0).mean() <= 0.005, (what, difference.max(),
                                                                          (difference > 0).mean())


def _rendered(pipe: Any, prompt: str, seed: int, call: dict[str, Any], num_frames: int = 5, **media: Any) -> Any:
    """The pipeline's frames for ``prompt`` and ``seed`` (``output_type="np"``: its denormalisation, VAE and video
    processor) as 8-bit integers ``(num_frames, 16, 16, 3)``."""
    frames = pipe(prompt=prompt, generator=torch.Generator().manual_seed(seed), height=16, width=16,
                  num_frames=num_frames, max_sequence_length=TEXT_TOKENS, output_type="np", **media, **call).frames
    assert frames.shape == (1, num_frames, 16, 16, 3)
    return (frames[0] * 255).round().astype(int)


def test_exports_reload_as_the_25_pipeline_and_sample_as_fastgen(folder: Path, output_root: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-step DMD2 student of the tiny Predict 2.5 (2 iterations on digits from the pipeline folder) and its
    teacher (4 steps, guidance 3 against ""), exported with ``export_diffusers``: ``DiffusionPipeline.from_pretrained``
    gives a ``Cosmos2_5_PredictBasePipeline`` with the exported ``FlowMatchEulerDiscreteScheduler``, and its latents
    for a prompt and seed are fastgen's ``PromptSampler``'s (1e-5; 3 latent frames of 8x8), its decoded frames
    fastgen's pixels (1/255). The exported teacher continues an image as fastgen does (generated frames, 1e-5).

    The command line: ``fastgen sample --prompt`` (two prompts, seeds 5 and 6) writes the PNGs the exported student
    renders for the same prompts and seeds (one-frame samples, as the run's digits), and ``--teacher --image FILE``
    (the run's config with 3 latent frames, ``--config``) an MP4 of the frames the exported teacher renders
    continuing the same 24x20 file - resized as the 2.5 pipeline resizes an ``image=`` (``to_tensor``, then the
    video processor's nearest-neighbour tensor resize: the codec's ``conditioning_image``), not with the Lanczos PIL
    resize ``load_clip`` gives a clip's frames."""
    import json

    import numpy as np
    from fastgen_testing import run_in_process
    from PIL import Image

    from fastgen.checkpoint.run import load_run, select_net
    from fastgen.configs.config_utils import apply_overrides, config_to_yaml, load_config
    from fastgen.networks.codecs import load_codec
    from fastgen.networks.conditioning_frames import WithConditioningFrames, with_given_frames
    from fastgen.networks.cosmos_predict25 import conditioning_latents
    from fastgen.pipelines.export import export_diffusers
    from fastgen.pipelines.media import read_mp4, write_mp4
    from fastgen.pipelines.noise import PipelineNoise, seeded
    from fastgen.pipelines.prompts import PromptSampler, ode_sample
    from fastgen.trainer import Trainer

    stand_in_torchvision25(monkeypatch)
    config = _digits_config("dmd2", "export_cosmos_predict25")
    config.model.pretrained_model_path = str(folder)
    config.model.gan_loss_weight_gen = 0.0
    Trainer(config).run()
    run_dir = output_root / "fastgen" / "digits" / "export_cosmos_predict25"
    run = load_run(run_dir)
    codec = load_codec(folder, max_sequence_length=TEXT_TOKENS)
    calls = {}
    for which, options in (("teacher", {"steps": 4, "guidance": 3.0}), ("net", {})):
        info = export_diffusers(str(run.checkpoint), str(tmp_path / which), only=which, **options)
        assert info["family"] == "cosmos25" and info["scheduler"] == "FlowMatchEulerDiscreteScheduler"
        calls[which] = info["call"]
        pipe = load_pipeline(tmp_path / which)
        assert type(pipe).__name__ == "Cosmos2_5_PredictBasePipeline"
        sampler = PromptSampler(run.model, select_net(run, which), which, codec, **options)
        ours = sampler.latents([PROMPT], [5], [1, 3, 8, 8])
        theirs = pipe(prompt=PROMPT, generator=torch.Generator().manual_seed(5), height=16, width=16, num_frames=5,
                      max_sequence_length=TEXT_TOKENS, output_type="latent", **info["call"]).frames
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
        pixels = sampler.pixels(ours).numpy()[0].astype(int)
        assert pixels.shape == (5, 16, 16, 3)  # the toy VAE: 3 latent frames -> 5
        _same_8bit(_rendered(pipe, PROMPT, 5, info["call"]), pixels, which)
        if which == "teacher":
            frame = random_frames(1, 3)[0]
            image = pipe(prompt=PROMPT, image=frame, generator=torch.Generator().manual_seed(6), height=16, width=16,
                         num_frames=5, max_sequence_length=TEXT_TOKENS, output_type="latent", **info["call"]).frames
            clean, k = conditioning_latents(codec, [_clip(frame)], 5)
            start = PipelineNoise("cosmos25", seeded([6]), 6).initial([1, 3, 8, 8], sigma_max=1.0)
            with torch.no_grad():
                continued = ode_sample(WithConditioningFrames(select_net(run, which), k),
                                       with_given_frames(start, clean, k), sampler.condition([PROMPT]),
                                       sampler.uncondition(1), sampler.plan)
            torch.testing.assert_close(continued[:, :, k:], image[:, :, k:], atol=1e-5, rtol=0)
            # the samplers' path (``fastgen sample --image``): the codec's own conditioning (zero frames, the mode)
            sampled = sampler.latents([PROMPT], [6], [1, 3, 8, 8], clip=_clip(frame))
            torch.testing.assert_close(sampled[:, :, k:], image[:, :, k:], atol=1e-5, rtol=0)

    # ``fastgen sample --prompt``: the student's PNGs are the exported student's renders
    prompts = [PROMPT, "two dogs"]
    result = run_in_process("sample", str(run_dir), "--prompt", prompts[0], "--prompt", prompts[1], "--seed", "5",
                            "--out", str(tmp_path / "cli"))
    assert result.returncode == 0, result.stderr[-2000:]
    records = json.loads((tmp_path / "cli" / "samples.json").read_text())
    assert [(r["file"], r["prompt"], r["seed"]) for r in records] == [("0000.png", prompts[0], 5),
                                                                      ("0001.png", prompts[1], 6)]
    pipe = load_pipeline(tmp_path / "net")
    written = []
    for record in records:
        with Image.open(tmp_path / "cli" / record["file"]) as png:
            written.append(np.asarray(png.convert("RGB")).astype(int))
        theirs = _rendered(pipe, record["prompt"], record["seed"], calls["net"], num_frames=1)[0]
        _same_8bit(theirs, written[-1], record)
    assert np.abs(written[0] - written[1]).max() > 8  # two prompts and seeds, two images

    # ``--teacher --image FILE``: the run's model on 3 latent frames (5 pixel frames) continues the file, an MP4
    video_config = load_config(str(run_dir / "config.yaml"))
    apply_overrides(video_config, ["model.input_shape=[1,3,8,8]"])
    (tmp_path / "video.yaml").write_text(config_to_yaml(video_config))
    Image.fromarray(np.random.default_rng(4).integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(tmp_path / "first.png")
    result = run_in_process("sample", str(run_dir), "--config", str(tmp_path / "video.yaml"), "--teacher", "--steps",
                            "4", "--guidance", "3", "--prompt", PROMPT, "--image", str(tmp_path / "first.png"),
                            "--seed", "6", "--out", str(tmp_path / "cli_image"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "cli_image" / "samples.json").read_text())[0]["file"] == "0000.mp4"
    video = read_mp4(tmp_path / "cli_image" / "0000.mp4").astype(int)
    with Image.open(tmp_path / "first.png") as first:
        theirs = _rendered(load_pipeline(tmp_path / "teacher"), PROMPT, 6, calls["teacher"], image=first.convert("RGB"))
    # H.264 (4:2:0) moves these noisy frames by ~6/255 on average, so the pipeline's frames go through the same
    # encoder: equal frames give equal files (0 here); another prompt moves the decoded frames 0.5/255 on average,
    # another seed 2.7/255, no image 7.6/255
    write_mp4(tmp_path / "theirs.mp4", theirs.astype(np.uint8), fps=16)
    difference = np.abs(video - read_mp4(tmp_path / "theirs.mp4").astype(int))
    assert video.shape == (5, 16, 16, 3) and difference.mean() <= 0.2, (difference.mean(), difference.max())


def test_encode_data_writes_latents_and_captions_only(folder: Path, tmp_path: Path) -> None:
    """``fastgen encode-data`` with a Predict 2.5 folder writes each captioned image's latents (the pipeline's
    normalised VAE mode) and its caption, and no text embeddings (``text_in_shards``: 100,352 wide for the real
    model; the recipes encode captions on the fly with ``model.encode_batches``)."""
    from fastgen_testing import encode_captioned_images

    captions = [PROMPT, "two dogs"]
    images, members, index = encode_captioned_images(tmp_path, folder, captions)
    assert "text" not in index["fields"] and index["latent_shape"] == [1, 8, 8]
    pipe = load_pipeline(folder)
    for image, caption in zip(images, captions):
        assert set(members[caption]) == {"latent"}  # the caption is the txt member they were keyed by
        pixels = torch.from_numpy(image).float().permute(2, 0, 1)[None, :, None] / 127.5 - 1
        with torch.no_grad():
            raw = pipe.vae.encode(pixels).latent_dist.mode()[0, :, 0]
        want = (raw - pipe.latents_mean[0, :, 0]) * pipe.latents_std[0, :, 0]
        torch.testing.assert_close(torch.from_numpy(members[caption]["latent"]), want, atol=1e-6, rtol=0)


def test_encode_data_writes_the_pipelines_latents_of_video_clips(folder: Path, tmp_path: Path) -> None:
    """``fastgen encode-data --frames 5`` with a Predict 2.5 folder: each captioned 24x20 MP4 clip becomes ``(1, 3, 8,
    8)`` latents of its first 5 frames - as read back from the file (H.264 is lossy), centre-cropped to 20x20 and
    resized to 16x16 - equal to the pipeline's own encoding of them (``prepare_latents``: the VAE's mode, ``(z -
    mean) * (1 / std)`` per channel, every frame), and no text; a clip shorter than 5 frames is skipped."""
    import json

    import numpy as np
    from fastgen_testing import run_in_process, shard_samples

    from fastgen.datasets.sources import center_crop_resize_array
    from fastgen.pipelines.media import read_mp4, write_mp4

    src = tmp_path / "clips"
    src.mkdir()
    rng = np.random.default_rng(0)
    captions = {"first": PROMPT, "second": "two dogs", "short": "a short clip"}
    for name, count in (("first", 7), ("second", 5), ("short", 3)):
        write_mp4(src / f"{name}.mp4", rng.integers(0, 256, (count, 20, 24, 3), dtype=np.uint8), fps=8)
        (src / f"{name}.txt").write_text(captions[name])
    shards = tmp_path / "shards"
    result = run_in_process("encode-data", str(src), str(shards), "--weights", str(folder), "--resolution", "16",
                            "--frames", "5", "--device", "cpu")
    assert result.returncode == 0, result.stderr[-2000:]
    index = json.loads((shards / "index.json").read_text())
    assert index["samples"] == 2 and index["latent_shape"] == [1, 3, 8, 8] and "text" not in index["fields"]
    members = shard_samples(shards)
    assert set(members) == {PROMPT, "two dogs"}
    pipe = load_pipeline(folder)
    for name in ("first", "second"):
        sample = members[captions[name]]
        assert set(sample) == {"latent", "txt", "json"}
        assert sample["json"]["frames"] == [0, 1, 5]  # start, stride, count
        frames = np.stack([center_crop_resize_array(f, 16) for f in read_mp4(src / f"{name}.mp4")[:5]])
        video = torch.from_numpy(frames).permute(3, 0, 1, 2)[None].float() / 127.5 - 1
        with torch.no_grad():
            raw = pipe.vae.encode(video).latent_dist.mode()
        want = ((raw - pipe.latents_mean) * pipe.latents_std)[0]
        assert want.shape == (1, 3, 8, 8)
        torch.testing.assert_close(torch.from_numpy(sample["latent"]), want, atol=1e-5, rtol=1e-5)


def test_encode_batches_feeds_captions_through_the_codec_to_a_train_step(folder: Path) -> None:
    """``model.encode_batches`` (the 2.5 recipes' way: shards of latents and captions): a batch of latents and
    caption strings becomes the latents as they are and the codec's 128 x 32 condition, and SFT's step trains on it
    (a finite loss, gradients reaching the text projection)."""
    from fastgen.configs.instantiate import instantiate as build
    from fastgen.networks.codecs import load_codec

    config = _digits_config("sft", "unused")
    config.model.pretrained_model_path = str(folder)
    config.model.encode_batches = True
    config.model.input_shape = [1, 3, 8, 8]
    model = build(config.model_class, config=config.model)
    model.net.backbone.load_pretrained(str(folder))
    latents = torch.randn(2, 1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    captions = [PROMPT, "two dogs"]
    batch = model.encode_batch({"real": latents, "condition": captions})
    assert batch["real"] is latents and batch["caption"] == captions
    codec = load_codec(folder, max_sequence_length=TEXT_TOKENS)
    assert batch["condition"].shape == (2, TEXT_TOKENS, 32)
    torch.testing.assert_close(batch["condition"], codec.condition(codec.encode_prompts(captions)), atol=0, rtol=0)
    losses, _ = model.single_train_step(batch, 0)
    losses["total_loss"].backward()
    assert torch.isfinite(losses["total_loss"])
    assert model.net.backbone.model.crossattn_proj[0].weight.grad.abs().sum() > 0
