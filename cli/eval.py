"""``fastgen eval``: score samples (.npz from ``fastgen sample``) against their data set, or text-to-image samples
(a ``fastgen sample --prompt`` folder: FID and CLIP score); a table and JSON."""

from __future__ import annotations

from typing import Optional

import typer

from fastgen.cli.common import console, interactive, out, setup_logging

EPILOG = """\b
Examples:

\b
  # digits: FD in the shipped digits classifier's features, and its accuracy on the labels
  fastgen sample runs/digits --ema -n 1000 --out digits.npz
  fastgen eval digits.npz --json digits_metrics.json

\b
  # 2-D toy points: energy distance and sliced Wasserstein to fresh samples of the distribution
  fastgen eval toy_samples.npz --dataset toy:checkerboard

\b
  # CIFAR-10 FID with local InceptionV3 weights (pytorch-fid's file) and reference statistics
  fastgen eval samples/ --dataset cifar10 --inception-weights pt_inception-2015-12-05-6726825d.pth \\
      --ref-stats cifar10_train_stats.npz

\b
  # text to image: a `fastgen sample --prompt-file` folder, FID against real images and CLIP score
  fastgen sample runs/dmd2_sd15 --ema --prompt-file coco_prompts.txt --out t2i_samples/
  fastgen eval t2i_samples/ --ref-stats coco_val_images/ --inception-weights pt_inception.pth \\
      --clip-model /weights/clip-vit-large-patch14

\b
Metrics: digits fd_digits (+ accuracy), moving_digits fd_per_frame, temporal_consistency (+ accuracy,
averaged over frames), audio_video_digits those and spectral_fd, av_sync (+ pitch_accuracy), toy energy_distance + sliced_wasserstein (SW_1, 256 projections), cifar10/imagenet fid, text-to-image fid and / or clip_score (100 * the cosine of CLIP's image and text
embeddings, at least 0, averaged; --clip-model: a local transformers CLIP folder). The data set is read
from the file (fastgen sample records it) or from the shape; --dataset overrides. --inception-weights defaults to $FASTGEN_INCEPTION_WEIGHTS. Nothing is downloaded.
"""


def eval_samples(
    samples: str = typer.Argument(..., metavar="SAMPLES", help="An .npz of samples (arr_0, optional arr_1), a folder of them, a run directory (its samples/), or a `sample --prompt` folder."),
    dataset: Optional[str] = typer.Option(None, "--dataset", "-d", help="digits, moving_digits, audio_video_digits, toy:<name>, cifar10 or imagenet (default: detected).", show_default=False),
    inception_weights: Optional[str] = typer.Option(None, "--inception-weights", help="FID InceptionV3 state dict (default: $FASTGEN_INCEPTION_WEIGHTS).", show_default=False),
    ref_stats: Optional[str] = typer.Option(None, "--ref-stats", help="FID reference: .npz with mu/sigma, .npz of images, or an image folder.", show_default=False),
    clip_model: Optional[str] = typer.Option(None, "--clip-model", help="Text-to-image: a local transformers CLIP folder for the CLIP score.", show_default=False),
    seed: int = typer.Option(12345, "--seed", help="Toy data: seed of the reference points and projections."),
    batch_size: int = typer.Option(64, "--batch-size", help="Images per Inception batch (FID)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N (FID)."),
    json_path: Optional[str] = typer.Option(None, "--json", help="Also write the metrics as JSON to this path.", show_default=False),
    log_level: str = typer.Option("WARNING", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Score samples: FD (digits; per frame for moving digits), energy / sliced Wasserstein distance (toy), FID (CIFAR-10, ImageNet)."""
    from fastgen.utils.errors import UsageError

    setup_logging(log_level)
    if batch_size <= 0:
        raise UsageError("--batch-size must be positive")
    import json
    import time
    from pathlib import Path

    if json_path is not None:
        _check_json_path(json_path)  # before any work: a bad --json fails now, not after the metrics

    from fastgen.evaluation.text_to_image import is_prompt_samples

    if is_prompt_samples(samples):
        _eval_prompt_samples(samples, ref_stats, inception_weights, clip_model, batch_size, device, json_path)
        return
    if clip_model is not None:
        raise UsageError("--clip-model scores text-to-image samples: give a `fastgen sample --prompt` folder")
    from fastgen.evaluation.evaluate import detect_dataset, evaluate_arrays, load_sample_files

    loaded = load_sample_files(samples)
    name = detect_dataset(loaded.arr_0, hint=dataset, recorded=loaded.dataset)
    resolved_device = "cpu"
    if name in ("cifar10", "imagenet"):
        from fastgen.evaluation.sampling import resolve_device

        resolved_device = str(resolve_device(device))

    start = time.perf_counter()
    if interactive() and name in ("cifar10", "imagenet"):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("[bold]inception"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console()) as progress:
            task = progress.add_task("inception", total=len(loaded.arr_0))
            metrics = evaluate_arrays(loaded.arr_0, loaded.arr_1, name, seed=seed, inception_weights=inception_weights,
                                      ref_stats=ref_stats, batch_size=batch_size, device=resolved_device,
                                      progress=lambda k: progress.advance(task, k))
    else:
        metrics = evaluate_arrays(loaded.arr_0, loaded.arr_1, name, seed=seed, inception_weights=inception_weights,
                                  ref_stats=ref_stats, batch_size=batch_size, device=resolved_device,
                                  audio=loaded.audio)
    elapsed = time.perf_counter() - start

    report = {"samples": [str(f) for f in loaded.files], "metrics": metrics, "seconds": round(elapsed, 3)}
    _table(report)
    if json_path is not None:
        from fastgen.utils.io import atomic_write_text

        atomic_write_text(Path(json_path).expanduser(), json.dumps(report, indent=2) + "\n")


def _eval_prompt_samples(folder: str, ref_stats: Optional[str], inception_weights: Optional[str],
                         clip_model: Optional[str], batch_size: int, device: str, json_path: Optional[str]) -> None:
    import json
    import time
    from pathlib import Path

    from fastgen.evaluation.sampling import resolve_device
    from fastgen.evaluation.text_to_image import SAMPLES_FILE, evaluate_prompt_samples

    start = time.perf_counter()
    metrics = evaluate_prompt_samples(folder, ref_stats=ref_stats, inception_weights=inception_weights,
                                      clip_model=clip_model, batch_size=batch_size, device=str(resolve_device(device)))
    report = {"samples": [str(Path(folder).expanduser() / SAMPLES_FILE)], "metrics": metrics,
              "seconds": round(time.perf_counter() - start, 3)}
    _table(report)
    if json_path is not None:
        from fastgen.utils.io import atomic_write_text

        atomic_write_text(Path(json_path).expanduser(), json.dumps(report, indent=2) + "\n")


def _table(report: dict) -> None:
    from pathlib import Path

    from rich.markup import escape
    from rich.table import Table

    metrics = report["metrics"]
    files = report["samples"]
    title = files[0] if len(files) == 1 else f"{len(files)} files in {Path(files[0]).parent}"
    out().print(f"[bold]samples[/bold] {escape(title)}", soft_wrap=True)
    table = Table(show_edge=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        text = f"{value:.6g}" if isinstance(value, float) else str(value)
        table.add_row(escape(key), escape(text))
    out().print(table)


def register(app: typer.Typer) -> None:
    app.command("eval", epilog=EPILOG)(eval_samples)


def _check_json_path(json_path: str) -> None:
    """``--json`` names a file whose folder can be written (a folder or a path under a file is refused)."""
    from pathlib import Path

    from fastgen.utils.errors import UsageError
    from fastgen.utils.io import check_writable_dir

    target = Path(json_path).expanduser()
    if target.is_dir():
        raise UsageError(f"--json {json_path} is a folder: name the file to write, e.g. {target / 'metrics.json'}")
    check_writable_dir(target.resolve().parent, what="the folder of --json", hint="Choose another --json path.")
