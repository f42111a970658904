"""``fastgen sample``: draw samples from a checkpoint; write them as an .npz (guided-diffusion convention) and a PNG."""

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
  # a distilled student's teacher with 18 Heun steps; only digit 7; on the GPU
  fastgen sample runs/dmd2_digits --teacher --steps 18 --label 7 --device cuda

Writes OUT.npz (arr_0: uint8 NHWC images, or float32 (N, 2) points for toy data; arr_1: labels of
class-conditional models) and OUT.png (a grid of the first 100 images, one class per column, or a scatter plot).
Default OUT: RUN_DIR/samples/sample_<iteration>_<net>_n<N>_seed<S>. The same --seed gives the same samples.
"""


def sample(
    checkpoint: str = typer.Argument(..., metavar="CKPT", help="A checkpoint .pth, a checkpoints folder or a run directory (newest valid checkpoint), local or s3://; a run directory whose checkpoints are in S3 works as any other."),
    num_samples: int = typer.Option(100, "-n", "--num-samples", help="How many samples."),
    seed: int = typer.Option(0, "--seed", help="Seed of the starting noise (sample i uses its own stream)."),
    batch_size: int = typer.Option(256, "--batch-size", help="Samples per forward batch."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Sampling steps (default: the method's own).", show_default=False),
    ema: bool = typer.Option(False, "--ema", help="Sample the first EMA network instead of the trained one."),
    teacher: bool = typer.Option(False, "--teacher", help="Sample the method's teacher (distillation methods)."),
    label: Optional[int] = typer.Option(None, "--label", help="Class-conditional models: only this class (default: balanced).", show_default=False),
    out_path: Optional[str] = typer.Option(None, "--out", "-o", help="Output .npz path (the PNG goes next to it).", show_default=False),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Config to build the model (default: the run's config.yaml).", show_default=False),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    credentials_dir: Optional[str] = typer.Option(None, "--credentials-dir", help="Folder whose s3.json holds S3 credentials (default: the run's credentials_dir, else AWS_* variables).", show_default=False),
    log_level: str = typer.Option("WARNING", "--log_level", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Draw samples from a checkpoint: an .npz for `fastgen eval` and a PNG grid."""
    from fastgen.utils.errors import UsageError

    setup_logging(log_level)
    if ema and teacher:
        raise UsageError("--ema and --teacher exclude each other")
    if num_samples <= 0 or batch_size <= 0:
        raise UsageError("--num-samples and --batch-size must be positive")
    if steps is not None and steps <= 0:
        raise UsageError("--steps must be positive")
    if seed < 0:
        raise UsageError("--seed must be >= 0")
    import time
    from pathlib import Path

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
    if out_path is None:
        stem = f"sample_{run.iteration:07d}_{which}{f'_steps{steps}' if steps else ''}_n{num_samples}_seed{seed}"
        target = run.run_dir / "samples" / f"{stem}.npz"
    else:
        target = Path(out_path).expanduser()
    from fastgen.utils.io import check_writable_dir

    check_writable_dir(target.parent)

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
    npz, png = save_samples(target, samples, labels, dataset=dataset_of_config(run.config))

    from rich.markup import escape

    c = out()
    c.print(f"[bold green]sampled[/bold green] {num_samples} from {which} of {escape(str(run.checkpoint))} "
            f"(iteration {run.iteration}, {elapsed:.1f} s)", soft_wrap=True)
    c.print(f"  npz  {escape(str(npz))}", soft_wrap=True)
    c.print(f"  png  {escape(str(png))}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("sample", epilog=EPILOG)(sample)
