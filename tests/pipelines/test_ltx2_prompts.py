"""``fastgen sample --prompt`` for LTX-2 (``fastgen.pipelines.prompts.PromptSampler`` on a video-and-audio network)
against diffusers' ``LTX2Pipeline`` itself - a tiny pipeline of the real classes (``tests/tiny_ltx2.py``, tokenizer
built locally, nothing downloaded) around the run's network: the same starting noise from the same seeds (video,
then audio), guidance per stream (``model.modality_guidance_scales``: the pipeline's ``guidance_scale`` for video,
``audio_guidance_scale`` for audio), the same latents and the same decoded frames and waveforms; the files
``write_prompt_samples`` writes (MP4 with an AAC track, WAV, npz); per-modality guidance in the methods (DMD2's
teacher, Heun sampling) and in the export's call arguments.

Most cases call the pipeline with its guidance rescale, STG and modality-isolation guidance off (``guidance_rescale=0``,
``stg_scale=0``, ``modality_scale=1``, and the audio ones alike); the last part samples with all of them - the
pipeline's default call - from the run's ``model.guidance_rescale``, ``model.stg_scale`` / ``model.stg_blocks`` and
``model.modality_isolation_scale`` (a tiny model built with ``perturbed_attn``, LTX-2.3's STG-capable attention)."""

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


def _sft_model(net: dict[str, Any] | None = None, method: str = "sft", **fields: Any) -> Any:
    """An SFT (or DMD2) model around a ``TINY_LTX2`` network (or ``net``; 80 video tokens set its sampling shift, as
    the pipeline's dynamic shift does) on the tiny pipeline's latent shapes."""
    from fastgen.configs.instantiate import instantiate
    from fastgen.configs.net_ltx2 import TINY_LTX2, ltx2_transformer

    if method == "dmd2":
        from fastgen.configs.methods.config_dmd2 import create_config
    else:
        from fastgen.configs.methods.config_sft import create_config
    config = create_config()
    config.model.net = ltx2_transformer(net or TINY_LTX2, video_seq_len=80)
    config.model.modality_shapes = {name: list(shape) for name, shape in SHAPES.items()}
    config.model.num_classes = 1
    config.model.input_shape = list(SHAPES["video"])
    config.model.sample_steps = 4
    for key, value in fields.items():
        setattr(config.model, key, value)
    torch.manual_seed(0)
    model = instantiate(config.model_class, config=config.model).eval()
    if method == "dmd2":
        model.init_weights()
    return model


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


# ---- LTX2Pipeline's default guidance: rescale, STG, modality isolation ------------------------------------------
#: the pipeline's default guidance (``LTX2Pipeline.__call__``) in the run's fields; STG at the tiny model's last block
DEFAULTS: dict[str, Any] = {"guidance_scale": 3.0, "modality_guidance_scales": {"audio": 7.0}, "guidance_rescale": 0.7,
                            "stg_scale": 1.0, "stg_blocks": [1], "modality_isolation_scale": 3.0}
#: each term off in turn: what the break checks sample
WITHOUT = {"rescale": {"guidance_rescale": 0.0}, "stg": {"stg_scale": 0.0, "stg_blocks": []},
           "isolation": {"modality_isolation_scale": 1.0}}


def _stg_net() -> dict[str, Any]:
    from fastgen.configs.net_ltx2 import TINY_LTX2

    return {**TINY_LTX2, "perturbed_attn": True}  # LTX-2.3's attention: its blocks read the STG perturbation


@pytest.fixture(scope="module")
def guided(ltx2: dict[str, Any]) -> dict[str, Any]:
    """A run with the pipeline's default guidance on a ``perturbed_attn`` tiny LTX-2, the pipeline around its network
    (the text stack, VAEs and vocoder of ``ltx2``'s, so its codec encodes the prompts) and that pipeline's latents with
    its default guidance (only the STG block chosen for the 2-block model)."""
    from diffusers import LTX2Pipeline

    from fastgen.pipelines.noise import seeded

    model = _sft_model(_stg_net(), **DEFAULTS)
    pipe = LTX2Pipeline(**{**ltx2["pipe"].components, "transformer": model.net.backbone.model})
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe(PROMPTS, negative_prompt="", height=PIXELS, width=PIXELS, num_frames=FRAMES, frame_rate=FRAME_RATE,
                  num_inference_steps=4, spatio_temporal_guidance_blocks=[1], generator=seeded([1, 2]),
                  output_type="latent", max_sequence_length=MAX_SEQUENCE_LENGTH, return_dict=False)
    return {"model": model, "pipe": pipe, "theirs": theirs}


def test_the_pipelines_default_guidance_is_sampled(ltx2: dict[str, Any], guided: dict[str, Any]) -> None:
    """``PromptSampler.latents`` of a run with the pipeline's defaults (guidance 3, audio 7, guidance rescale 0.7, STG
    1, modality isolation 3) equals ``LTX2Pipeline`` called with its default guidance, both streams to 1e-5; and each
    of rescale, STG and isolation matters: the run without it samples other latents (by more than 1e-3)."""
    sampler = _sampler(ltx2, guided["model"], steps=4)
    extra = sampler.plan.extra
    assert extra.rescale == {"video": 0.7, "audio": 0.7} and extra.stg == {"video": 1.0, "audio": 1.0}
    assert extra.isolation == {"video": 3.0, "audio": 3.0} and extra.stg_blocks == (1,)
    ours = sampler.latents(PROMPTS, [1, 2], SHAPES)
    codec = ltx2["codec"]
    theirs_video, theirs_audio = guided["theirs"]
    torch.testing.assert_close(codec.denormalise(ours["video"]), theirs_video, atol=1e-5, rtol=0)
    torch.testing.assert_close(codec.denormalise_audio(ours["audio"]), theirs_audio, atol=1e-5, rtol=0)
    for term, off in WITHOUT.items():
        model = _sft_model(_stg_net(), **{**DEFAULTS, **off})
        model.net.load_state_dict(guided["model"].net.state_dict())
        other = _sampler(ltx2, model, steps=4).latents(PROMPTS, [1, 2], SHAPES)
        gap = max(float((codec.denormalise(other["video"]) - theirs_video).abs().max()),
                  float((codec.denormalise_audio(other["audio"]) - theirs_audio).abs().max()))
        assert gap > 1e-3, term


def test_the_export_renders_the_default_guidance(ltx2: dict[str, Any], guided: dict[str, Any]) -> None:
    """``diffusers_sampling("ltx2", ...)`` of that run passes the pipeline's rescale, STG (with its blocks) and
    isolation arguments; the pipeline with the exported scheduler and call renders fastgen's latents (1e-5). An
    audio rescale or STG of 0 beside a video one (the pipeline reads 0 as unset) is a one-line error."""
    from diffusers import LTX2Pipeline

    from fastgen.methods.multimodal import PipelineGuidance
    from fastgen.pipelines.noise import seeded
    from fastgen.pipelines.schedulers import SamplingPlan, diffusers_sampling, plan_of

    model = guided["model"]
    plan = plan_of(model, "net", 3)
    sampling = diffusers_sampling("ltx2", plan, model.net)
    assert {k: v for k, v in sampling.call.items() if k not in ("sigmas", "num_inference_steps")} == {
        "guidance_scale": 3.0, "audio_guidance_scale": 7.0, "guidance_rescale": 0.7, "audio_guidance_rescale": 0.7,
        "stg_scale": 1.0, "audio_stg_scale": 1.0, "modality_scale": 3.0, "audio_modality_scale": 3.0,
        "spatio_temporal_guidance_blocks": [1]}
    pipe = LTX2Pipeline(**{**guided["pipe"].components, "scheduler": sampling.scheduler})
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe(PROMPTS, negative_prompt="", height=PIXELS, width=PIXELS, num_frames=FRAMES, frame_rate=FRAME_RATE,
                  generator=seeded([3, 4]), output_type="latent", max_sequence_length=MAX_SEQUENCE_LENGTH,
                  return_dict=False, **sampling.call)
    ours = _sampler(ltx2, model, steps=3).latents(PROMPTS, [3, 4], SHAPES)
    codec = ltx2["codec"]
    torch.testing.assert_close(codec.denormalise(ours["video"]), theirs[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(codec.denormalise_audio(ours["audio"]), theirs[1], atol=1e-5, rtol=0)
    for name, terms in (("guidance_rescale", {"rescale": {"video": 0.7, "audio": 0.0}}),
                        ("stg_scale", {"stg": {"video": 1.0, "audio": 0.0}, "stg_blocks": (1,)})):
        odd = SamplingPlan("ode", plan.times, 3.0, extra=PipelineGuidance(**terms))
        with pytest.raises(UsageError, match=f"audio {name} 0"):
            diffusers_sampling("ltx2", odd, model.net)


def test_dmd2_teacher_and_heun_flow_guide_as_the_pipeline() -> None:
    """DMD2's guided teacher (``teacher_x0``) and Heun's guided flow (``flow_fn``) of runs with the pipeline's default
    guidance are ``LTX2Pipeline.__call__``'s combination, spelled out here from the network's four passes - the
    conditional, the negative, the STG-perturbed and the modality-isolated - and diffusers' ``rescale_noise_cfg``; a
    per-modality dict sets each stream's term (a missing one: off)."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg

    g = torch.Generator().manual_seed(5)
    x = {name: torch.randn(2, *shape, generator=g) for name, shape in SHAPES.items()}
    t = torch.tensor([0.8, 0.4])
    text = torch.randn(2, 3, 32, generator=g)

    def oracle(net: Any, terms: dict[str, Any]) -> dict[str, torch.Tensor]:
        backbone = net.backbone
        c = net(x, t, condition=text, fwd_pred_type="x0")
        u = net(x, t, condition=torch.zeros_like(text), fwd_pred_type="x0")
        with backbone.perturbed(stg_blocks=[1]):
            s = net(x, t, condition=text, fwd_pred_type="x0")
        with backbone.perturbed(isolate_modalities=True):
            i = net(x, t, condition=text, fwd_pred_type="x0")
        out = {}
        for m, cfg in (("video", 3.0), ("audio", 7.0)):
            rescale, stg, iso = (terms[k][m] for k in ("guidance_rescale", "stg_scale", "modality_isolation_scale"))
            guided = c[m] + (cfg - 1) * (c[m] - u[m]) + stg * (c[m] - s[m]) + (iso - 1) * (c[m] - i[m])
            out[m] = rescale_noise_cfg(guided, c[m], rescale) if rescale > 0 else guided
        return out

    per_stream = {"guidance_rescale": {"video": 0.7}, "stg_scale": {"audio": 1.0}, "modality_isolation_scale": 3.0}
    for fields in (DEFAULTS, {**DEFAULTS, **per_stream}):
        terms = {k: (v if isinstance(v, dict) else {"video": v, "audio": v}) for k, v in fields.items()
                 if k in ("guidance_rescale", "stg_scale", "modality_isolation_scale")}
        terms = {k: {m: v.get(m, 1.0 if k == "modality_isolation_scale" else 0.0) for m in SHAPES}
                 for k, v in terms.items()}
        dmd2 = _sft_model(_stg_net(), method="dmd2", **fields)
        with torch.no_grad():
            got, want = dmd2.teacher_x0(x, t, text), oracle(dmd2.teacher, terms)
        for m in SHAPES:
            torch.testing.assert_close(got[m], want[m], atol=1e-5, rtol=0)
        sft = _sft_model(_stg_net(), **fields)
        with torch.no_grad():
            flow = sft.flow_fn(sft.net, text, sft.config.guidance_scale)(x, t)
            want = oracle(sft.net, terms)
        for m in SHAPES:
            x0 = sft.net.noise_scheduler.convert(flow[m], x[m], t, "flow", "x0")
            torch.testing.assert_close(x0, want[m], atol=1e-5, rtol=0)


@pytest.mark.parametrize(("net", "fields", "match"), [
    ("tiny", {"stg_scale": 1.0, "stg_blocks": [1]}, "perturbed_attn"),
    ("stg", {"stg_scale": 1.0, "stg_blocks": [2]}, r"must name blocks 0\.\.1"),
    ("stg", {"stg_scale": 1.0}, "needs model.stg_blocks"),
    ("stg", {"stg_blocks": [1]}, "no model.stg_scale above 0"),
    ("stg", {"guidance_rescale": 1.5}, r"in \[0, 1\]"),
    ("stg", {"modality_isolation_scale": {"audio": 0.5}}, "at least 1"),
    ("stg", {"stg_scale": {"sound": 1.0}, "stg_blocks": [1]}, "not modalities"),
    ("two_stream", {"guidance_rescale": 0.7}, "need a network that has them"),
])
def test_guidance_terms_a_network_cannot_take_are_refused_in_one_line(net: str, fields: dict[str, Any],
                                                                      match: str) -> None:
    """STG on a model whose blocks ignore it (no ``perturbed_attn``: LTX-2.0's config) or at a block it lacks, STG
    without blocks or blocks without STG, out-of-range values, unknown modalities, and any of the terms on a network
    without the passes (not LTX-2) are one-line ConfigErrors at build."""
    if net == "two_stream":
        with pytest.raises(ConfigError, match=match):
            _two_stream("sft", **fields)
        return
    with pytest.raises(ConfigError, match=match):
        _sft_model(_stg_net() if net == "stg" else None, **fields)
