"""LTX-2 trains (``LTX2/config_sft_ltx2_av_digits``: a tiny ``LTX2VideoTransformer3DModel`` on the audio-visual
digits, both streams at once): SFT and then DMD2 two iterations each on the CPU under the real trainer, DMD2's
teacher read from a diffusers folder of the SFT network; and SFT on 2 gloo ranks under FSDP2 after a meta-device
build, the weights from the folder, with activation checkpointing - through the real launcher."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fastgen_testing import two_iterations

RECIPE = "LTX2/config_sft_ltx2_av_digits"


def _config(method: str, name: str) -> Any:
    from fastgen.configs.config_utils import load_config

    config = load_config(RECIPE)
    if method == "dmd2":
        from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config

        sft = config
        config = dmd2_config()
        for key in ("net", "modality_shapes", "modality_times", "num_classes", "sample_steps"):
            setattr(config.model, key, getattr(sft.model, key))
        config.dataloader_train = sft.dataloader_train
        config.model.teacher_ckpt = None
        config.model.t_list = [1.0, 0.5]
        config.model.student_update_freq = 2
        config.model.guidance_scale = 2.0
        config.log_config.group = sft.log_config.group
    config.dataloader_train.batch_size = 4
    return two_iterations(config, name)


def _moved(trained: torch.nn.Module, start: dict[str, torch.Tensor]) -> list[str]:
    return [k for k, v in trained.state_dict().items() if k in start and not torch.equal(v, start[k])]


def test_sft_then_dmd2_train_two_iterations(output_root: Path, tmp_path: Path) -> None:
    """SFT moves the network's weights in 2 iterations (per-modality losses logged); DMD2's teacher is then exactly
    the SFT network saved as a diffusers folder (``model.pretrained_model_path``), and its student and fake score
    both train (one student and one critic iteration)."""
    from fastgen.configs.instantiate import instantiate
    from fastgen.trainer import Trainer

    config = _config("sft", "ltx2_sft")
    torch.manual_seed(0)
    start = instantiate(config.model.net).state_dict()
    trainer = Trainer(config)
    sft = trainer.run()
    assert trainer.iteration == 2
    assert _moved(sft.net, start), "SFT changed no weight"
    folder = tmp_path / "pipeline"
    sft.net.backbone.model.save_pretrained(folder / "transformer")

    config = _config("dmd2", "ltx2_dmd2")
    config.model.pretrained_model_path = str(folder)
    dmd2 = Trainer(config).run()
    saved = sft.net.backbone.model.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in dmd2.teacher.backbone.model.state_dict().items())
    for name in ("net", "fake_score"):
        assert _moved(getattr(dmd2, name).backbone.model, saved), name
    samples, _ = dmd2.sample(2, generator=torch.Generator().manual_seed(0))
    assert {n: list(v.shape[1:]) for n, v in samples.items()} == {"video": [1, 8, 8, 16], "audio": [1, 8, 16]}
    assert (output_root / "fastgen" / "audio_video_digits" / "ltx2_dmd2" / "checkpoints" / "0000002.pth").is_file()


def test_activation_checkpointing_trains_the_same_weights() -> None:
    """Every LTX-2 block recomputes its activations in backward (both streams' outputs and the cross-modal
    attention): 2 SFT iterations end with exactly the weights of the run without it."""
    from fastgen.trainer import Trainer

    runs = []
    for checkpointed in (False, True):
        config = _config("sft", f"ltx2_checkpointed_{checkpointed}")
        config.model.activation_checkpointing = checkpointed
        runs.append(Trainer(config).run())
    plain, checkpointed_run = (run.net.state_dict() for run in runs)
    assert all(torch.equal(checkpointed_run[k], v) for k, v in plain.items())
    units = runs[1].net.shard_units()
    blocks = runs[1].net.backbone.model.config.num_layers
    assert len(units) == blocks and all(getattr(unit, "_fastgen_checkpointed", False) for unit in units)


@pytest.mark.slow
def test_two_fsdp_ranks_train_ltx2_after_a_meta_build(output_root: Path, tmp_path: Path) -> None:
    """SFT on 2 ranks: every rank builds LTX-2 on the meta device, shards its blocks with FSDP2, rank 0 reads the
    diffusers folder and broadcasts; activation checkpointing on every block. The final checkpoint's network has
    the folder's keys and moved from its weights."""
    from multirank import fastgen
    from safetensors.torch import load_file

    from fastgen.checkpoint.checkpointer import load_checkpoint
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.instantiate import instantiate

    torch.manual_seed(3)
    source = instantiate(load_config(RECIPE).model.net).backbone.model
    source.save_pretrained(tmp_path / "pipeline" / "transformer")
    result = fastgen("train", "--nproc-per-node", "2", "--config", RECIPE, "--eval-samples", "0", "-",
                     "trainer.fsdp=True", "model.meta_init=True", "model.activation_checkpointing=True",
                     f"model.pretrained_model_path={tmp_path / 'pipeline'}", "trainer.max_iter=2",
                     "trainer.save_ckpt_iter=2", "dataloader_train.batch_size=4", "trainer.callbacks={}",
                     "log_config.name=ltx2_fsdp", cwd=tmp_path, env={"WANDB_MODE": "disabled"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "loaded the pretrained weights" in result.stderr and "2 rank(s)" in result.stderr
    saved = load_file(str(tmp_path / "pipeline" / "transformer" / "diffusion_pytorch_model.safetensors"))
    payload = load_checkpoint(str(output_root / "fastgen" / "audio_video_digits" / "ltx2_fsdp" / "checkpoints"
                                  / "0000002.pth"))
    net = {k.removeprefix("backbone.model."): v for k, v in payload["model"]["net"].items()
           if k.startswith("backbone.model.")}
    assert net.keys() == saved.keys()
    assert any(not torch.equal(net[k], saved[k]) for k in saved)


def test_encoded_shards_train_and_the_export_samples_in_diffusers(output_root: Path, tmp_path: Path) -> None:
    """The codec of a tiny LTX2Pipeline folder encodes clips, spectrograms and captions into WebDataset shards
    (``real.video`` / ``real.audio`` fields nest into one multimodal sample); SFT trains the folder's network on them
    for 2 iterations; ``export_diffusers`` writes a pipeline folder that diffusers' ``LTX2Pipeline`` loads and
    samples - with the call arguments it records - exactly as fastgen's ODE samples the run's network (video and
    audio latents to 1e-4), its transformer the run's weights; ``fastgen sample RUN --prompt`` writes an MP4 with
    its sound track, a WAV and samples.npz, and bad ``--modality-guidance`` values are one-line errors."""
    from diffusers import LTX2Pipeline
    from tiny_ltx2 import FRAME_RATE, FRAMES, MAX_SEQUENCE_LENGTH, PIXELS, random_clip_shards, saved_tiny_pipeline

    from fastgen.checkpoint.run import load_run, select_net
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.data import webdataset_loader
    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.export import export_diffusers
    from fastgen.pipelines.noise import seeded
    from fastgen.pipelines.prompts import ode_sample
    from fastgen.pipelines.schedulers import plan_of
    from fastgen.trainer import Trainer

    folder = tmp_path / "pipeline"
    net_config = saved_tiny_pipeline(folder)
    codec = load_codec(folder, max_sequence_length=MAX_SEQUENCE_LENGTH)
    captions = ["a cat", "a dog", "the sea", "two birds", "a red fox", "rain", "one fish", "a tree"]
    shapes = random_clip_shards(codec, captions, tmp_path / "shards")

    config = load_config(RECIPE)
    config.model.net = net_config
    config.model.modality_shapes = shapes
    config.model.num_classes = 1  # text embeddings from the data pass through
    config.model.use_ema = False
    config.model.sample_steps = 3
    config.model.pretrained_model_path = str(folder)
    config.dataloader_train = webdataset_loader([f"WDS:{tmp_path / 'shards'}"], batch_size=4, shuffle_buffer=8, fields={
        "real.video": "latent.npy", "real.audio": "audio_latent.npy", "condition": "text.npy"})
    two_iterations(config, "ltx2_shards")
    Trainer(config).run()
    run_dir = output_root / "fastgen" / "audio_video_digits" / "ltx2_shards"

    info = export_diffusers(str(run_dir), str(tmp_path / "export"), steps=3, guidance=2.0)
    assert info["family"] == "ltx2" and info["sampler"] == "ode" and info["call"]["audio_guidance_scale"] == 2.0
    pipe = LTX2Pipeline.from_pretrained(tmp_path / "export")
    pipe.set_progress_bar_config(disable=True)
    prompts = ["a red cat", "two dogs"]
    theirs = pipe(prompts, generator=seeded([7, 8]), height=PIXELS, width=PIXELS, num_frames=FRAMES,
                  frame_rate=FRAME_RATE, max_sequence_length=MAX_SEQUENCE_LENGTH, output_type="latent",
                  return_dict=False, negative_prompt="", **info["call"])

    run = load_run(str(run_dir))
    net = select_net(run, "net")
    trained = net.backbone.model.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in pipe.transformer.state_dict().items())
    generators = seeded([7, 8])
    noise = {name: torch.cat([torch.randn((1, *shape), generator=gen) for gen in generators])
             for name, shape in config.model.modality_shapes.items()}
    plan = plan_of(run.model, "net", 3, 2.0)
    with torch.no_grad():
        ours = ode_sample(net, noise, codec.condition(codec.encode_prompts(prompts)),
                          codec.condition(codec.encode_negative(["", ""])), plan)
    torch.testing.assert_close(codec.denormalise(ours["video"]), theirs[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(codec.denormalise_audio(ours["audio"]), theirs[1], atol=1e-4, rtol=0)
    from fastgen.pipelines.schedulers import SamplingPlan, diffusers_sampling
    from fastgen.utils.errors import UsageError

    with pytest.raises(UsageError, match="re-noising"):
        diffusers_sampling("ltx2", SamplingPlan("renoise", (1.0, 0.5)), net)
    from fastgen_testing import run_in_process

    # fastgen sample --prompt on the run: an MP4 with its sound track, a WAV and samples.npz per sample
    from fastgen.pipelines.media import read_mp4, read_mp4_audio

    out = tmp_path / "samples"
    sampled = run_in_process("sample", str(run_dir), "--prompt", "a digit", "--steps", "2", "--guidance", "2",
                             "--modality-guidance", "audio=4", "--seed", "3", "--out", str(out))
    assert sampled.returncode == 0, sampled.stderr
    assert "0000.mp4" in sampled.stdout and "samples.npz" in sampled.stdout
    assert sorted(p.name for p in out.iterdir()) == ["0000.mp4", "0000.wav", "samples.json", "samples.npz"]
    assert read_mp4(out / "0000.mp4").shape == (FRAMES, PIXELS, PIXELS, 3)
    sound, rate = read_mp4_audio(out / "0000.mp4")
    assert rate == 16000 and sound.shape[0] == 2 and sound.shape[1] > 0
    import wave

    with wave.open(str(out / "0000.wav"), "rb") as wav:
        assert wav.getnchannels() == 2 and wav.getframerate() == 16000 and wav.getnframes() > 0
    for bad, fragment in ((["--modality-guidance", "audio"], "MODALITY=SCALE"),
                          (["--modality-guidance", "sound=3"], "not modalities of this model")):
        refused = run_in_process("sample", str(run_dir), "--prompt", "a cat", *bad, "--out", str(tmp_path / "x"))
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert refused.returncode == 2 and len(lines) == 1 and fragment in lines[0], refused.stderr
