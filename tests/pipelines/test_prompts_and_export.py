"""From captions to a pipeline diffusers runs (issue 34, points 4 and 5), per family (SD 1.5, SDXL, Flux, Wan,
Qwen-Image, CogVideoX), on tiny
random pipelines of the real classes: 8 captioned images -> ``fastgen encode-data`` -> 2 DMD2 iterations of a
2-step student (the real Trainer, reading the shards) -> ``fastgen sample --prompt`` -> ``fastgen convert-ckpt
--to diffusers`` -> ``DiffusionPipeline.from_pretrained`` renders the files ``fastgen sample`` wrote. diffusers'
own pipelines are the oracles: the student's sampler, the teacher's ODE with guidance, the noise they draw."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastgen_testing import run_in_process as fastgen
from fastgen_testing import shard_samples, two_iterations
from PIL import Image
from tiny_pipelines import tiny_family_pipeline

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

CAPTIONS = ["a red cat", "a blue dog", "two birds", "a green frog", "the sea", "a tall tree", "one fish", "a cloud"]
PROMPTS = ["a red cat", "two dogs at night"]
NETS = {"sd": (sd_unet, TINY_SD_UNET), "sdxl": (sdxl_unet, TINY_SDXL_UNET), "flux": (flux_transformer, TINY_FLUX),
        "wan": (wan_transformer, TINY_WAN), "qwenimage": (qwenimage_transformer, TINY_QWEN_IMAGE),
        "cogvideox": (cogvideox_transformer, TINY_COGVIDEOX)}
# the pipelines' own sizes for 8x8 latents: Wan's pipeline divides by the VAE config's 8, the others by 2 (tiny VAEs)
PIXELS = {"sd": 16, "sdxl": 16, "flux": 16, "wan": 64, "qwenimage": 16, "cogvideox": 16}
# families whose pipelines make videos (one frame here: the latents of an image)
VIDEO = ("wan", "cogvideox")
# what a family's network is told beyond its architecture: Wan unshifted (see train_config), SDXL the tiny VAE's
# scale (its default time ids are the sampled size in pixels), Qwen-Image the token count of 8x8 latents (its
# pipeline's dynamic shift for that size)
NET_OPTIONS: dict[str, dict[str, Any]] = {"wan": {"shift": 1.0}, "sdxl": {"vae_scale_factor": 2},
                                          "qwenimage": {"image_seq_len": 16}}


def captioned_images(folder: Path) -> Path:
    rng = np.random.default_rng(1)
    folder.mkdir()
    for i, caption in enumerate(CAPTIONS):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(caption)
    return folder


def train_config(family: str, weights: Path, shards: Path, latent_shape: list[int] | None = None) -> Any:
    from fastgen.configs.callbacks import EMA_CALLBACK
    from fastgen.configs.data import webdataset_loader
    from fastgen.configs.experiments.Digits.config_dmd2_digits import create_config

    build, tiny = NETS[family]
    config = create_config()
    # text conditions (num_classes > 0 passes them through); Wan unshifted: WanPipeline's scheduler can then put the
    # teacher's uniform grid on num_inference_steps (a shifted one is refused, test_samplers_...)
    config.model.net = build(tiny, num_prompts=1, **NET_OPTIONS.get(family, {}))
    config.model.num_classes = 1
    config.model.teacher_ckpt = None
    config.model.pretrained_model_path = str(weights)
    # None: a recipe's default that is not the data's - the trainer takes the shards' (index.json)
    config.model.input_shape = latent_shape or [1, 4, 4]
    config.model.t_list = [1.0, 0.5]  # a 2-step student: x0, fresh noise at t = 0.5, x0
    config.model.use_ema = True
    config.dataloader_train = webdataset_loader([f"WDS:{shards}"], batch_size=4, shuffle_buffer=8,
                                                fields={"real": "latent.npy", "condition": "text.npy"})
    return two_iterations(config, f"tiny_{family}", group="t2i", callbacks=EMA_CALLBACK)


@pytest.fixture(scope="module", params=["sd", "sdxl", "flux", "wan", "qwenimage", "cogvideox"])
def family_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny pipeline folder of the family, its encoded shards and a 2-iteration DMD2 run trained on them."""
    from fastgen.configs.instantiate import instantiate
    from fastgen.trainer import Trainer

    family = request.param
    root = tmp_path_factory.mktemp(family)
    torch.manual_seed(0)
    build, tiny = NETS[family]
    network = instantiate(build(tiny, **NET_OPTIONS.get(family, {}))).backbone.model
    weights = root / "pipeline"
    tiny_family_pipeline(family, network).save_pretrained(weights)
    shards = root / "shards"
    encoded = fastgen("encode-data", str(captioned_images(root / "photos")), str(shards), "--weights", str(weights),
                      "--resolution", "16", "--device", "cpu")
    assert encoded.returncode == 0, encoded.stderr[-2000:]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTGEN_OUTPUT_ROOT", str(root / "runs"))
        mp.setenv("WANDB_MODE", "disabled")
        config = train_config(family, weights, shards)
        Trainer(config).run()
        run = Path(config.log_config.save_path)
    check_shards_hold_the_codecs_fields(weights, root / "photos", shards)
    sample = shard_samples(shards)[CAPTIONS[0]]
    if family == "sdxl":  # each image's micro-conditioning: 16x16 originals, uncropped, at resolution 16
        assert sample["time_ids"].tolist() == [16, 16, 0, 0, 16, 16]
        assert sample["text"][0, 8:14].tolist() == sample["time_ids"].tolist()
    if family == "qwenimage":  # each caption's own tokens, zero-padded to 512; the mask is the nonzero rows
        text, mask = sample["text"], sample["text_mask"]
        assert text.shape == (512, 16) and 0 < mask.sum() < 512
        assert (np.abs(text).sum(-1) > 0).tolist() == mask.astype(bool).tolist()
    index = json.loads((shards / "index.json").read_text())
    expected = [1, 1, 8, 8] if family in VIDEO else [1, 8, 8]  # Wan's and CogVideoX's codecs give images one frame
    assert index["latent_shape"] == expected
    from fastgen.configs.config_utils import load_config

    assert list(load_config(str(run / "config.yaml")).model.input_shape) == expected  # the data's, recorded
    return {"family": family, "weights": weights, "run": run, "root": root}


def check_shards_hold_the_codecs_fields(weights: Path, photos: Path, shards: Path) -> None:
    """Every caption's sample holds what the family's codec gives: ``latent.npy`` its latents of the photo, and
    ``text.npy`` (and ``pooled`` / ``text_mask`` / ``time_ids`` where the family has them) its encoding of the
    caption (``Codec.condition``; SDXL's with that photo's time ids)."""
    from fastgen.datasets.sources import center_crop_resize
    from fastgen.networks.codecs import load_codec

    codec = load_codec(weights)
    samples = shard_samples(shards)
    assert sorted(samples) == sorted(CAPTIONS)
    for i, caption in enumerate(CAPTIONS):
        sample = samples[caption]
        pixels = torch.from_numpy(center_crop_resize(photos / f"{i}.png", 16)).permute(2, 0, 1)[None].float()
        latents = codec.encode_images(pixels / 127.5 - 1)[0]
        torch.testing.assert_close(torch.from_numpy(sample["latent"]), latents.reshape(sample["latent"].shape),
                                   atol=1e-5, rtol=0)
        encoded = codec.encode_prompts([caption])
        if "time_ids" in sample:
            encoded["time_ids"] = torch.from_numpy(sample["time_ids"])[None]
        torch.testing.assert_close(torch.from_numpy(sample["text"]), codec.condition(encoded)[0].float(), atol=1e-5,
                                   rtol=0)
        if "pooled" in encoded:  # batched in the shards, alone here: equal to float rounding
            np.testing.assert_allclose(sample["pooled"], encoded["pooled"][0].numpy(), atol=1e-5, rtol=0)
        if "text_mask" in encoded:
            assert np.array_equal(sample["text_mask"], encoded["text_mask"][0].long().numpy())


def read_png(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def pipeline_images(folder: Path, prompts: list[str], seeds: list[int], call: dict[str, Any], family: str,
                    global_seed: bool) -> np.ndarray:
    """What diffusers renders from ``folder``, as 8-bit images."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    if global_seed:
        torch.manual_seed(seeds[0])
    size = PIXELS[family]
    extra = {"num_frames": 1} if family in VIDEO else {}
    out = pipe(prompts, generator=[torch.Generator().manual_seed(s) for s in seeds], height=size, width=size,
               output_type="np", **extra, **call)
    images = out.frames[:, 0] if family in VIDEO else out.images
    return (images * 255).round().astype(np.uint8)


def test_captions_to_a_pipeline_diffusers_runs(family_run: dict[str, Any], tmp_path: Path) -> None:
    """encode-data -> train -> sample --prompt -> export -> reload: the exported pipeline, run by diffusers with the
    call arguments in fastgen_export.json, draws the PNGs ``fastgen sample`` drew (mean difference <= 2/255), and
    its network is the run's EMA network bit for bit."""
    from safetensors.torch import load_file

    from fastgen.checkpoint.checkpointer import load_checkpoint

    family, run = family_run["family"], family_run["run"]
    samples = tmp_path / "samples"
    sampled = fastgen("sample", str(run), "--ema", "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--seed", "5",
                      "--out", str(samples))
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    records = json.loads((samples / "samples.json").read_text())
    assert [(r["file"], r["prompt"], r["seed"]) for r in records] == [("0000.png", PROMPTS[0], 5),
                                                                      ("0001.png", PROMPTS[1], 6)]
    ours = np.stack([read_png(samples / r["file"]) for r in records])
    assert ours.shape == (2, 16, 16, 3)

    export = tmp_path / "export"
    exported = fastgen("convert-ckpt", str(run), str(export), "--to", "diffusers")
    assert exported.returncode == 0, exported.stderr[-2000:]
    info = json.loads((export / "fastgen_export.json").read_text())
    assert info["family"] == family and info["network"] == "ema" and info["times"] == [1.0, 0.5]
    # Flux / Wan / Qwen-Image re-noise from the global generator; SD's and CogVideoX's schedulers take the pipeline's
    assert info["global_seed"] == (family not in ("sd", "sdxl", "cogvideox"))
    card = (export / "README.md").read_text()
    assert "convert-ckpt" in card and "library_name: diffusers" in card and "fastgen_export.json" in card

    theirs = pipeline_images(export, PROMPTS, [5, 6], info["call"], family, info["global_seed"])
    difference = np.abs(theirs.astype(int) - ours.astype(int))
    assert difference.mean() / 255 <= 2 / 255 and difference.max() <= 2, (difference.mean(), difference.max())
    assert len(np.unique(ours.reshape(2, -1), axis=0)) == 2  # two prompts and seeds, two images

    subfolder = "unet" if family in ("sd", "sdxl") else "transformer"
    saved = load_file(str(export / subfolder / "diffusion_pytorch_model.safetensors"))
    payload = load_checkpoint(str(run / "checkpoints" / "0000002.pth"))
    ema = {k.removeprefix("backbone.model."): v for k, v in payload["model"]["ema"].items()
           if k.startswith("backbone.model.")}
    assert saved.keys() == ema.keys() and all(torch.equal(saved[k], ema[k]) for k in saved)
    # the other components are the teacher folder's own
    for name in ("vae", "text_encoder"):
        for file in (family_run["weights"] / name).iterdir():
            assert (export / name / file.name).read_bytes() == file.read_bytes()


def test_teacher_ode_sampling_with_guidance_equals_the_pipeline(family_run: dict[str, Any], tmp_path: Path) -> None:
    """The teacher over a 3-step grid with guidance 2 against the empty prompt: fastgen's DDIM ODE equals the
    family's pipeline with the exported Euler scheduler (Wan: its grid from num_inference_steps and shift_terminal;
    CogVideoX: 4 steps - its own DDIM scheduler steps t -> t - 1000 // n - with plain CFG)."""
    from fastgen.checkpoint.run import load_run, select_net
    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.export import export_diffusers
    from fastgen.pipelines.prompts import PromptSampler

    family, run = family_run["family"], load_run(family_run["run"])
    steps = 4 if family == "cogvideox" else 3
    sampler = PromptSampler(run.model, select_net(run, "teacher"), "teacher", load_codec(family_run["weights"]),
                            steps=steps, guidance=2.0)
    ours = sampler.pixels(sampler.latents(PROMPTS, [1, 2], list(run.config.model.input_shape))).numpy()
    if ours.ndim == 5:  # Wan, CogVideoX: one-frame videos
        ours = ours[:, 0]
    info = export_diffusers(str(family_run["run"]), str(tmp_path / "teacher"), only="teacher", steps=steps, guidance=2.0)
    assert info["sampler"] == "ode" and info["scheduler"] in ("EulerDiscreteScheduler", "FlowMatchEulerDiscreteScheduler",
                                                              "CogVideoXDDIMScheduler")
    theirs = pipeline_images(tmp_path / "teacher", PROMPTS, [1, 2], info["call"], family, False)
    difference = np.abs(theirs.astype(int) - ours.astype(int))
    assert difference.max() <= 1, difference.max()


@pytest.mark.parametrize("family_run", ["qwenimage"], indirect=True)
def test_qwenimage_teacher_samples_as_its_own_pipeline(family_run: dict[str, Any]) -> None:
    """The teacher as Qwen-Image's pipeline folder samples it, untouched - its scheduler's dynamic shift for 8x8
    latents (mu from 16 tokens) and shift_terminal, no sigmas passed; true_cfg_scale 6 against the negative prompt
    "" with the per-token norm rescale - equals fastgen's teacher ODE with guidance 6 over 4 steps (final latents
    to 1e-4, images to 1/255); with guidance 1 (none) too. Plain ``u + s (c - u)`` guidance would not."""
    from diffusers import QwenImagePipeline

    from fastgen.checkpoint.run import load_run, select_net
    from fastgen.networks.codecs import load_codec
    from fastgen.networks.diffusers_nets import unpack_flux_latents
    from fastgen.pipelines.prompts import PromptSampler

    run = load_run(family_run["run"])
    codec = load_codec(family_run["weights"])
    teacher = select_net(run, "teacher")
    pipe = QwenImagePipeline.from_pretrained(family_run["weights"])
    pipe.set_progress_bar_config(disable=True)
    assert pipe.scheduler.config.use_dynamic_shifting and pipe.scheduler.config.shift_terminal == 0.02

    def theirs(output_type: str, **call: Any) -> Any:
        generators = [torch.Generator().manual_seed(s) for s in (1, 2)]
        return pipe(PROMPTS, generator=generators, height=16, width=16, num_inference_steps=4,
                    output_type=output_type, **call).images

    def ours(guidance: float) -> tuple[torch.Tensor, np.ndarray]:
        sampler = PromptSampler(run.model, teacher, "teacher", codec, steps=4, guidance=guidance)
        latents = sampler.latents(PROMPTS, [1, 2], [1, 8, 8])
        return latents, sampler.pixels(latents).numpy()

    for guidance, call in ((6.0, {"true_cfg_scale": 6.0, "negative_prompt": ""}), (1.0, {"true_cfg_scale": 1.0})):
        latents, pixels = ours(guidance)
        expected = unpack_flux_latents(theirs("latent", **call), 8, 8)
        torch.testing.assert_close(latents, expected, atol=1e-4, rtol=0)
        images = (theirs("np", **call) * 255).round().astype(int)
        assert np.abs(images - pixels.astype(int)).max() <= 1, guidance
    teacher.backbone.linear_guidance = True  # this instance only: plain u + s (c - u)
    try:
        linear, _ = ours(6.0)
    finally:
        del teacher.backbone.linear_guidance
    difference = (linear - unpack_flux_latents(theirs("latent", true_cfg_scale=6.0, negative_prompt=""), 8, 8)).abs()
    assert difference.max() > 1e-2, difference.max()


@pytest.mark.parametrize("family_run", ["cogvideox"], indirect=True)
def test_cogvideox_samples_videos_as_its_own_pipeline(family_run: dict[str, Any], tmp_path: Path) -> None:
    """Videos of 3 latent frames (5 frames through the tiny VAE), where the pipeline's frame-major layout matters:
    the teacher as CogVideoX's pipeline folder samples it, untouched - its CogVideoXDDIMScheduler (v prediction,
    zero terminal SNR, trailing) over 4 and 5 steps, plain CFG 6 against "" and none - equals fastgen's teacher ODE
    (final latents to 1e-4, frames to 1/255); the exported 2-step student (LCM re-noising from each prompt's
    generator, drawn frame major) equals fastgen's student; a 3-step DDIM grid, which the scheduler cannot step,
    is refused in one line."""
    from diffusers import CogVideoXPipeline

    from fastgen.checkpoint.run import load_run, select_net
    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.export import export_diffusers
    from fastgen.pipelines.prompts import PromptSampler
    from fastgen.utils.errors import UsageError

    run = load_run(family_run["run"])
    codec = load_codec(family_run["weights"])
    shape = [1, 3, 8, 8]

    def theirs(folder: Path, output_type: str, **call: Any) -> Any:
        pipe = CogVideoXPipeline.from_pretrained(folder)
        pipe.set_progress_bar_config(disable=True)
        if output_type == "latent":  # the pipeline's (B, F, C, h, w) latents as fastgen's (B, C, F, h, w)
            call = {**call, "output_type": "latent"}
        generators = [torch.Generator().manual_seed(s) for s in (1, 2)]
        out = pipe(PROMPTS, generator=generators, height=16, width=16, num_frames=5, **call,
                   **({} if output_type == "latent" else {"output_type": "np"})).frames
        return out.transpose(1, 2) if output_type == "latent" else (out * 255).round().astype(int)

    pipe_folder = family_run["weights"]
    assert json.loads((pipe_folder / "scheduler" / "scheduler_config.json").read_text())["rescale_betas_zero_snr"]
    for steps, guidance in ((4, 6.0), (5, 1.0)):
        sampler = PromptSampler(run.model, select_net(run, "teacher"), "teacher", codec, steps=steps, guidance=guidance)
        latents = sampler.latents(PROMPTS, [1, 2], shape)
        call = {"num_inference_steps": steps, "guidance_scale": guidance}
        torch.testing.assert_close(latents, theirs(pipe_folder, "latent", **call), atol=1e-4, rtol=0)
        frames = sampler.pixels(latents).numpy()
        assert frames.shape == (2, 5, 16, 16, 3)
        assert np.abs(theirs(pipe_folder, "np", **call) - frames.astype(int)).max() <= 1, steps

    export = tmp_path / "student"
    info = export_diffusers(str(family_run["run"]), str(export))
    assert info["scheduler"] == "LCMScheduler" and info["call"] == {"guidance_scale": 1.0, "timesteps": [999, 499]}
    student = PromptSampler(run.model, select_net(run, "ema"), "ema", codec)
    latents = student.latents(PROMPTS, [1, 2], shape)
    torch.testing.assert_close(latents, theirs(export, "latent", **info["call"]), atol=1e-4, rtol=0)
    with pytest.raises(UsageError, match="choose a step count that divides 1000"):
        export_diffusers(str(family_run["run"]), str(tmp_path / "three"), only="teacher", steps=3)


@pytest.mark.parametrize("family_run", ["wan"], indirect=True)
def test_a_video_prompt_writes_an_mp4(family_run: dict[str, Any], tmp_path: Path) -> None:
    """Wan samples video latents (2 latent frames): ``write_prompt_samples`` writes NNNN.mp4 that
    decodes back to the sampled frames (H.264: close, not exact)."""
    from fastgen.checkpoint.run import load_run, select_net
    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.media import read_mp4
    from fastgen.pipelines.prompts import PromptSampler, write_prompt_samples

    run = load_run(family_run["run"])
    sampler = PromptSampler(run.model, select_net(run, "ema"), "ema", load_codec(family_run["weights"]))
    records = write_prompt_samples(sampler, PROMPTS[:1], [3], tmp_path, [1, 2, 8, 8])
    assert records == [{"file": "0000.mp4", "prompt": PROMPTS[0], "seed": 3}]
    frames = read_mp4(tmp_path / "0000.mp4")
    expected = sampler.pixels(sampler.latents(PROMPTS[:1], [3], [1, 2, 8, 8])).numpy()[0]
    assert frames.shape == expected.shape == (3, 16, 16, 3)  # the tiny VAE halves time: 2 latent frames -> 3
    other = sampler.pixels(sampler.latents(PROMPTS[:1], [4], [1, 2, 8, 8])).numpy()[0]
    luma = np.array([0.299, 0.587, 0.114])  # H.264's 4:2:0 keeps brightness per pixel, colour per 2x2 block
    own, another = (np.abs((frames - x.astype(float)) @ luma).mean() for x in (expected, other))
    assert own < another / 3, (own, another)


@pytest.mark.parametrize("family_run", ["sd"], indirect=True)
def test_a_lora_run_exports_merged(family_run: dict[str, Any], tmp_path: Path) -> None:
    """A LoRA run (``model.net_adapter`` on the U-Net's attention projections) exports its network with the adapter
    folded in: the pipeline's U-Net is the base plus the trained low-rank update, and renders what fastgen
    samples from the adapted network."""
    from safetensors.torch import load_file

    from fastgen.checkpoint.run import load_run
    from fastgen.configs.instantiate import LazyCall
    from fastgen.trainer import Trainer
    from fastgen.utils.lora_utils import LoRAAdapter, merge_lora

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path / "runs"))
        config = train_config("sd", family_run["weights"], family_run["root"] / "shards", [1, 8, 8])
        config.model.net_adapter = LazyCall(LoRAAdapter)(rank=2, alpha=4.0, target_modules=["*attn1.to_q", "*attn1.to_v"])
        config.model.net_optimizer.lr = 1e-2
        config.model.use_ema = False
        config.trainer.callbacks = {}
        config.log_config.name = "tiny_sd_lora"
        Trainer(config).run()
        run_dir = Path(config.log_config.save_path)

    samples = tmp_path / "samples"
    assert fastgen("sample", str(run_dir), "--prompt", PROMPTS[0], "--seed", "9", "--out", str(samples)).returncode == 0
    export = tmp_path / "export"
    result = fastgen("convert-ckpt", str(run_dir), str(export), "--to", "diffusers")
    assert result.returncode == 0, result.stderr[-2000:]
    info = json.loads((export / "fastgen_export.json").read_text())
    assert info["network"] == "net"

    merged = load_run(run_dir).model.net
    assert merge_lora(merged) == 8  # q and v of the self-attention in each of the U-Net's 4 transformer blocks
    expected = {k.removeprefix("backbone.model."): v for k, v in merged.state_dict().items()
                if k.startswith("backbone.model.")}
    saved = load_file(str(export / "unet" / "diffusion_pytorch_model.safetensors"))
    base = load_file(str(family_run["weights"] / "unet" / "diffusion_pytorch_model.safetensors"))
    bad = [(k, (saved[k] - expected[k]).abs().max().item()) for k in saved if not torch.equal(saved[k], expected[k])]
    assert saved.keys() == expected.keys() and not bad, bad
    changed = [k for k in saved if not torch.equal(saved[k], base[k])]
    assert changed and all(k.endswith(("to_q.weight", "to_v.weight")) for k in changed), changed

    theirs = pipeline_images(export, PROMPTS[:1], [9], info["call"], "sd", False)
    ours = read_png(samples / "0000.png")[None]
    assert np.abs(theirs.astype(int) - ours.astype(int)).max() <= 2


def one_line_error(result: subprocess.CompletedProcess, fragment: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], (result.returncode, result.stderr)


@pytest.mark.parametrize("family_run", ["sd"], indirect=True)
def test_prompt_and_export_edges_are_one_line_errors(family_run: dict[str, Any], tmp_path: Path) -> None:
    from fastgen_testing import tiny_toy_config

    from fastgen.trainer import Trainer

    run = str(family_run["run"])
    one_line_error(fastgen("sample", run, "--prompt", "x", "--guidance", "3"), "a distilled student samples without")
    one_line_error(fastgen("sample", run, "--guidance", "3"), "go with --prompt")
    one_line_error(fastgen("sample", run, "--prompt", "x", "--label", "1"), "--label is for class-conditional")
    one_line_error(fastgen("sample", run, "--prompt-file", str(tmp_path / "none.txt")), "--prompt-file")
    (tmp_path / "empty.txt").write_text("\n  \n")
    one_line_error(fastgen("sample", run, "--prompt-file", str(tmp_path / "empty.txt")), "holds no prompt")
    one_line_error(fastgen("sample", run, "--prompt", "x", "--weights", str(tmp_path)), "not a diffusers pipeline folder")
    (tmp_path / "taken").mkdir()
    one_line_error(fastgen("convert-ckpt", run, str(tmp_path / "taken"), "--to", "diffusers"), "exists")
    one_line_error(fastgen("convert-ckpt", run, str(tmp_path / "x.pth"), "--weights", str(tmp_path)),
                   "--weights goes with --to diffusers")
    one_line_error(fastgen("convert-ckpt", run, str(tmp_path / "y"), "--to", "diffusers", "--only", "fake_score"),
                   "exports net, ema or teacher")
    one_line_error(fastgen("convert-ckpt", run, str(tmp_path / "z"), "--to", "onnx"), "or diffusers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path / "runs"))
        toy = tiny_toy_config("toy_for_prompts", max_iter=2)
        Trainer(toy).run()
        toy_run = str(toy.log_config.save_path)
    one_line_error(fastgen("sample", toy_run, "--prompt", "x"), "has no model.pretrained_model_path")
    one_line_error(fastgen("convert-ckpt", toy_run, str(tmp_path / "toy"), "--to", "diffusers"),
                   "has no model.pretrained_model_path")
    assert not any(tmp_path.glob("y*")) and not (tmp_path / "toy").exists()


def test_samplers_no_diffusers_scheduler_reproduces_are_refused() -> None:
    """Off-grid discrete times and methods with their own sampling rule (MeanFlow, TCM) are refused in one line."""
    from types import SimpleNamespace

    from fastgen.networks.noise_schedules import (
        DiscreteVPScheduler,
        RectifiedFlowScheduler,
    )
    from fastgen.pipelines.schedulers import SamplingPlan, diffusers_sampling, plan_of
    from fastgen.utils.errors import UsageError

    for rule in ("meanflow", "truncated"):
        with pytest.raises(UsageError, match=f"its own rule \\({rule}\\)"):
            plan_of(SimpleNamespace(student_sampler=rule), "net")
    net = SimpleNamespace(noise_scheduler=DiscreteVPScheduler(), backbone=None)
    with pytest.raises(UsageError, match="not on the 1000-step grid"):
        diffusers_sampling("sd", SamplingPlan("renoise", (1.0, 0.6667)), net)
    with pytest.raises(UsageError, match="below t_max"):
        diffusers_sampling("sd", SamplingPlan("renoise", (0.5,)), net)
    shifted = RectifiedFlowScheduler(shift=5.0)
    grid = tuple(shifted.sampling_times(3).tolist()[:-1])
    with pytest.raises(UsageError, match="WanPipeline sets its times from num_inference_steps alone"):
        diffusers_sampling("wan", SamplingPlan("ode", grid), SimpleNamespace(noise_scheduler=shifted, backbone=None))
    sampling = diffusers_sampling("sd", SamplingPlan("renoise", (1.0, 0.75, 0.5, 0.25)), net)
    assert sampling.call["timesteps"] == [999, 749, 499, 249] and type(sampling.scheduler).__name__ == "LCMScheduler"


def test_cogvideox_noise_is_drawn_frame_major_as_its_pipeline_draws_it() -> None:
    """``CogVideoXPipeline.prepare_latents`` draws ``(F, C, h, w)`` per prompt generator, and LCM's re-noising of
    its frame-major latents the same: fastgen's ``(C, F, h, w)`` latents are those numbers transposed (3 channels,
    2 frames - a channel-major draw would differ)."""
    from diffusers import CogVideoXDDIMScheduler, CogVideoXPipeline
    from diffusers.utils.torch_utils import randn_tensor

    from fastgen.pipelines.noise import PipelineNoise, seeded

    pipe = CogVideoXPipeline(tokenizer=None, text_encoder=None, vae=None, transformer=None,
                             scheduler=CogVideoXDDIMScheduler())  # no VAE: spatial factor 8, temporal 4
    theirs = pipe.prepare_latents(2, 3, 5, 32, 32, torch.float32, "cpu", seeded([4, 7]))  # (2, F=2, C=3, 4, 4)
    noise = PipelineNoise("cogvideox", seeded([4, 7]), global_seed=4)
    ours = noise.initial((3, 2, 4, 4))
    assert torch.equal(ours, theirs.transpose(1, 2))
    generators = seeded([4, 7])
    pipe.prepare_latents(2, 3, 5, 32, 32, torch.float32, "cpu", generators)
    step_noise = randn_tensor(theirs.shape, generator=generators, device="cpu", dtype=torch.float32)  # LCM's step
    assert torch.equal(noise.randn_like(ours), step_noise.transpose(1, 2))


@pytest.mark.parametrize("family_run", ["sd"], indirect=True)
def test_wandb_logs_a_latent_models_samples_decoded(family_run: dict[str, Any], tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """W&B's sample grid of a latent model holds decoded RGB images (the VAE's 16x16), never the 1-channel 8x8
    latents; with no VAE beside the weights (the U-Net's own folder) it logs no samples and says why once."""
    from omegaconf import DictConfig

    from fastgen.configs.callbacks import WANDB_CALLBACK
    from fastgen.trainer import Trainer

    def run(name: str, weights: Path) -> Path:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path / "runs"))
            config = train_config("sd", weights, family_run["root"] / "shards", [1, 8, 8])
            config.trainer.callbacks = DictConfig({**WANDB_CALLBACK})
            config.trainer.callbacks.wandb.sample_iter = 2
            config.trainer.callbacks.wandb.num_samples = 4
            config.log_config.name = name
            config.log_config.wandb_mode = "disabled"
            Trainer(config).run()
            return Path(config.log_config.save_path)

    grid = run("decoded", family_run["weights"]) / "samples" / "iter_0000002.png"
    with Image.open(grid) as image:
        assert image.mode == "RGB"
        pixels = np.asarray(image)
    assert pixels.std() > 0 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 16  # not one grey latent channel
    caplog.clear()
    no_vae = run("no_vae", family_run["weights"] / "unet")
    assert not (no_vae / "samples").exists() or not any((no_vae / "samples").iterdir())
    assert sum("not logged: no VAE" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("family_run", ["sd"], indirect=True)
def test_batches_of_pixels_and_captions_are_encoded_on_the_fly(family_run: dict[str, Any], tmp_path: Path) -> None:
    """``model.encode_batches``: WebDataset shards of PNGs and captions train a latent model directly; each batch
    becomes the codec's latents and text condition (what encode-data would have written), captions kept."""
    import io

    from fastgen.configs.data import webdataset_loader
    from fastgen.datasets.webdataset import write_shards
    from fastgen.networks.codecs import load_codec
    from fastgen.trainer import Trainer

    rng = np.random.default_rng(2)

    def png(i: int) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(buffer, format="PNG")
        return buffer.getvalue()

    write_shards(({"__key__": f"{i:04d}", "png": png(i), "txt": CAPTIONS[i].encode()} for i in range(8)),
                 tmp_path / "raw", samples_per_shard=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTGEN_OUTPUT_ROOT", str(tmp_path / "runs"))
        config = train_config("sd", family_run["weights"], tmp_path / "raw", [1, 8, 8])
        config.model.encode_batches = True
        config.dataloader_train = webdataset_loader([f"WDS:{tmp_path / 'raw'}"], batch_size=4, shuffle_buffer=8,
                                                    fields={"real": "png", "condition": "txt"})
        config.log_config.name = "on_the_fly"
        trainer = Trainer(config)
        model = trainer.run()
    assert trainer.iteration == 2

    pixels = torch.rand(2, 3, 16, 16) * 2 - 1
    batch = model.encode_batch({"real": pixels, "condition": PROMPTS, "sample_ids": torch.arange(2)})
    codec = load_codec(family_run["weights"])
    torch.testing.assert_close(batch["real"], codec.encode_images(pixels))
    torch.testing.assert_close(batch["condition"], codec.encode_prompts(PROMPTS)["text"])
    assert batch["caption"] == PROMPTS
    latents = torch.randn(2, 1, 8, 8)
    assert model.encode_batch({"real": latents})["real"] is latents  # already latents: kept


ON_THE_FLY_RECIPE = '''
from fastgen.configs.data import webdataset_loader
from fastgen.configs.experiments.Digits.config_dmd2_digits import create_config as dmd2_digits
from fastgen.configs.net_diffusers import TINY_SD_UNET, sd_unet


def create_config():
    config = dmd2_digits()
    config.model.net = sd_unet(TINY_SD_UNET, num_prompts=1)
    config.model.num_classes = 1
    config.model.teacher_ckpt = None
    config.model.pretrained_model_path = {weights!r}
    config.model.input_shape = [1, 8, 8]
    config.model.encode_batches = True
    config.model.gan_loss_weight_gen = 0.0
    config.dataloader_train = webdataset_loader(["WDS:{shards}"], batch_size=2, shuffle_buffer=4,
                                                fields={{"real": "png", "condition": "txt"}})
    config.dataloader_val = None
    config.trainer.callbacks = {{}}
    config.log_config.name = "fsdp_on_the_fly"
    return config
'''


@pytest.mark.slow
@pytest.mark.parametrize("family_run", ["sd"], indirect=True)
def test_two_fsdp_ranks_encode_their_batches_with_a_sharded_codec(family_run: dict[str, Any], tmp_path: Path) -> None:
    """``model.encode_batches`` under FSDP2 on 2 gloo ranks: the codec's VAE and text encoder are sharded like a
    teacher and every rank encodes its own raw PNG + caption batch in every step."""
    import io

    from multirank import fastgen as launch

    from fastgen.datasets.webdataset import write_shards

    rng = np.random.default_rng(3)

    def png() -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(buffer, format="PNG")
        return buffer.getvalue()

    write_shards(({"__key__": f"{i:04d}", "png": png(), "txt": CAPTIONS[i].encode()} for i in range(8)),
                 tmp_path / "raw", samples_per_shard=2)
    recipe = tmp_path / "on_the_fly.py"
    recipe.write_text(ON_THE_FLY_RECIPE.format(weights=str(family_run["weights"]), shards=str(tmp_path / "raw")))
    result = launch("train", "--nproc-per-node", "2", "-c", str(recipe), "--eval-samples", "0", "-",
                    "trainer.fsdp=True", "trainer.max_iter=3", "trainer.save_ckpt_iter=3", "model.student_update_freq=2",
                    cwd=tmp_path, env={"WANDB_MODE": "disabled", "FASTGEN_OUTPUT_ROOT": str(tmp_path / "runs")},
                    timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the codec's VAE and text encoders are sharded with FSDP2" in result.stderr
    assert (tmp_path / "runs" / "fastgen" / "digits" / "fsdp_on_the_fly" / "checkpoints" / "0000003.dcp").is_dir()
