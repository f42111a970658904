"""``fastgen sample``: draw samples from a checkpoint; write them as an .npz (guided-diffusion convention) and a PNG,
or - with ``--prompt`` - text-to-image / text-to-video samples as PNG / MP4 files (LTX-2, Cosmos 3 with sound: MP4
with sound, WAV and an .npz), drawn as the model family's diffusers pipeline draws them (``fastgen.pipelines.prompts``)."""

from __future__ import annotations

from typing import Optional

import typer

from fastgen.cli.common import console, interactive, out, setup_logging

EPILOG = """\b
Examples:

\b
  # 100 samples from the newest checkpoint of a run (the trained network)
  fastgen sample FASTGEN_OUTPUT/fastgen/digits/config_sft_digits

\b
  # 1000 samples from the EMA network of one checkpoint, then score them
  fastgen sample runs/digits/checkpoints/0001000.pth --ema -n 1000 --out digits_ema.npz
  fastgen eval digits_ema.npz

\b
  # the newest checkpoint of a run kept in S3 (its config from --config; credentials from --credentials-dir/s3.json)
  fastgen sample s3://bucket/runs/fastgen/digits/dmd2 -c Digits/config_dmd2_digits --ema -o s3_student.npz

\b
  # 1000 videos of a causal video student (chunk by chunk), then per-frame FD, accuracy and temporal consistency
  fastgen sample FASTGEN_OUTPUT/fastgen/moving_digits/config_self_forcing_moving_digits --ema -n 1000 -o sf.npz
  fastgen eval sf.npz

\b
  # a distilled student's teacher with 18 Heun steps; only digit 7; on the GPU
  fastgen sample runs/dmd2_digits --teacher --steps 18 --label 7 --device cuda

\b
  # text to image: a distilled SD / Flux / Wan student from prompts (its codec from model.pretrained_model_path)
  fastgen sample runs/dmd2_sd15 --prompt "a red fox in the snow" --prompt "a lighthouse at dusk" --seed 7
  fastgen sample runs/dmd2_sd15 --prompt-file prompts.txt -n 4 --out fox_samples/

\b
  # its teacher, 25 ODE steps with guidance 5 against a negative prompt
  fastgen sample runs/dmd2_sd15 --teacher --steps 25 --guidance 5 --prompt "a red fox" --negative-prompt "blurry"

\b
  # text to video with sound: an LTX-2 run, video guided with 3 and audio with 7 (LTX2Pipeline's defaults)
  fastgen sample runs/sft_ltx2 --ema --steps 30 --guidance 3 --modality-guidance audio=7 --prompt "a dog barks"

\b
  # video to world: a Cosmos Predict2 Video2World fine-tune continues an image, 35 steps with guidance 8
  fastgen sample runs/sft_v2w --ema --steps 35 --guidance 8 --prompt "a robot arm stacks blocks" --image first.png

Writes OUT.npz (arr_0: uint8 NHWC images, uint8 (N, F, H, W, C) videos, or float32 (N, 2) points for toy data;
arr_1: labels of class-conditional models) and OUT.png (a grid of the first 100 images, one class per column, or a
scatter plot) - for videos OUT.gif and OUT.mp4 (the first 100 videos playing side by side).
Default OUT: RUN_DIR/samples/sample_<iteration>_<net>_n<N>_seed<S>. The same --seed gives the same samples.

With --prompt / --prompt-file: OUT is a folder (default RUN_DIR/samples/prompts_<iteration>_<net>_seed<S>) of
NNNN.png (NNNN.mp4 for videos) and samples.json (file, prompt, seed). Sample i starts from the noise the family's
diffusers pipeline draws for generator=torch.Generator().manual_seed(SEED + i); -n N: N samples per prompt. A
pipeline exported with `fastgen convert-ckpt RUN OUT --to diffusers` renders the same files. A video-and-audio model
(LTX-2, Cosmos 3 with sound) writes NNNN.mp4 with its sound track, NNNN.wav and samples.npz (arr_0 the uint8
videos, audio the sampled audio latents, waveform the sound, sample_rate).
"""


def sample(
    checkpoint: str = typer.Argument(..., metavar="CKPT", help="A checkpoint .pth, a checkpoints folder or a run directory (newest valid checkpoint), local or s3://; a run directory whose checkpoints are in S3 works as any other."),
    num_samples: Optional[int] = typer.Option(None, "-n", "--num-samples", help="How many samples (default 100; with --prompt: per prompt, default 1).", show_default=False),
    seed: int = typer.Option(0, "--seed", help="Seed of the starting noise (sample i uses its own stream)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Samples per forward batch (default 256; with --prompt 8).", show_default=False),
    steps: Optional[int] = typer.Option(None, "--steps", help="Sampling steps (default: the method's own).", show_default=False),
    ema: bool = typer.Option(False, "--ema", help="Sample the first EMA network instead of the trained one."),
    teacher: bool = typer.Option(False, "--teacher", help="Sample the method's teacher (distillation methods)."),
    label: Optional[int] = typer.Option(None, "--label", help="Class-conditional models: only this class (default: balanced).", show_default=False),
    out_path: Optional[str] = typer.Option(None, "--out", "-o", help="Output .npz path (the PNG goes next to it).", show_default=False),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Config to build the model (default: the run's config.yaml).", show_default=False),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    prompt: Optional[list[str]] = typer.Option(None, "--prompt", "-p", help="Text-to-image / video: a prompt (repeat for more).", show_default=False),
    prompt_file: Optional[str] = typer.Option(None, "--prompt-file", help="Text-to-image / video: a file of prompts, one per line.", show_default=False),
    negative_prompt: str = typer.Option("", "--negative-prompt", help="With --guidance: the prompt guided away from."),
    guidance: Optional[float] = typer.Option(None, "--guidance", help="Classifier-free guidance scale of --teacher / an SFT model (default: the run's model.guidance_scale).", show_default=False),
    modality_guidance: Optional[list[str]] = typer.Option(None, "--modality-guidance", metavar="MODALITY=SCALE", help="A multimodal model's guidance of one modality where it differs from --guidance, e.g. audio=7 (repeat for more; default: the run's model.modality_guidance_scales).", show_default=False),
    image: Optional[str] = typer.Option(None, "--image", help="Video-to-world: an image every sample continues (its first frame), resized to the model's size.", show_default=False),
    video: Optional[str] = typer.Option(None, "--video", help="Video-to-world: a clip (MP4, GIF) every sample continues from its frames.", show_default=False),
    weights: Optional[str] = typer.Option(None, "--weights", help="The diffusers pipeline folder of the VAE and text encoders (default: the run's model.pretrained_model_path).", show_default=False),
    credentials_dir: Optional[str] = typer.Option(None, "--credentials-dir", help="Folder whose s3.json holds S3 credentials (default: the run's credentials_dir, else AWS_* variables).", show_default=False),
    log_level: str = typer.Option("WARNING", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Draw samples from a checkpoint: an .npz for `fastgen eval` and a PNG grid."""
    from fastgen.utils.errors import UsageError

    setup_logging(log_level)
    if ema and teacher:
        raise UsageError("--ema and --teacher exclude each other")
    prompts = _read_prompts(prompt, prompt_file)
    if num_samples is None:
        num_samples = 1 if prompts else 100
    if batch_size is None:
        batch_size = 8 if prompts else 256
    if num_samples <= 0 or batch_size <= 0:
        raise UsageError("--num-samples and --batch-size must be positive")
    if not prompts and (guidance is not None or negative_prompt or weights or modality_guidance):
        raise UsageError("--guidance, --modality-guidance, --negative-prompt and --weights go with --prompt / "
                         "--prompt-file")
    per_modality = _modality_guidance(modality_guidance)
    from pathlib import Path

    if image is not None and video is not None:
        raise UsageError("--image and --video exclude each other: a sample continues one of them")
    clip_path = image or video
    if clip_path is not None and not prompts:
        raise UsageError("--image / --video go with --prompt / --prompt-file (video-to-world from text and a clip)")
    if clip_path is not None and not Path(clip_path).expanduser().is_file():
        raise UsageError(f"--{'image' if image else 'video'} {clip_path}: no such file")
    if prompts and label is not None:
        raise UsageError("--label is for class-conditional models; with --prompt the prompt conditions")
    if steps is not None and steps <= 0:
        raise UsageError("--steps must be positive")
    if seed < 0:
        raise UsageError("--seed must be >= 0")
    import time

    from fastgen.utils.io import check_writable_dir

    if out_path is not None:  # before the run is loaded: a bad --out fails now
        chosen = Path(out_path).expanduser()
        if not prompts and chosen.is_dir():
            raise UsageError(f"--out {out_path} is a folder: name the .npz to write, e.g. {chosen / 'samples.npz'}")
        check_writable_dir(chosen if prompts else chosen.parent, what="the folder of --out",
                           hint="Choose another --out path.")
    from fastgen.evaluation.sampling import (
        dataset_of_config,
        draw_samples,
        load_run,
        resolve_device,
        save_samples,
        select_net,
    )

    run = load_run(checkpoint, config=config, device=resolve_device(device), credentials_dir=credentials_dir)
    which = "teacher" if teacher else "ema" if ema else "net"
    net = select_net(run, which)
    if prompts:
        _sample_prompts(run, net, which, prompts, num_samples, seed, batch_size, steps, guidance, negative_prompt,
                        weights, out_path, per_modality, clip_path)
        return
    if out_path is None:
        stem = f"sample_{run.iteration:07d}_{which}{f'_steps{steps}' if steps else ''}_n{num_samples}_seed{seed}"
        target = run.run_dir / "samples" / f"{stem}.npz"
    else:
        target = Path(out_path).expanduser()
    check_writable_dir(target.parent, what="the samples folder", hint="Pass --out to write elsewhere.")

    start = time.perf_counter()
    if interactive():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        with Progress(TextColumn("[bold]sample"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("ETA"), TimeRemainingColumn(), console=console()) as progress:
            task = progress.add_task("sample", total=num_samples)
            samples, labels = draw_samples(run.model, num_samples, seed=seed, batch_size=batch_size, net=net,
                                           steps=steps, label=label,
                                           progress=lambda k: progress.advance(task, k))
    else:
        samples, labels = draw_samples(run.model, num_samples, seed=seed, batch_size=batch_size, net=net,
                                       steps=steps, label=label)
    elapsed = time.perf_counter() - start
    npz, previews = save_samples(target, samples, labels, dataset=dataset_of_config(run.config))

    from rich.markup import escape

    c = out()
    c.print(f"[bold green]sampled[/bold green] {num_samples} from {which} of {escape(str(run.checkpoint))} "
            f"(iteration {run.iteration}, {elapsed:.1f} s)", soft_wrap=True)
    c.print(f"  npz  {escape(str(npz))}", soft_wrap=True)
    for preview in previews:
        c.print(f"  {preview.suffix[1:]:<3}  {escape(str(preview))}", soft_wrap=True)


def _read_prompts(prompt: Optional[list[str]], prompt_file: Optional[str]) -> list[str]:
    from fastgen.utils.errors import UsageError

    prompts = list(prompt or [])
    if prompt_file is not None:
        from pathlib import Path

        try:
            text = Path(prompt_file).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--prompt-file {prompt_file}: {exc.strerror if isinstance(exc, OSError) else exc}") from None
        prompts += [line.strip() for line in text.splitlines() if line.strip()]
        if not prompts:
            raise UsageError(f"--prompt-file {prompt_file} holds no prompt")
    return prompts


def _modality_guidance(entries: Optional[list[str]]) -> dict[str, float]:
    """``--modality-guidance audio=7 ...`` as ``{"audio": 7.0}``."""
    from fastgen.utils.errors import UsageError

    scales: dict[str, float] = {}
    for entry in entries or []:
        name, sep, value = entry.partition("=")
        try:
            scale = float(value)
        except ValueError:
            scale = None
        if not sep or not name.strip() or scale is None:
            raise UsageError(f"--modality-guidance {entry}: expected MODALITY=SCALE, e.g. audio=7")
        scales[name.strip()] = scale
    return scales


def _sample_prompts(run, net, which: str, prompts: list[str], per_prompt: int, seed: int, batch_size: int,  # noqa: ANN001
                    steps: Optional[int], guidance: Optional[float], negative_prompt: str, weights: Optional[str],
                    out_path: Optional[str], modality_guidance: Optional[dict[str, float]] = None,
                    clip_path: Optional[str] = None) -> None:
    """``--prompt`` mode: encode, sample as the family's pipeline does, decode, write PNG / MP4 files (a video and
    audio model: MP4 with sound, WAV, samples.npz)."""
    import time
    from pathlib import Path

    from fastgen.networks.codecs import codec_family, codec_options, load_codec
    from fastgen.pipelines.noise import MODALITY_ORDER
    from fastgen.pipelines.prompts import PromptSampler, write_prompt_samples
    from fastgen.utils.errors import UsageError
    from fastgen.utils.io import check_writable_dir

    folder = weights or run.config.model.pretrained_model_path
    if not folder:
        raise UsageError("--prompt needs the model's diffusers pipeline folder (its VAE and text encoders): the run "
                         "has no model.pretrained_model_path; pass --weights DIR")
    shapes = getattr(run.config.model, "modality_shapes", None)
    family = codec_family(folder)
    if shapes and family not in MODALITY_ORDER:
        raise UsageError(f"--prompt samples multimodal runs of {', '.join(MODALITY_ORDER)}; this run is multimodal "
                         f"(model.modality_shapes {sorted(shapes)}) with a {family} pipeline, whose drawing of "
                         "every modality fastgen does not reproduce: sample it without --prompt")
    # LTX2Pipeline always samples both streams; Cosmos3OmniPipeline video alone unless enable_sound=True
    if not shapes and family == "ltx2":
        raise UsageError(f"a {family} pipeline samples {' and '.join(MODALITY_ORDER[family])} together; this run "
                         "has no model.modality_shapes")
    device = next(net.parameters()).device
    codec = load_codec(folder, **codec_options(net)).to(device)
    sampler = PromptSampler(run.model, net, which, codec, steps=steps, guidance=guidance,
                            negative_prompt=negative_prompt, modality_guidance=modality_guidance)
    expanded = [p for p in prompts for _ in range(per_prompt)]
    seeds = [seed + i for i in range(len(expanded))]
    target = (Path(out_path).expanduser() if out_path is not None
              else run.run_dir / "samples" / f"prompts_{run.iteration:07d}_{which}_seed{seed}")
    check_writable_dir(target, what="the samples folder", hint="Pass --out to write elsewhere.")
    latent_shape = ({name: list(shape) for name, shape in shapes.items()} if shapes
                    else list(run.config.model.input_shape))
    clip = None
    if clip_path is not None:  # video-to-world: resized to the samples' pixel size as the pipeline resizes it
        from fastgen.pipelines.world import load_clip, spatial_factor

        if len(latent_shape) != 4:
            raise UsageError(f"--image / --video continue a video; this model samples {latent_shape}")
        factor = spatial_factor(codec.vae)
        clip = load_clip(clip_path, int(latent_shape[2]) * factor, int(latent_shape[3]) * factor,
                         getattr(codec, "conditioning_image", None))
    start = time.perf_counter()
    if interactive():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("[bold]sample"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console()) as progress:
            task = progress.add_task("sample", total=len(expanded))
            records = write_prompt_samples(sampler, expanded, seeds, target, latent_shape, batch_size,
                                           progress=lambda k: progress.advance(task, k), clip=clip)
    else:
        records = write_prompt_samples(sampler, expanded, seeds, target, latent_shape, batch_size, clip=clip)
    elapsed = time.perf_counter() - start

    from rich.markup import escape

    c = out()
    c.print(f"[bold green]sampled[/bold green] {len(records)} from {which} of {escape(str(run.checkpoint))} "
            f"(iteration {run.iteration}, {codec.family}, {elapsed:.1f} s)", soft_wrap=True)
    extra = ", .wav, samples.npz" if "audio" in records[0] else ""
    c.print(f"  files  {escape(str(target))} ({records[0]['file']} .. {records[-1]['file']}{extra}, samples.json)",
            soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("sample", epilog=EPILOG)(sample)
