"""LTX-2 (``fastgen.networks.ltx2``, ``fastgen.networks.ltx2_codec``): the audio-visual transformer built from tiny
random configs of the real class, called as ``LTX2Pipeline`` calls it; its codec against the pipeline's own
encoding and decoding; the teacher's ODE sampling against the pipeline's output, both streams (tiny pipelines of
the real classes from ``tests/tiny_ltx2.py``, tokenizer built locally, nothing downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tiny_ltx2 import FRAME_RATE, FRAMES, MAX_SEQUENCE_LENGTH, PIXELS, tiny_ltx2_pipeline

from fastgen.configs.instantiate import instantiate
from fastgen.configs.net_ltx2 import TINY_LTX2, TINY_LTX2_AV_DIGITS, ltx2_shift, ltx2_transformer
from fastgen.networks.ltx2 import pack_audio, pack_video, unpack_audio, unpack_video
from fastgen.utils.errors import UsageError

PROMPTS = ["a red cat", "two dogs at night"]
# the tiny pipeline's latents for 9 frames of 32x32 at 24 fps: video (2, 5, 4, 4), audio (2, 9, 4)
VIDEO, AUDIO = [2, 5, 4, 4], [2, 9, 4]


def _net(config: dict[str, Any] = TINY_LTX2_AV_DIGITS, **kwargs: Any) -> Any:
    torch.manual_seed(0)
    return instantiate(ltx2_transformer(config, **kwargs)).eval()


def _digits_inputs(batch: int = 3, seed: int = 1) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Latents in ``TINY_LTX2_AV_DIGITS``'s layout (video 1x4x8x16 in 2x2 patches, audio 1x8x16) and two times."""
    g = torch.Generator().manual_seed(seed)
    x = {"video": torch.randn(batch, 1, 4, 8, 16, generator=g), "audio": torch.randn(batch, 1, 8, 16, generator=g)}
    t = {"video": torch.rand(batch, generator=g) * 0.9 + 0.05, "audio": torch.rand(batch, generator=g) * 0.9 + 0.05}
    return x, t


def test_tokens_are_packed_as_the_pipeline_packs_them() -> None:
    """``pack_video`` / ``pack_audio`` are ``LTX2Pipeline._pack_latents`` (2x2x2 patches here) and
    ``_pack_audio_latents``; the unpacking inverts them as the pipeline's ``_unpack_*`` do."""
    from diffusers import LTX2Pipeline

    g = torch.Generator().manual_seed(0)
    video, audio = torch.randn(2, 3, 4, 6, 8, generator=g), torch.randn(2, 3, 5, 4, generator=g)
    tokens = LTX2Pipeline._pack_latents(video, 2, 2)
    assert torch.equal(pack_video(video, 2, 2), tokens)
    assert torch.equal(unpack_video(tokens, 2, 3, 4, 2, 2), LTX2Pipeline._unpack_latents(tokens, 2, 3, 4, 2, 2))
    assert torch.equal(unpack_video(tokens, 2, 3, 4, 2, 2), video)
    audio_tokens = LTX2Pipeline._pack_audio_latents(audio)
    assert torch.equal(pack_audio(audio), audio_tokens)
    assert torch.equal(unpack_audio(audio_tokens, 4), LTX2Pipeline._unpack_audio_latents(audio_tokens, 5, 4))


@pytest.mark.parametrize("times", ["shared", "independent"])
def test_it_is_the_wrapped_model_called_as_its_pipeline_calls_it(times: str) -> None:
    """The velocities are the diffusers model's own forward on the pipeline's inputs: tokens packed by the pipeline,
    ``timestep = sigma = 1000 t`` per stream (``audio_timestep`` / ``audio_sigma`` the audio's), RoPE coordinates
    from the pipeline's ``prepare_video_coords`` at the network's fps and ``prepare_audio_coords``, an all-ones text
    mask, ``use_cross_timestep``; unpacked by the pipeline. Rectified flow's preconditioning is the identity."""
    from diffusers import LTX2Pipeline

    net = _net(fps=25.0, num_prompts=10, prompt_tokens=3)
    x, t = _digits_inputs()
    if times == "shared":
        t = {"audio": t["video"], "video": t["video"]}
    y = torch.tensor([0, 3, 7])
    text = net.backbone.prompt_bank[y]
    model = net.backbone.model
    with torch.no_grad():
        got = net(x, t, condition=y)
        b = 3
        video_coords = model.rope.prepare_video_coords(b, 4, 8, 16, torch.device("cpu"), fps=25.0)
        audio_coords = model.audio_rope.prepare_audio_coords(b, 8, torch.device("cpu"))
        ones = torch.ones(b, 3, dtype=torch.int64)
        video, audio = model(
            hidden_states=LTX2Pipeline._pack_latents(x["video"], 2, 1),
            audio_hidden_states=LTX2Pipeline._pack_audio_latents(x["audio"]),
            encoder_hidden_states=text[..., :16], audio_encoder_hidden_states=text[..., 16:],
            timestep=1000 * t["video"], audio_timestep=1000 * t["audio"], sigma=1000 * t["video"],
            audio_sigma=1000 * t["audio"], encoder_attention_mask=ones, audio_encoder_attention_mask=ones,
            video_coords=video_coords, audio_coords=audio_coords, use_cross_timestep=True, return_dict=False)
        want = {"video": LTX2Pipeline._unpack_latents(video, 4, 4, 8, 2, 1),
                "audio": LTX2Pipeline._unpack_audio_latents(audio, 8, 16)}
    assert net.native_pred_type == "flow"
    for name in ("video", "audio"):
        assert got[name].shape == x[name].shape
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=0)
    if times == "independent":  # the audio stream's own time matters, for both streams (cross-modal modulation)
        with torch.no_grad():
            other = net(x, {"video": t["video"], "audio": t["video"]}, condition=y)
        assert all(not torch.allclose(other[n], got[n], atol=1e-4) for n in ("video", "audio"))


def test_contract_labels_pick_prompts_and_zero_is_the_null_condition() -> None:
    """A label is its prompt's embeddings (video and audio halves side by side); the all-zero condition and
    ``None`` are the null condition; feature taps are the chosen blocks' video tokens as maps; a tensor input,
    other modalities, a missing time, log-variance and out-of-range taps are one-line errors, and so are audio
    patches the pipeline does not pack."""
    net = _net(num_prompts=10, prompt_tokens=3)
    x, t = _digits_inputs()
    y = torch.tensor([1, 4, 9])
    bank = net.backbone.prompt_bank
    assert bank.shape == (10, 3, 32)  # 16 video + 16 audio channels a token
    with torch.no_grad():
        out = net(x, t, condition=y)
        for other in (bank[y], torch.nn.functional.one_hot(y, 10).float()):
            same = net(x, t, condition=other)
            assert all(torch.allclose(same[n], out[n], atol=1e-6) for n in out)
        null = net(x, t, condition=torch.zeros(3, 10))
        none = net(x, t, condition=None)
        assert all(torch.allclose(none[n], null[n], atol=1e-6) for n in out)
        assert not torch.allclose(null["audio"], out["audio"], atol=1e-4)
        pred, features = net(x, t, condition=y, feature_indices=[1, 0])
    assert all(torch.allclose(pred[n], out[n], atol=1e-6) for n in out)
    assert [tuple(f.shape) for f in features] == [(3, 16, 4 * 4, 8)] * 2  # 4 frames x 4 rows of 2x2 patches, 8 columns
    assert not torch.allclose(features[0], features[1])
    with pytest.raises(ValueError, match="dict of"):
        net.backbone(x["video"], t["video"])
    with pytest.raises(ValueError, match="dict of"):
        net({"video": x["video"]}, t["video"])
    with pytest.raises(ValueError, match="one time per modality"):
        net.backbone(x, t["video"])
    with pytest.raises(ValueError, match="log-variance"):
        net(x, t, return_logvar=True)
    with pytest.raises(ValueError, match="feature_indices"):
        net(x, t, feature_indices=[2])
    with pytest.raises(ValueError, match="audio_in_channels"):
        net({"video": x["video"], "audio": x["audio"][..., :8]}, t)
    with pytest.raises(UsageError, match="audio_patch_size_t"):
        _net({**TINY_LTX2_AV_DIGITS, "audio_patch_size_t": 2})
    assert not hasattr(net.backbone, "head_projection")  # PDD widens one projection per stream: head_projections()


def test_zero_rows_are_the_text_mask() -> None:
    """Padding rows of zeros are masked out of both streams' text attention: a prompt padded further gives the same
    velocities, a nonzero row in the padding changes its sample's only."""
    net = _net()
    x, t = _digits_inputs(2)
    tokens = torch.randn(2, 5, 32)
    tokens[0, 3:] = 0
    padded = torch.cat([tokens, torch.zeros(2, 4, 32)], dim=1)
    noisy = padded.clone()
    noisy[0, 6] = 0.5
    with torch.no_grad():
        out, longer, other = (net(x, t, condition=c) for c in (tokens, padded, noisy))
    for name in out:
        torch.testing.assert_close(out[name], longer[name], atol=1e-5, rtol=0)
        assert not torch.allclose(other[name][0], out[name][0], atol=1e-4)
        torch.testing.assert_close(other[name][1], out[name][1], atol=1e-5, rtol=0)


def test_a_meta_build_and_a_lora_adapter() -> None:
    """A meta-device build (``to_empty``, then the weights) gives the same velocities; LoRA adapters on both streams'
    self-attention leave the output unchanged at start and train only themselves."""
    from fastgen.configs.instantiate import LazyCall
    from fastgen.utils.lora_utils import LoRAAdapter

    net = _net(num_prompts=10)
    x, t = _digits_inputs(2)
    with torch.device("meta"):
        meta = instantiate(ltx2_transformer(TINY_LTX2_AV_DIGITS, num_prompts=10))
    meta.to_empty(device="cpu")
    meta.load_state_dict(net.state_dict())
    with torch.no_grad():
        want = net(x, t, condition=torch.tensor([2, 5]))
        got = meta(x, t, condition=torch.tensor([2, 5]))
    assert all(torch.equal(got[n], want[n]) for n in want)

    adapter = instantiate(LazyCall(LoRAAdapter)(rank=2, alpha=4.0, target_modules=["*attn1.to_q", "*audio_attn1.to_v"]))
    names = adapter.apply(net)
    assert len(names) == 2 * 3 and any("audio_attn1" in n for n in names)  # 2 blocks: q of both streams, audio v
    out = net(x, t, condition=torch.tensor([2, 5]))
    assert all(torch.allclose(out[n], want[n], atol=1e-6) for n in want)  # B starts at zero
    (out["video"].square().mean() + out["audio"].square().mean()).backward()
    trained = [n for n, p in net.named_parameters() if p.grad is not None]
    assert trained and all(".lora." in n for n in trained)


# ---- against LTX2Pipeline ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny LTX2Pipeline around a ``TINY_LTX2`` network (its video token count 5 x 4 x 4 = 80 sets the sampling
    shift, as the pipeline's dynamic shift does), saved as a folder, and the codec ``load_codec`` reads from it."""
    from fastgen.networks.codecs import load_codec

    net = _net(TINY_LTX2, video_seq_len=80)
    pipe = tiny_ltx2_pipeline(net.backbone.model)
    folder = tmp_path_factory.mktemp("ltx2") / "pipeline"
    pipe.save_pretrained(folder)
    codec = load_codec(folder, max_sequence_length=MAX_SEQUENCE_LENGTH)
    return {"net": net, "pipe": pipe, "folder": folder, "codec": codec}


def _pipeline_call(pipe: Any, seeds: list[int], guidance: float, steps: int, output_type: str) -> Any:
    """The pipeline with one guidance scale for both streams and without its rescale, STG or modality guidance."""
    from fastgen.pipelines.noise import seeded

    pipe.set_progress_bar_config(disable=True)
    return pipe(PROMPTS, negative_prompt="", height=PIXELS, width=PIXELS, num_frames=FRAMES, frame_rate=FRAME_RATE,
                num_inference_steps=steps, guidance_scale=guidance, audio_guidance_scale=guidance, guidance_rescale=0.0,
                audio_guidance_rescale=0.0, stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0,
                audio_modality_scale=1.0, generator=seeded(seeds), output_type=output_type,
                max_sequence_length=MAX_SEQUENCE_LENGTH, return_dict=False)


def _ours(pipeline: dict[str, Any], seeds: list[int], guidance: float, steps: int) -> dict[str, torch.Tensor]:
    """fastgen's teacher ODE from the pipeline's noise: per prompt, its generator draws the video latents, then the
    audio latents (``prepare_latents``, ``prepare_audio_latents``)."""
    from fastgen.pipelines.noise import seeded
    from fastgen.pipelines.prompts import ode_sample
    from fastgen.pipelines.schedulers import SamplingPlan

    net, codec = pipeline["net"], pipeline["codec"]
    generators = seeded(seeds)
    x = {name: torch.cat([torch.randn((1, *shape), generator=g) for g in generators])
         for name, shape in (("video", VIDEO), ("audio", AUDIO))}  # all videos first, then the audio: the pipeline's order
    times = tuple(net.noise_scheduler.sampling_times(steps).tolist()[:-1])
    cond = codec.condition(codec.encode_prompts(PROMPTS))
    uncond = codec.condition(codec.encode_negative([""] * len(PROMPTS)))
    with torch.no_grad():
        return ode_sample(net, x, cond, uncond, SamplingPlan("ode", times, guidance))


@pytest.mark.parametrize(("guidance", "steps"), [(3.0, 4), (1.0, 3)])
def test_teacher_sampling_equals_the_pipeline(pipeline: dict[str, Any], guidance: float, steps: int) -> None:
    """The teacher's DDIM ODE over its schedule's grid - LTX2Pipeline's dynamic shift for 80 video tokens as a static
    shift, then shift_terminal 0.1 - with guidance against "" equals the pipeline's Euler sampling from the same
    seeds: video and audio latents (denormalised by the codec as the pipeline does for ``output_type="latent"``) to
    1e-4."""
    theirs_video, theirs_audio = _pipeline_call(pipeline["pipe"], [1, 2], guidance, steps, "latent")
    sigmas = pipeline["pipe"].scheduler.sigmas[:-1]
    torch.testing.assert_close(pipeline["net"].noise_scheduler.sampling_times(steps)[:-1], sigmas, atol=1e-6, rtol=0)
    ours = _ours(pipeline, [1, 2], guidance, steps)
    codec = pipeline["codec"]
    torch.testing.assert_close(codec.denormalise(ours["video"]), theirs_video, atol=1e-4, rtol=0)
    torch.testing.assert_close(codec.denormalise_audio(ours["audio"]), theirs_audio, atol=1e-4, rtol=0)
    assert float(theirs_video.std()) > 0.1 and float(theirs_audio.std()) > 0.1


def test_the_sampling_shift_is_the_pipelines_dynamic_shift() -> None:
    """``ltx2_shift`` is exp(mu) of the pipeline's ``calculate_shift`` with LTX-2's constants (6144 tokens: 121
    frames of 512x768)."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

    for tokens in (80, 1024, 6144):
        assert ltx2_shift(tokens) == pytest.approx(np.exp(calculate_shift(tokens, 1024, 4096, 0.95, 2.05)), rel=1e-12)


def test_modality_shapes_are_the_latents_the_pipeline_samples(pipeline: dict[str, Any]) -> None:
    """``ltx2_modality_shapes``: the pipeline's latent sizes for a clip (LTX-2's VAEs: 121 frames of 512x768 at 24
    fps; the tiny pipeline's: what it returns for 9 frames of 32x32)."""
    from fastgen.configs.net_ltx2 import ltx2_modality_shapes

    assert ltx2_modality_shapes(512, 768, 121, 24.0) == {"video": [128, 16, 16, 24], "audio": [8, 126, 16]}
    video, audio = _pipeline_call(pipeline["pipe"], [1, 2], 1.0, 2, "latent")
    tiny = {"channels": 2, "temporal": 2, "spatial": 8, "audio_channels": 2, "mel_bins": 16}
    assert ltx2_modality_shapes(PIXELS, PIXELS, FRAMES, FRAME_RATE, tiny) == {"video": list(video.shape[1:]),
                                                                              "audio": list(audio.shape[1:])}


def test_the_codec_encodes_as_the_pipeline(pipeline: dict[str, Any]) -> None:
    """Prompts: Gemma-3's stacked states through the connectors, the pipeline's ``encode_prompt`` + ``connectors``
    for the prompts and the negative "" (video and audio embeddings side by side). Video: the VAE's mode normalised
    as ``_normalize_latents`` with the scaling factor; audio: the audio VAE's mode normalised as
    ``prepare_audio_latents`` does, in the packed layout."""
    pipe, codec = pipeline["pipe"], pipeline["codec"]
    with torch.no_grad():
        embeds, mask, negative, negative_mask = pipe.encode_prompt(PROMPTS, negative_prompt="",
                                                                   max_sequence_length=MAX_SEQUENCE_LENGTH,
                                                                   device=torch.device("cpu"))
        video_text, audio_text, connector_mask = pipe.connectors(torch.cat([negative, embeds]),
                                                                 torch.cat([negative_mask, mask]), padding_side="left")
    encoded = torch.cat([codec.condition(codec.encode_negative(["", ""])), codec.condition(codec.encode_prompts(PROMPTS))])
    torch.testing.assert_close(encoded, torch.cat([video_text, audio_text], dim=-1), atol=1e-6, rtol=0)
    assert bool(connector_mask.all()) and bool(codec.encode_prompts(PROMPTS)["text_mask"].all())

    g = torch.Generator().manual_seed(3)
    frames = torch.rand(2, 3, FRAMES, PIXELS, PIXELS, generator=g) * 2 - 1
    with torch.no_grad():
        raw = pipe.vae.encode(frames).latent_dist.mode()
        want = pipe._normalize_latents(raw, pipe.vae.latents_mean, pipe.vae.latents_std, pipe.vae.config.scaling_factor)
    latents = codec.encode_images(frames)
    assert list(latents.shape[1:]) == VIDEO
    torch.testing.assert_close(latents, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(codec.denormalise(latents), raw, atol=1e-5, rtol=0)

    mel = torch.randn(2, 2, 36, 16, generator=g)
    with torch.no_grad():
        raw_audio = pipe.audio_vae.encode(mel).latent_dist.mode()
        packed = pipe.prepare_audio_latents(2, latents=raw_audio, noise_scale=0.0, dtype=torch.float32,
                                            device=torch.device("cpu"))
    audio = codec.encode_audio(mel)
    assert list(audio.shape[1:]) == AUDIO
    torch.testing.assert_close(audio, pipe._unpack_audio_latents(packed, 9, 4), atol=1e-6, rtol=0)
    torch.testing.assert_close(codec.denormalise_audio(audio), raw_audio, atol=1e-5, rtol=0)


def test_the_codec_decodes_as_the_pipeline(pipeline: dict[str, Any]) -> None:
    """Frames and waveforms of the sampled latents: the codec's decoding of fastgen's samples equals the pipeline's
    ``output_type="np"`` video (to 1/255 after 8-bit rounding) and its vocoder waveform (to 1e-4)."""
    from fastgen.pipelines.prompts import to_uint8

    frames, waveform = _pipeline_call(pipeline["pipe"], [4, 5], 2.0, 3, "np")
    decoded = pipeline["codec"].decode_latents(_ours(pipeline, [4, 5], 2.0, 3))
    ours = to_uint8(decoded["video"]).numpy().astype(int)
    assert ours.shape == frames.shape == (2, FRAMES, PIXELS, PIXELS, 3)
    assert np.abs(ours - (frames * 255).round().astype(int)).max() <= 1
    torch.testing.assert_close(decoded["audio"], waveform, atol=1e-4, rtol=0)
    assert pipeline["codec"].sample_rate == 16000 and decoded["audio"].shape[:2] == (2, 2)


def test_a_pipeline_folder_without_the_text_stack_still_decodes(pipeline: dict[str, Any]) -> None:
    from fastgen.networks.codecs import codec_family, load_codec

    assert codec_family(pipeline["folder"]) == "ltx2"
    codec = load_codec(pipeline["folder"], text=False)
    assert not len(codec.encoders) and codec.audio_vae is not None and codec.vocoder is not None
    latents = {"video": torch.randn(1, *VIDEO), "audio": torch.randn(1, *AUDIO)}
    decoded = codec.decode_latents(latents)
    torch.testing.assert_close(decoded["audio"], pipeline["codec"].decode_audio(latents["audio"]))
    assert decoded["video"].shape == (1, 3, FRAMES, PIXELS, PIXELS)


def test_weights_load_from_the_pipeline_folder(pipeline: dict[str, Any], tmp_path: Path) -> None:
    """``model.pretrained_model_path``: the folder's transformer loads strictly into a fresh network."""
    net = instantiate(ltx2_transformer(TINY_LTX2, video_seq_len=80))
    net.backbone.load_pretrained(str(pipeline["folder"]))
    state = pipeline["net"].backbone.model.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in net.backbone.model.state_dict().items())
