"""Video-to-world (``fastgen.networks.conditioning_frames``, ``fastgen.pipelines.world``) with Cosmos Predict2's
Video2World model: diffusers' ``Cosmos2VideoToWorldPipeline`` at tiny random size (``tests/tiny_cosmos_predict2.py``)
is the oracle for sampling from a conditioning image or clip and for the codec and ``encode-data`` of clips (its
``encode_prompt`` and ``prepare_latents``); the network contract on given frames; SFT on moving digits with the first
latent frame given, through the real trainer (also on 2 FSDP2 ranks after a meta-device build, through the real
launcher); DMD2 on given frames; the refusals."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from fastgen_testing import random_frames
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

PROMPT = "a red cat"


def _net(config: dict[str, Any] = TINY_COSMOS_PREDICT2_V2W, seed: int = 0, **kwargs: Any) -> Any:
    net = instantiate(cosmos_predict2_transformer(config, **{"text_tokens": TEXT_TOKENS, **kwargs}))
    net.backbone.model.load_state_dict(tiny_transformer(config, seed).state_dict())
    return net


@pytest.fixture(scope="module")
def world_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny ``Cosmos2VideoToWorldPipeline`` (16x16 pixels, 5 frames -> 3 latent frames of 8x8)."""
    folder = tmp_path_factory.mktemp("cosmos_predict2_world") / "pipeline"
    save_pipeline(cosmos_predict2_pipeline(tiny_transformer(TINY_COSMOS_PREDICT2_V2W)), folder)
    return folder


@pytest.mark.parametrize(("clip_frames", "given", "guidance"), [(1, 1, 0.0), (3, 2, 3.0)], ids=["image", "clip-guided"])
def test_video_to_world_sampling_is_the_pipelines(world_folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                  clip_frames: int, given: int, guidance: float) -> None:
    """From a conditioning image (one latent frame given) or a 3-frame clip (two: the toy VAE halves time), fastgen's
    teacher ODE over the pipeline's Karras grid - the clip padded and encoded with the sample's generator
    (``conditioning_latents``), the noise drawn after it, the given frames put in the state - gives the generated
    latent frames of ``Cosmos2VideoToWorldPipeline`` (``num_frames`` 5, guidance ``g`` as ``s = g + 1``) to 1e-5.
    The given frames are the clean latents where the pipeline's state ends ``sigma_min`` away from them
    (``x0 + 0.002 (x_T - x0) / 80``)."""
    from fastgen.configs.config_utils import load_config
    from fastgen.networks.codecs import load_codec
    from fastgen.networks.conditioning_frames import WithConditioningFrames
    from fastgen.pipelines.noise import PipelineNoise, seeded
    from fastgen.pipelines.prompts import ode_sample
    from fastgen.pipelines.schedulers import plan_of
    from fastgen.pipelines.world import conditioning_latents, load_clip

    stand_in_torchvision(monkeypatch)
    pipe = load_pipeline(world_folder)
    net = _net()
    net.backbone.load_pretrained(str(world_folder))
    codec = load_codec(world_folder, max_sequence_length=TEXT_TOKENS)
    frames = random_frames(clip_frames, seed=clip_frames)
    model = SimpleNamespace(config=load_config("Digits/config_sft_digits").model, noise_scheduler=net.noise_scheduler)
    plan = plan_of(model, "teacher", 4, guidance + 1.0)
    seed = 7
    media = {"image": frames[0]} if clip_frames == 1 else {"video": frames}
    theirs = pipe(prompt=PROMPT, negative_prompt="", height=16, width=16, num_frames=5, num_inference_steps=4,
                  guidance_scale=guidance, fps=16, max_sequence_length=TEXT_TOKENS, output_type="latent",
                  generator=torch.Generator().manual_seed(seed), **media).frames

    clip = load_clip_from_frames(frames)
    generators = seeded([seed])
    clean, k = conditioning_latents(codec, [clip], 5, generators)
    assert k == given and clean.shape == (1, 1, 3, 8, 8)
    start = PipelineNoise("cosmos2", generators, seed).initial([1, 3, 8, 8], sigma_max=80.0)
    from fastgen.networks.conditioning_frames import with_given_frames

    x = with_given_frames(start, clean, k)
    ours = ode_sample(WithConditioningFrames(net, k), x, codec.condition(codec.encode_prompts([PROMPT])),
                      codec.condition(codec.encode_negative([""])), plan)
    torch.testing.assert_close(ours[:, :, k:], theirs[:, :, k:], atol=1e-5, rtol=0)
    torch.testing.assert_close(theirs[:, :, :k], clean[:, :, :k] + 0.002 * (start[:, :, :k] - clean[:, :, :k]) / 80.0,
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(ours[:, :, :k], clean[:, :, :k], atol=1e-6, rtol=0)  # DDIM steps keep them
    assert callable(load_clip)


def load_clip_from_frames(frames: list[Any]) -> torch.Tensor:
    """The frames as ``load_clip`` reads a file (``VideoProcessor``), without the file."""
    from diffusers.video_processor import VideoProcessor

    processor = VideoProcessor(vae_scale_factor=8)
    if len(frames) == 1:
        return processor.preprocess(frames[0], 16, 16).unsqueeze(2)
    return processor.preprocess_video([frames], 16, 16)


def test_given_frames_are_read_clean_and_returned_as_they_are() -> None:
    """With ``conditioning_frames = 1`` the model sees the first frame unscaled at the conditioning time with its
    condition mask 1 (the same as calling the wrapper's model path by hand), the denoised estimate there is that
    frame exactly, and the other frames do not depend on the state's noise on the given one (only its value, which
    is the clean frame)."""
    net = _net()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 1, 3, 8, 8, generator=g)
    t = torch.tensor([3.0, 0.5])
    text = torch.randn(2, TEXT_TOKENS, 16, generator=g)
    with torch.no_grad():
        out = net(x, t, condition=text, conditioning_frames=1)
        assert torch.equal(out[:, :, :1], x[:, :, :1])
        schedule = net.noise_scheduler
        c_skip, c_out, c_in, c_noise = schedule.precondition(t)
        c_cond = schedule.precondition(torch.full_like(t, 1e-4))[3]
        inputs = torch.cat([x[:, :, :1], c_in.view(-1, 1, 1, 1, 1) * x[:, :, 1:]], dim=2)
        per_frame = torch.stack([c_cond, c_noise, c_noise], dim=1)
        raw = net.backbone._call(inputs, per_frame, text, conditioning_frames=1)
        want = c_skip.view(-1, 1, 1, 1, 1) * x + c_out.view(-1, 1, 1, 1, 1) * raw
        torch.testing.assert_close(out[:, :, 1:], want[:, :, 1:], atol=1e-6, rtol=0)
        # the mask channel matters: the same inputs with an all-zero mask predict otherwise
        unmasked = net.backbone._call(inputs, per_frame, text)
        assert (unmasked - raw)[:, :, 1:].abs().max() > 1e-4
        # converted, the given frame is a state that is already clean: no noise in it
        eps = net(x, t, condition=text, conditioning_frames=1, fwd_pred_type="eps")
        assert eps[:, :, :1].abs().max() == 0


def test_refusals_in_one_line() -> None:
    """A text-to-image network reads no condition mask; an image has no frames to generate; a network given all
    its frames has none left; the config check names the field."""
    t2i = _net(TINY_COSMOS_PREDICT2)
    with pytest.raises(ValueError, match="reads no condition mask"):
        t2i(torch.randn(1, 1, 3, 8, 8), torch.tensor([1.0]), conditioning_frames=1)
    v2w = _net()
    with pytest.raises(ValueError, match="more than 1 latent frames"):
        v2w(torch.randn(1, 1, 8, 8), torch.tensor([1.0]), conditioning_frames=1)
    with pytest.raises(ValueError, match="more than 3 latent frames"):
        v2w(torch.randn(1, 1, 3, 8, 8), torch.tensor([1.0]), conditioning_frames=3)


def _world_recipe(name: str) -> Any:
    """The moving-digits SFT recipe on the tiny Video2World model with the first latent frame given, 2 iterations."""
    from omegaconf import DictConfig

    from fastgen.configs.config_utils import load_config

    config = load_config("Digits/config_sft_wan_moving_digits")
    config.model.net = cosmos_predict2_transformer(TINY_COSMOS_PREDICT2_V2W, text_tokens=TEXT_TOKENS, num_prompts=10,
                                                   prompt_tokens=3)
    config.model.conditioning_frames = 1
    config.model.use_ema = False
    config.trainer.max_iter = 2
    config.trainer.logging_iter = 1
    config.trainer.save_ckpt_iter = 2
    config.trainer.validation_iter = None
    config.dataloader_val = None
    config.dataloader_train.batch_size = 4
    config.trainer.callbacks = DictConfig({k: v for k, v in config.trainer.callbacks.items() if k not in ("wandb", "ema")})
    config.log_config.name = name
    return config


def test_sft_loss_is_over_the_generated_frames_with_the_data_frame_given() -> None:
    """SFT's step with ``conditioning_frames = 1``: the network's input holds the data's first frame clean, the loss
    is EDM's weighted x0 error averaged over the generated frames only (re-derived here from the step's own draws)."""
    from fastgen.configs.instantiate import instantiate as build
    from fastgen.methods.sft import SFTModel

    config = _world_recipe("unused")
    model = build(config.model_class, config=config.model)
    assert isinstance(model, SFTModel)
    g = torch.Generator().manual_seed(3)
    data = {"real": torch.randn(2, 1, 8, 8, 16, generator=g), "condition": torch.tensor([1, 4])}
    seen = {}

    def spy(module: Any, args: Any, kwargs: Any) -> None:
        seen["x"], seen["frames"] = args[0].detach().clone(), kwargs.get("conditioning_frames")

    handle = model.net.register_forward_pre_hook(spy, with_kwargs=True)
    try:
        losses, outputs = model.single_train_step(data, 0)
    finally:
        handle.remove()
    assert seen["frames"] == 1
    assert torch.equal(seen["x"][:, :, :1], data["real"][:, :, :1])
    x0 = data["real"]
    pred, t = outputs["pred"], outputs["t"]
    assert torch.equal(pred[:, :, :1], x0[:, :, :1])
    weight = model.noise_scheduler.loss_weight(t.float())
    want = (weight * (pred - x0)[:, :, 1:].square().flatten(1).mean(dim=1)).mean()
    torch.testing.assert_close(losses["total_loss"], want)


def test_sft_trains_video_to_world_two_iterations(output_root: Path) -> None:
    """The real trainer: SFT of the tiny Video2World model on moving digits with the first latent frame given,
    2 iterations on CPU, checkpointed."""
    from fastgen.trainer import Trainer

    config = _world_recipe("sft_cosmos_predict2_world")
    model = Trainer(config).run()
    assert model.config.conditioning_frames == 1
    assert (output_root / "fastgen" / "moving_digits" / "sft_cosmos_predict2_world" / "checkpoints" /
            "0000002.pth").is_file()


def test_methods_and_networks_that_cannot_take_given_frames_are_refused() -> None:
    """``model.conditioning_frames`` with a method that generates every frame (KD), with DMD2's GAN head, with a
    text-to-image network, or on images: one-line ConfigErrors."""
    from fastgen.configs.config_utils import load_config
    from fastgen.utils.errors import ConfigError

    config = _world_recipe("unused")
    kd = load_config("Digits/config_kd_digits")
    kd.model.conditioning_frames = 1
    with pytest.raises(ConfigError, match="generates every frame"):
        instantiate(kd.model_class, config=kd.model)
    dmd2 = _dmd2_world_recipe("unused")
    dmd2.model.gan_loss_weight_gen = 1e-2
    with pytest.raises(ConfigError, match="distribution-matching loss only; unset model.gan_loss_weight_gen"):
        instantiate(dmd2.model_class, config=dmd2.model)
    config.model.net = cosmos_predict2_transformer(TINY_COSMOS_PREDICT2, text_tokens=TEXT_TOKENS, num_prompts=10,
                                                   prompt_tokens=3)
    with pytest.raises(ConfigError, match="reads no condition mask"):
        instantiate(config.model_class, config=config.model)
    config = _world_recipe("unused")
    config.model.input_shape = [1, 8, 8]
    with pytest.raises(ConfigError, match="needs a video input_shape"):
        instantiate(config.model_class, config=config.model)


def _dmd2_world_recipe(name: str, steps: int = 1) -> Any:
    """DMD2 of the tiny Video2World model on moving digits with the first latent frame given (``steps`` student
    steps), guided, 2 iterations (one of the fake score, one of the student)."""
    from fastgen.configs.config_utils import load_config

    config = load_config("Digits/config_dmd2_digits")
    world = _world_recipe(name)
    config.model.net = world.model.net
    config.model.input_shape = world.model.input_shape
    config.model.conditioning_frames = 1
    config.model.teacher_ckpt = None
    config.model.gan_loss_weight_gen = 0.0
    config.model.guidance_scale = 3.0
    config.model.student_update_freq = 2
    if steps > 1:
        config.model.t_list = [80.0, 2.0][:steps]
    config.dataloader_train = world.dataloader_train
    config.dataloader_val = None
    config.trainer = world.trainer
    config.log_config = world.log_config
    return config


@pytest.mark.parametrize("steps", [1, 2], ids=["one-step", "two-step"])
def test_dmd2_gives_every_network_the_data_frames_and_scores_the_generated_ones(steps: int) -> None:
    """A video-to-world DMD2 step: the student generates from noise with the data's first latent frame given (its
    sample holds that frame, also after a re-noised second step); the teacher's and fake score's inputs hold it at
    every noising (both guidance halves); the critic's loss is the denoising loss over the generated frames, re-derived
    from its own draws."""
    from fastgen.configs.instantiate import instantiate as build

    config = _dmd2_world_recipe("unused", steps)
    model = build(config.model_class, config=config.model)
    model.init_weights()
    g = torch.Generator().manual_seed(5)
    real = torch.randn(2, 1, 8, 8, 16, generator=g)
    data = {"real": real, "condition": torch.tensor([2, 7])}
    seen: dict[str, list[torch.Tensor]] = {"teacher": [], "fake_score": [], "net": []}
    handles = []
    for name in seen:
        def spy(module: Any, args: Any, kwargs: Any, name: str = name) -> None:
            assert kwargs.get("conditioning_frames") == 1
            seen[name].append(args[0].detach().clone())
        handles.append(getattr(model, name).register_forward_pre_hook(spy, with_kwargs=True))
    try:
        critic_losses, critic = model.single_train_step(data, 1)
        student_losses, student = model.single_train_step(data, 0)
    finally:
        for handle in handles:
            handle.remove()
    assert all(seen.values()), {k: len(v) for k, v in seen.items()}
    for name, inputs in seen.items():
        for x in inputs:
            copies = x.shape[0] // real.shape[0]
            assert torch.equal(x[:, :, :1], real[:, :, :1].repeat(copies, 1, 1, 1, 1)), name
    for out in (critic, student):
        assert torch.equal(out["generated"][:, :, :1], real[:, :, :1])
    x, x_t, t = critic["generated"], critic["x_t"], critic["t"]
    with torch.no_grad():
        given = torch.cat([real[:, :, :1], x_t[:, :, 1:]], dim=2)  # the critic's state, the data frame put back
        pred = model.fake_score(given, t, condition=torch.tensor([2, 7]), conditioning_frames=1)
    eps = (x_t - x) / t.view(-1, 1, 1, 1, 1)  # EDM: x_t = x0 + sigma eps (the given frame's eps is not used)
    target = model.noise_scheduler.target(x, eps, t)
    per_sample = (pred - target)[:, :, 1:].square().flatten(1).mean(dim=1)
    if model.config.fake_score_loss_weighting == "schedule":
        per_sample = model.noise_scheduler.loss_weight(t.float()) * per_sample
    torch.testing.assert_close(critic_losses["fake_score_loss"], per_sample.mean(), rtol=1e-4, atol=1e-6)
    assert torch.isfinite(student_losses["total_loss"])


def test_sft_then_dmd2_distil_video_to_world_through_the_trainer(output_root: Path, tmp_path: Path) -> None:
    """SFT of the tiny Video2World model (the first frame given) saved as a diffusers folder, then DMD2 from that
    folder (teacher, student and fake score) with the first frame given, 2 iterations each, on CPU."""
    from fastgen_testing import sft_then_dmd2_from_its_folder

    sft, dmd2 = sft_then_dmd2_from_its_folder(_world_recipe("sft_world_for_dmd2"), _dmd2_world_recipe("dmd2_world"),
                                              tmp_path / "pipeline")
    assert dmd2.config.conditioning_frames == 1
    assert (output_root / "fastgen" / "moving_digits" / "dmd2_world" / "checkpoints" / "0000002.pth").is_file()


def test_a_video_to_world_export_reloads_and_continues_an_image_as_fastgen_does(world_folder: Path, output_root: Path,
                                                                               tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """SFT of the tiny Video2World model from its pipeline folder (2 iterations on moving digits, the first latent
    frame given), exported with ``convert-ckpt --to diffusers``'s ``export_diffusers`` (4 steps, guidance 3):
    ``DiffusionPipeline.from_pretrained`` gives a ``Cosmos2VideoToWorldPipeline``, and called with a conditioning
    image it generates the latent frames fastgen's ``PromptSampler`` generates from the same image and seed (1e-5)."""
    from fastgen.checkpoint.run import load_run, select_net
    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.export import export_diffusers
    from fastgen.pipelines.prompts import PromptSampler
    from fastgen.trainer import Trainer

    stand_in_torchvision(monkeypatch)
    config = _world_recipe("export_cosmos_predict2_world")
    config.model.pretrained_model_path = str(world_folder)
    # 5-frame videos: 9 pixel frames, which the toy Wan VAE (time halved, encoded 4 frames at a time) keeps whole
    config.dataloader_train.dataset.frames = 5
    config.model.input_shape = [1, 5, 8, 16]
    Trainer(config).run()
    run = load_run(output_root / "fastgen" / "moving_digits" / "export_cosmos_predict2_world")
    info = export_diffusers(str(run.checkpoint), str(tmp_path / "net"), only="net", steps=4, guidance=3.0)
    assert info["family"] == "cosmos2" and info["pipeline"] == "Cosmos2VideoToWorldPipeline"
    pipe = load_pipeline(tmp_path / "net")
    assert type(pipe).__name__ == "Cosmos2VideoToWorldPipeline"
    frame = random_frames(1, seed=11)[0]
    theirs = pipe(prompt=PROMPT, image=frame, height=16, width=16, num_frames=5, fps=16,
                  max_sequence_length=TEXT_TOKENS, output_type="latent", generator=torch.Generator().manual_seed(3),
                  **info["call"]).frames
    codec = load_codec(world_folder, max_sequence_length=TEXT_TOKENS)
    sampler = PromptSampler(run.model, select_net(run, "net"), "net", codec, steps=4, guidance=3.0)
    ours = sampler.latents([PROMPT], [3], [1, 3, 8, 8], clip=load_clip_from_frames([frame]))
    torch.testing.assert_close(ours[:, :, 1:], theirs[:, :, 1:], atol=1e-5, rtol=0)
    # the command line: the same run continues an image file into an MP4 of the run's 5 latent frames (9 frames)
    from fastgen_testing import run_cli

    frame.resize((32, 16)).save(tmp_path / "first.png")
    run_dir = output_root / "fastgen" / "moving_digits" / "export_cosmos_predict2_world"
    result = run_cli("sample", str(run_dir), "--prompt", PROMPT, "--image", str(tmp_path / "first.png"), "--steps", "3",
                     "--guidance", "3", "--out", str(tmp_path / "cli"))
    assert result.returncode == 0, result.stderr[-2000:]
    import av

    with av.open(str(tmp_path / "cli" / "0000.mp4")) as container:
        assert sum(1 for _ in container.decode(video=0)) == 9
    for args, message in ((["--image", str(tmp_path / "first.png"), "--video", str(tmp_path / "first.png")],
                           "exclude each other"), (["--image", str(tmp_path / "none.png")], "no such file")):
        result = run_cli("sample", str(run_dir), "--prompt", PROMPT, *args)
        errors = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr[-2000:]


def test_a_list_of_counts_draws_one_per_step_from_the_shared_stream(tmp_path: Path) -> None:
    """``model.conditioning_frames=[1, 2]`` (an override on the command line's grammar, and through config.yaml):
    each SFT step gives the network one of the counts, drawn from the step's shared stream (what every rank draws
    alike), and over a few steps both occur; a count that leaves no frame to generate is refused."""
    from fastgen.configs.config_utils import apply_overrides, config_to_yaml, load_config
    from fastgen.configs.instantiate import instantiate as build
    from fastgen.utils.errors import ConfigError

    config = _world_recipe("unused")
    apply_overrides(config, ["model.conditioning_frames=[1,2]"])
    assert list(config.model.conditioning_frames) == [1, 2]
    (tmp_path / "config.yaml").write_text(config_to_yaml(config))
    assert list(load_config(str(tmp_path / "config.yaml")).model.conditioning_frames) == [1, 2]
    model = build(config.model_class, config=config.model)
    data = {"real": torch.randn(2, 1, 8, 8, 16), "condition": torch.tensor([1, 4]), "sample_ids": torch.tensor([0, 1])}
    counts = []
    for iteration in range(8):
        seen = {}
        handle = model.net.register_forward_pre_hook(
            lambda module, args, kwargs: seen.update(frames=kwargs.get("conditioning_frames")), with_kwargs=True)
        try:
            with model.bind_batch(data, iteration, seed=0):  # the trainer's keyed streams
                model.single_train_step(data, iteration)
        finally:
            handle.remove()
        counts.append(seen["frames"])
    assert set(counts) == {1, 2}, counts
    config.model.conditioning_frames = [1, 8]
    with pytest.raises(ConfigError, match="more than 8 latent frames"):
        build(config.model_class, config=config.model)


def test_the_codec_of_a_video_to_world_folder_encodes_as_its_pipeline(world_folder: Path) -> None:
    """The codec loaded from a ``Cosmos2VideoToWorldPipeline`` folder is that pipeline's own encoding: its prompt
    and negative-prompt states are ``encode_prompt``'s, and a 3-frame conditioning clip per sample, padded to 5
    frames and encoded with the sample's generator (``fastgen.pipelines.world.conditioning_latents``), gives the
    normalised latents and the given-frame count of the pipeline's ``prepare_latents`` (its ``init_latents`` and
    ``cond_indicator``; posterior samples drawn from the same generators); without a generator the codec's latents
    are the posterior's mode normalised as ``prepare_latents`` normalises."""
    from diffusers.pipelines.cosmos.pipeline_cosmos2_video2world import retrieve_latents

    from fastgen.networks.codecs import CosmosPredict2Codec, load_codec
    from fastgen.pipelines.noise import seeded
    from fastgen.pipelines.world import conditioning_latents, pad_clip

    pipe = load_pipeline(world_folder)
    assert type(pipe).__name__ == "Cosmos2VideoToWorldPipeline"
    codec = load_codec(world_folder, max_sequence_length=TEXT_TOKENS)
    assert isinstance(codec, CosmosPredict2Codec) and codec.family == "cosmos2"
    prompts = [PROMPT, "two dogs"]
    with torch.no_grad():
        cond, uncond = pipe.encode_prompt(prompts, negative_prompt=["blurry", ""], max_sequence_length=TEXT_TOKENS)
    assert torch.equal(codec.encode_prompts(prompts)["text"], cond)
    assert torch.equal(codec.encode_negative(["blurry", ""])["text"], uncond)

    clips = [load_clip_from_frames(random_frames(3, seed=s)) for s in (21, 22)]
    with torch.no_grad():
        ours, given = conditioning_latents(codec, clips, 5, seeded([8, 9]))
        _, theirs, indicator, *_ = pipe.prepare_latents(
            torch.cat(clips), 2, 1, 16, 16, 5, do_classifier_free_guidance=False, dtype=torch.float32,
            device=torch.device("cpu"), generator=[torch.Generator().manual_seed(s) for s in (8, 9)])
    assert ours.shape == theirs.shape == (2, 1, 3, 8, 8)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    assert given == 2 and indicator.flatten().tolist() == [1.0, 1.0, 0.0]
    assert not torch.allclose(ours[0], ours[1], atol=1e-3)  # two clips, two generators
    config = pipe.vae.config
    mean, std = (torch.tensor(v).view(1, -1, 1, 1, 1) for v in (config.latents_mean, config.latents_std))
    padded = pad_clip(clips[0], 5)[0]
    with torch.no_grad():
        mode = (retrieve_latents(pipe.vae.encode(padded), sample_mode="argmax") - mean) / std
    torch.testing.assert_close(codec.encode_images(padded), mode * pipe.scheduler.config.sigma_data, atol=1e-6, rtol=0)


def test_encode_data_of_clips_writes_the_video_to_world_pipelines_latents_and_prompts(world_folder: Path,
                                                                                     tmp_path: Path) -> None:
    """``fastgen encode-data --frames 5`` of captioned 16x16 MP4 clips (``write_mp4``) with a Cosmos Predict2
    video-to-world folder: each clip's first 5 frames (as decoded from the file) become ``(1, 3, 8, 8)`` latents equal
    to the pipeline's VAE mode of those frames normalised as ``prepare_latents`` normalises, and its caption a
    ``text.npy`` equal to the pipeline's ``encode_prompt`` (512 rows, the codec's default ``max_sequence_length``)."""
    import json

    import numpy as np
    from diffusers.pipelines.cosmos.pipeline_cosmos2_video2world import retrieve_latents
    from fastgen_testing import run_in_process, shard_samples

    from fastgen.pipelines.media import read_mp4, write_mp4

    clips = tmp_path / "clips"
    clips.mkdir()
    captions = [PROMPT, "two dogs"]
    rng = np.random.default_rng(0)
    for i, caption in enumerate(captions):
        write_mp4(clips / f"{i}.mp4", rng.integers(0, 256, (7, 16, 16, 3), dtype=np.uint8), fps=16)
        (clips / f"{i}.txt").write_text(caption)
    shards = tmp_path / "shards"
    result = run_in_process("encode-data", str(clips), str(shards), "--weights", str(world_folder), "--resolution",
                            "16", "--frames", "5", "--device", "cpu")
    assert result.returncode == 0, result.stderr[-2000:]
    index = json.loads((shards / "index.json").read_text())
    assert index["family"] == "cosmos2" and index["samples"] == 2 and index["latent_shape"] == [1, 3, 8, 8]
    samples = shard_samples(shards)
    assert sorted(samples) == sorted(captions)
    pipe = load_pipeline(world_folder)
    config = pipe.vae.config
    mean, std = (torch.tensor(v).view(1, -1, 1, 1, 1) for v in (config.latents_mean, config.latents_std))
    for i, caption in enumerate(captions):
        frames = read_mp4(clips / f"{i}.mp4")[:5]
        video = torch.from_numpy(frames).permute(3, 0, 1, 2)[None].float() / 127.5 - 1
        with torch.no_grad():
            raw = retrieve_latents(pipe.vae.encode(video), sample_mode="argmax")
            text = pipe.encode_prompt(caption, do_classifier_free_guidance=False)[0][0]
        want = ((raw - mean) / std * pipe.scheduler.config.sigma_data)[0]
        torch.testing.assert_close(torch.from_numpy(samples[caption]["latent"]), want, atol=1e-5, rtol=0)
        assert samples[caption]["text"].shape == (512, 16)
        torch.testing.assert_close(torch.from_numpy(samples[caption]["text"]), text, atol=1e-6, rtol=0)


FSDP_RECIPE = '''
from omegaconf import DictConfig

from fastgen.configs.experiments.Digits.config_sft_wan_moving_digits import create_config as moving_digits
from fastgen.configs.net_cosmos_predict2 import TINY_COSMOS_PREDICT2_V2W, cosmos_predict2_transformer


def create_config():
    config = moving_digits()
    config.model.net = cosmos_predict2_transformer(TINY_COSMOS_PREDICT2_V2W, text_tokens={text_tokens}, num_prompts=10,
                                                   prompt_tokens=3)
    config.model.pretrained_model_path = {folder!r}
    config.model.conditioning_frames = [1, 2]
    config.model.use_ema = False
    config.trainer.callbacks = DictConfig({{}})
    config.trainer.validation_iter = None
    config.dataloader_val = None
    config.log_config.name = "cosmos_predict2_world_fsdp"
    return config
'''


@pytest.mark.slow
def test_two_fsdp_ranks_train_video_to_world_after_a_meta_build(world_folder: Path, output_root: Path,
                                                                tmp_path: Path) -> None:
    """SFT of the tiny Video2World model on 2 ranks through the real launcher (``fastgen train --nproc-per-node 2``,
    gloo): every rank builds the network on the meta device, FSDP2 shards its blocks, rank 0 reads the pipeline
    folder and broadcasts; activation checkpointing on every block; the first latent frame or two given
    (``model.conditioning_frames = [1, 2]``, the count drawn from the stream every rank shares). The final
    checkpoint's network has the folder's keys and moved from its weights, by no more than two optimizer steps move
    them (the broadcast filled every shard, the condition-mask channel's included, with the folder's weights), and
    the run loads back (``load_run``, unsharded): the loaded network is the checkpoint's, and continuing a clip it
    returns the given frame as it is."""
    from multirank import fastgen
    from safetensors.torch import load_file

    from fastgen.checkpoint.checkpointer import load_checkpoint
    from fastgen.checkpoint.run import load_run, select_net

    recipe = tmp_path / "tiny_world_fsdp.py"
    recipe.write_text(FSDP_RECIPE.format(folder=str(world_folder), text_tokens=TEXT_TOKENS))
    result = fastgen("train", "--nproc-per-node", "2", "-c", str(recipe), "--eval-samples", "0", "-",
                     "trainer.fsdp=True", "model.meta_init=True", "model.activation_checkpointing=True",
                     "trainer.max_iter=2", "trainer.logging_iter=1", "trainer.save_ckpt_iter=2",
                     "dataloader_train.batch_size=4", cwd=tmp_path, env={"WANDB_MODE": "disabled"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "loaded the pretrained weights" in result.stderr and "2 rank(s)" in result.stderr, result.stderr[-3000:]
    saved = load_file(str(world_folder / "transformer" / "diffusion_pytorch_model.safetensors"))
    run_dir = output_root / "fastgen" / "moving_digits" / "cosmos_predict2_world_fsdp"
    payload = load_checkpoint(str(run_dir / "checkpoints" / "0000002.pth"))
    net = {k.removeprefix("backbone.model."): v for k, v in payload["model"]["net"].items()
           if k.startswith("backbone.model.")}
    assert net.keys() == saved.keys()
    assert any(not torch.equal(net[k], saved[k]) for k in saved), "the sharded SFT moved nothing"
    # from the folder's weights, every one of them (the mask channel's patch-embedding columns included): two Adam
    # steps at lr 1e-3 move no weight by more than 2e-3
    moved = {k: float((net[k] - saved[k]).abs().max()) for k in saved}
    assert max(moved.values()) < 2.5e-3, sorted(moved.items(), key=lambda kv: -kv[1])[:3]

    run = load_run(run_dir, device=torch.device("cpu"))
    assert list(run.config.model.conditioning_frames) == [1, 2] and run.iteration == 2
    loaded = select_net(run, "net")
    for name, p in loaded.backbone.model.state_dict().items():
        assert torch.equal(p, net[name]), name
    x, t = torch.randn(2, 1, 8, 8, 16), torch.tensor([0.5, 20.0])
    with torch.no_grad():
        out = loaded(x, t, condition=torch.tensor([1, 4]), conditioning_frames=1)
    assert torch.equal(out[:, :, :1], x[:, :, :1]) and torch.isfinite(out).all()
