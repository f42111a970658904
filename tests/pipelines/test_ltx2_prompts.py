"""``fastgen sample --prompt`` for LTX-2 (``fastgen.pipelines.prompts.PromptSampler`` on a video-and-audio network)
against diffusers' ``LTX2Pipeline`` itself - a tiny pipeline of the real classes (``tests/tiny_ltx2.py``, tokenizer
built locally, nothing downloaded) around the run's network: the same starting noise from the same seeds (video,
then audio), guidance per stream (``model.modality_guidance_scales``: the pipeline's ``guidance_scale`` for video,
``audio_guidance_scale`` for audio), the same latents and the same decoded frames and waveforms; the files
``write_prompt_samples`` writes (MP4 with an AAC track, WAV, npz); per-modality guidance in the methods (DMD2's
teacher, Heun sampling) and in the export's call arguments.

The pipeline is called with its guidance rescale, STG and modality-isolation guidance off (``guidance_rescale=0``,
``stg_scale=0``, ``modality_scale=1``, and the audio ones alike): fastgen does not sample with them."""

from __future__ import annotations

import json
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tiny_ltx2 import FRAME_RATE, FRAMES, MAX_SEQUENCE_LENGTH, PIXELS, tiny_ltx2_pipeline

from fastgen.utils.errors import ConfigError, UsageError

PROMPTS = ["a red cat", "two dogs at night"]
SHAPES = {"video": [2, 5, 4, 4], "audio": [2, 9, 4]}  # the tiny pipeline's latents for 9 frames of 32x32 at 24 fps


def _sft_model(**fields: Any) -> Any:
    """An SFT model around a ``TINY_LTX2`` network (80 video tokens set its sampling shift, as the pipeline's dynamic
    shift does) on the tiny pipeline's latent shapes."""
    from fastgen.configs.instantiate import instantiate
    from fastgen.configs.methods.config_sft import create_config
    from fastgen.configs.net_ltx2 import TINY_LTX2, ltx2_transformer

    config = create_config()
    config.model.net = ltx2_transformer(TINY_LTX2, video_seq_len=80)
    config.model.modality_shapes = {name: list(shape) for name, shape in SHAPES.items()}
    config.model.num_classes = 1
    config.model.input_shape = list(SHAPES["video"])
    config.model.sample_steps = 4
    for key, value in fields.items():
        setattr(config.model, key, value)
    torch.manual_seed(0)
    return instantiate(config.model_class, config=config.model).eval()


@pytest.fixture(scope="module")
def ltx2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The model, an LTX2Pipeline around its network, saved, and the codec ``load_codec`` reads from the folder."""
    from fastgen.networks.codecs import load_codec

    model = _sft_model()
    pipe = tiny_ltx2_pipeline(model.net.backbone.model)
    pipe.set_progress_bar_config(disable=True)
    folder = tmp_path_factory.mktemp("ltx2") / "pipeline"
    pipe.save_pretrained(folder)
    return {"model": model, "pipe": pipe, "folder": folder,
            "codec": load_codec(folder, max_sequence_length=MAX_SEQUENCE_LENGTH)}


def _pipeline(pipe: Any, seeds: list[int], video: float, audio: float, steps: int, output_type: str) -> Any:
    from fastgen.pipelines.noise import seeded

    return pipe(PROMPTS, negative_prompt="", height=PIXELS, width=PIXELS, num_frames=FRAMES, frame_rate=FRAME_RATE,
                num_inference_steps=steps, guidance_scale=video, audio_guidance_scale=audio, guidance_rescale=0.0,
                audio_guidance_rescale=0.0, stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0,
                audio_modality_scale=1.0, generator=seeded(seeds), output_type=output_type,
                max_sequence_length=MAX_SEQUENCE_LENGTH, return_dict=False)


def _sampler(ltx2: dict[str, Any], model: Any | None = None, **kwargs: Any) -> Any:
    from fastgen.pipelines.prompts import PromptSampler

    model = model or ltx2["model"]
    return PromptSampler(model, model.net, "net", ltx2["codec"], **kwargs)


# (video, audio) guidance: audio guided harder than video (the pipeline's defaults are 3 and 7), audio guided alone
# (the pipeline then evaluates the negative prompt for both streams), neither guided
CASES = [(3.0, 7.0, "config"), (1.0, 4.0, "arguments"), (1.0, 1.0, "arguments")]


@pytest.mark.parametrize(("video", "audio", "source"), CASES)
def test_prompt_latents_equal_the_pipelines(ltx2: dict[str, Any], video: float, audio: float, source: str) -> None:
    """``PromptSampler.latents`` (the run's ``model.guidance_scale`` and ``model.modality_guidance_scales``, or the
    sampler's ``guidance`` / ``modality_guidance``) equals LTX2Pipeline's ``output_type="latent"`` from the same
    seeds with ``guidance_scale`` / ``audio_guidance_scale``, both streams to 1e-5 (fastgen's latents denormalised
    by the codec as the pipeline returns them)."""
    if source == "config":
        model = _sft_model(guidance_scale=video, modality_guidance_scales={"audio": audio})
        model.net.load_state_dict(ltx2["model"].net.state_dict())
        sampler = _sampler(ltx2, model, steps=4)
    else:
        sampler = _sampler(ltx2, steps=4, guidance=video, modality_guidance={"audio": audio})
    assert (sampler.plan.scale("video"), sampler.plan.scale("audio")) == (video, audio)
    ours = sampler.latents(PROMPTS, [1, 2], SHAPES)
    theirs_video, theirs_audio = _pipeline(ltx2["pipe"], [1, 2], video, audio, 4, "latent")
    codec = ltx2["codec"]
    torch.testing.assert_close(codec.denormalise(ours["video"]), theirs_video, atol=1e-5, rtol=0)
    torch.testing.assert_close(codec.denormalise_audio(ours["audio"]), theirs_audio, atol=1e-5, rtol=0)
    assert float(theirs_video.std()) > 0.1 and float(theirs_audio.std()) > 0.1
    if audio != video:  # the audio's own scale matters: the video's for both streams samples other audio
        one_scale = _sampler(ltx2, steps=4, guidance=video, modality_guidance={"audio": video})
        assert (one_scale.latents(PROMPTS, [1, 2], SHAPES)["audio"] - ours["audio"]).abs().max() > 1e-2


def test_decoded_video_and_sound_equal_the_pipelines(ltx2: dict[str, Any]) -> None:
    """``PromptSampler.pixels``: the video VAE's frames as 8-bit, as the pipeline's ``output_type="np"`` frames
    rounded (to 1/255), and the waveform of the audio VAE and vocoder as the pipeline's audio (to 1e-4)."""
    sampler = _sampler(ltx2, steps=3, guidance=2.0, modality_guidance={"audio": 5.0})
    decoded = sampler.pixels(sampler.latents(PROMPTS, [4, 5], SHAPES))
    frames, waveform = _pipeline(ltx2["pipe"], [4, 5], 2.0, 5.0, 3, "np")
    assert decoded["video"].dtype == torch.uint8 and decoded["video"].shape == frames.shape == (2, FRAMES, PIXELS,
                                                                                                 PIXELS, 3)
    assert np.abs(decoded["video"].numpy().astype(int) - (frames * 255).round().astype(int)).max() <= 1
    torch.testing.assert_close(decoded["audio"], waveform.float(), atol=1e-4, rtol=0)
    assert sampler.sample_rate == 16000 and sampler.frame_rate == 24.0


def test_the_starting_noise_is_the_pipelines_video_then_audio(ltx2: dict[str, Any]) -> None:
    """``PipelineNoise.initial`` of the modality shapes: per prompt's generator, all videos first, then the audio
    (``prepare_latents``, then ``prepare_audio_latents``), whatever order the shapes are given in."""
    from fastgen.pipelines.noise import PipelineNoise, seeded

    noise = PipelineNoise("ltx2", seeded([3, 9]), 3).initial({"audio": SHAPES["audio"], "video": SHAPES["video"]})
    assert list(noise) == ["audio", "video"]
    generators = seeded([3, 9])
    video = torch.cat([torch.randn((1, *SHAPES["video"]), generator=g) for g in generators])
    audio = torch.cat([torch.randn((1, *SHAPES["audio"]), generator=g) for g in generators])
    assert torch.equal(noise["video"], video) and torch.equal(noise["audio"], audio)
    with pytest.raises(ValueError, match="no multimodal pipeline noise convention"):
        PipelineNoise("wan", seeded([1]), 1).initial(SHAPES)


def test_write_prompt_samples_writes_mp4_with_sound_wav_and_npz(ltx2: dict[str, Any], tmp_path: Path) -> None:
    """NNNN.mp4 (the frames and an AAC track of the sound at the vocoder's rate), NNNN.wav (16-bit PCM of the same
    waveform), samples.npz (uint8 videos, audio latents, waveforms, sample rate) and samples.json."""
    from fastgen.pipelines.media import read_mp4, read_mp4_audio
    from fastgen.pipelines.prompts import write_prompt_samples

    sampler = _sampler(ltx2, steps=2, guidance=2.0, modality_guidance={"audio": 3.0})
    records = write_prompt_samples(sampler, PROMPTS, [6, 7], tmp_path, SHAPES, batch_size=1)
    assert records == [{"file": f"{i:04d}.mp4", "audio": f"{i:04d}.wav", "prompt": p, "seed": s}
                       for i, (p, s) in enumerate(zip(PROMPTS, [6, 7]))]
    assert json.loads((tmp_path / "samples.json").read_text()) == records
    latents = sampler.latents(PROMPTS, [6, 7], SHAPES)
    decoded = sampler.pixels(latents)
    with np.load(tmp_path / "samples.npz") as npz:
        assert np.array_equal(npz["arr_0"], decoded["video"].numpy())
        np.testing.assert_allclose(npz["audio"], latents["audio"].numpy(), atol=1e-6)
        np.testing.assert_allclose(npz["waveform"], decoded["audio"].numpy(), atol=1e-6)
        assert int(npz["sample_rate"]) == 16000
    assert read_mp4(tmp_path / "0001.mp4").shape == (FRAMES, PIXELS, PIXELS, 3)
    sound, rate = read_mp4_audio(tmp_path / "0001.mp4")
    assert rate == 16000 and sound.shape[0] == 2 and sound.shape[1] > 0
    with wave.open(str(tmp_path / "0001.wav"), "rb") as wav:
        assert (wav.getnchannels(), wav.getframerate(), wav.getnframes()) == (2, 16000, decoded["audio"].shape[-1])
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16).reshape(-1, 2).T
    np.testing.assert_allclose(pcm / 32767.0, decoded["audio"][1].clamp(-1, 1).numpy(), atol=1 / 32767)


def test_a_student_takes_no_guidance_and_unknown_modalities_are_refused(ltx2: dict[str, Any]) -> None:
    from fastgen.pipelines.schedulers import plan_of

    with pytest.raises(UsageError, match="not modalities of this model"):
        plan_of(ltx2["model"], "net", 2, 3.0, {"sound": 7.0})

    class Student:  # a distilled student: sampled by its method's generate, without guidance
        config = ltx2["model"].config
        net = ltx2["model"].net

        def generate(self) -> None: ...

    with pytest.raises(UsageError, match="distilled student"):
        _sampler(ltx2, Student(), modality_guidance={"audio": 7.0})


# ---- the export's call arguments ------------------------------------------------------------------------------
def test_the_export_calls_the_pipeline_with_a_scale_per_stream(ltx2: dict[str, Any]) -> None:
    """``diffusers_sampling("ltx2", ...)``: ``guidance_scale`` the video's, ``audio_guidance_scale`` the audio's, the
    rest of the pipeline's guidance off; scales the pipeline cannot take (none above 1 though guided, audio 0) and
    per-modality scales for a one-scale pipeline are one-line errors."""
    from fastgen.pipelines.schedulers import SamplingPlan, diffusers_sampling, plan_of

    net = ltx2["model"].net
    model = _sft_model(guidance_scale=3.0, modality_guidance_scales={"audio": 7.0})
    call = diffusers_sampling("ltx2", plan_of(model, "net", 3), net).call
    assert {k: call[k] for k in ("guidance_scale", "audio_guidance_scale", "guidance_rescale", "audio_guidance_rescale",
                                 "stg_scale", "audio_stg_scale", "modality_scale", "audio_modality_scale")} == {
        "guidance_scale": 3.0, "audio_guidance_scale": 7.0, "guidance_rescale": 0.0, "audio_guidance_rescale": 0.0,
        "stg_scale": 0.0, "audio_stg_scale": 0.0, "modality_scale": 1.0, "audio_modality_scale": 1.0}
    times = tuple(plan_of(model, "net", 3).times)
    with pytest.raises(UsageError, match="only when a scale is above 1"):
        diffusers_sampling("ltx2", SamplingPlan("ode", times, 1.0, modality_guidance={"audio": 0.5}), net)
    with pytest.raises(UsageError, match="audio_guidance_scale=0"):
        diffusers_sampling("ltx2", SamplingPlan("ode", times, 3.0, modality_guidance={"audio": 0.0}), net)
    with pytest.raises(UsageError, match="one scale"):
        diffusers_sampling("wan", SamplingPlan("ode", times, 3.0, modality_guidance={"audio": 7.0}), net)


# ---- per-modality guidance in the methods ----------------------------------------------------------------------
def _two_stream(method: str, **fields: Any) -> Any:
    from multimodal_nets import two_stream_net

    from fastgen.configs.instantiate import instantiate

    if method == "dmd2":
        from fastgen.configs.methods.config_dmd2 import create_config
    else:
        from fastgen.configs.methods.config_sft import create_config
    config = create_config()
    shapes = {"video": [1, 2, 3, 3], "audio": [2, 3, 2]}
    config.model.num_classes = 3
    config.model.net = two_stream_net(shapes, num_classes=3)
    config.model.modality_shapes = shapes
    for key, value in fields.items():
        setattr(config.model, key, value)
    torch.manual_seed(0)
    model = instantiate(config.model_class, config=config.model)
    if method == "dmd2":
        model.init_weights()
    return model


def test_dmd2_teacher_and_heun_sampling_guide_each_modality_with_its_scale() -> None:
    """``model.modality_guidance_scales`` sets a modality's scale in DMD2's guided teacher (``teacher_x0``) and in
    the guided flow of Heun sampling (``flow_fn``); the others keep ``guidance_scale`` (or, without it, stay
    unguided); a scale for a modality the model lacks, or for a one-modality model, is a ConfigError."""
    g = torch.Generator().manual_seed(1)
    x = {"video": torch.randn(2, 1, 2, 3, 3, generator=g), "audio": torch.randn(2, 2, 3, 2, generator=g)}
    t = torch.tensor([0.3, 0.7])
    labels = torch.tensor([0, 2])
    onehot = torch.nn.functional.one_hot(labels, 3).float()
    for base, video in ((1.5, 1.5), (None, 1.0)):
        model = _two_stream("dmd2", guidance_scale=base, modality_guidance_scales={"audio": 4.0})
        with torch.no_grad():
            got = model.teacher_x0(x, t, labels)
            c = model.teacher(x, t, condition=onehot, fwd_pred_type="x0")
            u = model.teacher(x, t, condition=torch.zeros_like(onehot), fwd_pred_type="x0")
        torch.testing.assert_close(got["video"], u["video"] + video * (c["video"] - u["video"]))
        torch.testing.assert_close(got["audio"], u["audio"] + 4.0 * (c["audio"] - u["audio"]))

    sft = _two_stream("sft", guidance_scale=2.0, modality_guidance_scales={"video": 0.5})
    with torch.no_grad():
        flow = sft.flow_fn(sft.net, labels, sft.config.guidance_scale)(x, t)
        c = sft.net(x, t, condition=onehot, fwd_pred_type="flow")
        u = sft.net(x, t, condition=torch.zeros_like(onehot), fwd_pred_type="flow")
    torch.testing.assert_close(flow["video"], u["video"] + 0.5 * (c["video"] - u["video"]))
    torch.testing.assert_close(flow["audio"], u["audio"] + 2.0 * (c["audio"] - u["audio"]))

    with pytest.raises(ConfigError, match="modality_guidance_scales"):
        _two_stream("sft", modality_guidance_scales={"sound": 2.0}).single_train_step({"real": x}, 0)
    from multimodal_nets import two_stream_net

    from fastgen.configs.instantiate import instantiate
    from fastgen.configs.methods.config_sft import create_config

    config = create_config()
    config.model.net = two_stream_net({"video": [1, 2, 3, 3]})
    config.model.modality_guidance_scales = {"audio": 2.0}
    with pytest.raises(ConfigError, match="samples one modality"):
        instantiate(config.model_class, config=config.model)
