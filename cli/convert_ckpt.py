"""``fastgen convert-ckpt``: convert a checkpoint between .pth, sharded DCP and safetensors, extract one network, or
export a run as a diffusers pipeline folder (``--to diffusers``, ``fastgen.pipelines.export``)."""

from __future__ import annotations

from typing import Optional

import typer
from fastgen.cli.common import console, interactive, out, setup_logging

EPILOG = """\b
Examples:

\b
  # a 2-rank FSDP run's newest (sharded) checkpoint as one .pth file
  fastgen convert-ckpt FASTGEN_OUTPUT/fastgen/toy/config_sft_toy full.pth

\b
  # the EMA network as a distillation teacher (what model.teacher_ckpt and
  # trainer.checkpointer.pretrained_ckpt_path take), in bfloat16
  fastgen convert-ckpt runs/teacher/checkpoints/0390625.pth teacher.pth --only ema --dtype bfloat16

\b
  # a monolithic checkpoint as a sharded one (a .dcp folder plus its .pth marker)
  fastgen convert-ckpt runs/teacher/checkpoints/0004000.pth converted.dcp

\b
  # a LoRA run (model.net_adapter): adapter folded into the base, the EMA network as a plain teacher file
  fastgen convert-ckpt runs/lora/checkpoints/0001000.pth merged.pth --merge-lora --only ema

\b
  # a distilled SD / Flux / Wan student as a diffusers pipeline folder (its EMA network when the run keeps one):
  # the teacher's components, the student, a scheduler with its steps, fastgen_export.json and a model card
  fastgen convert-ckpt runs/dmd2_sd15 sd15_4step --to diffusers
  #   then in Python: call = json.load(open("sd15_4step/fastgen_export.json"))["call"]
  #   DiffusionPipeline.from_pretrained("sd15_4step")("a fox", generator=torch.Generator().manual_seed(0), **call)

\b
  # a PDD student with 2 fused blocks (pass callback_on_step_end=PDDBlockWeights("flux_pdd_2"), see its model card)
  fastgen convert-ckpt runs/pdd_flux flux_pdd_2 --to diffusers --steps 2

\b
  # network weights for publishing; from and to S3 (credentials: --credentials-dir/s3.json or AWS_* variables)
  fastgen convert-ckpt s3://bucket/runs/dmd2/checkpoints student.safetensors --only ema
  fastgen convert-ckpt full.pth s3://bucket/published/0004000.pth

SRC: a checkpoint .pth (monolithic or a sharded marker), a .dcp folder, a .safetensors file, a checkpoints
folder or a run directory (its newest valid checkpoint), local or s3://bucket/prefix. DST: a new file or .dcp
name, or a folder that receives NNNNNNN.<format>; the format follows DST's suffix (a folder or .dcp: dcp) unless
--to says it (--to diffusers: DST is a new pipeline folder; the components come from the run's
model.pretrained_model_path or --weights; LoRA networks are merged). Nothing existing is overwritten, and nothing is left at DST when the conversion fails. Memory stays
about one piece of --piece-mb, whatever the checkpoint's size. safetensors holds network weights only.
"""


def convert_ckpt(
    src: str = typer.Argument(..., metavar="SRC", help="Checkpoint, .dcp folder, .safetensors, checkpoints folder or run directory (local or s3://)."),
    dst: str = typer.Argument(..., metavar="DST", help="New .pth / .safetensors / .dcp name, or a folder (local or s3://)."),
    to: Optional[str] = typer.Option(None, "--to", help="pth, dcp, safetensors (default: from DST's suffix) or diffusers (a pipeline folder).", show_default=False),
    only: Optional[str] = typer.Option(None, "--only", help="Keep one network (net, ema, fake_score, ...) as `net`: a teacher / initial-weights file.", show_default=False),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Cast floating-point network weights: bfloat16, float16 or float32.", show_default=False),
    credentials_dir: str = typer.Option("./credentials/", "--credentials-dir", help="Folder whose s3.json holds S3 credentials (else AWS_* variables)."),
    piece_mb: int = typer.Option(64, "--piece-mb", help="Largest piece read at a time, in MiB (peak memory)."),
    merge_lora: bool = typer.Option(False, "--merge-lora", help="A LoRA run (model.net_adapter): fold the adapter into the base and write plain networks (.pth)."),
    weights: Optional[str] = typer.Option(None, "--weights", help="--to diffusers: the teacher's pipeline folder (default: the run's model.pretrained_model_path).", show_default=False),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="--to diffusers: sampling steps of the pipeline - a teacher's ODE grid, or a PDD student's blocks (default: the run's own).", show_default=False),
    log_level: str = typer.Option("WARNING", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Convert a checkpoint between .pth, sharded DCP and safetensors; --only extracts one network; --to diffusers
    writes a diffusers pipeline folder."""
    from fastgen.utils.errors import UsageError

    setup_logging(log_level)
    if to == "diffusers":
        if merge_lora or dtype is not None:
            raise UsageError("--to diffusers merges LoRA networks itself and keeps the network's dtype: drop "
                             "--merge-lora / --dtype")
        _export_diffusers(src, dst, only, weights, credentials_dir, steps)
        return
    if weights is not None:
        raise UsageError("--weights goes with --to diffusers")
    if steps is not None:
        raise UsageError("--steps goes with --to diffusers")
    if merge_lora:
        if to not in (None, "pth") or dtype is not None:
            raise UsageError("--merge-lora writes a .pth in the weights' own dtype: drop --to / --dtype")
        from fastgen.checkpoint.convert import export_merged

        done = export_merged(src, dst, only=only)
        counts = ", ".join(f"{name}: {count} layers" for name, count in done["merged"].items())
        out().print(f"[bold green]merged[/bold green] LoRA ({counts}) at iteration {done['iteration']} -> {dst} "
                    f"(networks {', '.join(done['networks'])})", soft_wrap=True)
        return
    if piece_mb <= 0:
        raise UsageError("--piece-mb must be positive")
    import time

    from fastgen.checkpoint.convert import convert_checkpoint

    start = time.perf_counter()
    bar = _ProgressBar() if interactive() else None
    try:
        result = convert_checkpoint(src, dst, to=to, only=only, dtype=dtype, credentials_dir=credentials_dir,
                                    piece_bytes=piece_mb << 20, progress=bar.update if bar else None)
    finally:
        if bar is not None:
            bar.stop()
    elapsed = time.perf_counter() - start

    from rich.markup import escape

    c = out()
    c.print(f"[bold green]converted[/bold green] {escape(result.source)} ({result.source_kind}, iteration {result.iteration}) -> "
            f"{escape(result.destination)} ({result.format}, {result.tensors} tensors, "
            f"{result.bytes / 2**20:.1f} MiB, {elapsed:.1f} s)", soft_wrap=True)
    c.print(f"  networks  {', '.join(result.networks)}" + (f" (--only {only})" if only else ""), soft_wrap=True)
    if result.marker:
        c.print(f"  marker    {escape(result.marker)}", soft_wrap=True)
    if result.dropped:
        c.print(f"  dropped   {', '.join(result.dropped)} ({'--only' if only else result.format} keeps "
                f"{'one network' if only else 'network weights only'})", soft_wrap=True)


def _export_diffusers(src: str, dst: str, only: Optional[str], weights: Optional[str], credentials_dir: str,
                      steps: Optional[int] = None) -> None:
    import shlex

    from fastgen.cli import common
    from fastgen.pipelines.export import EXPORT_FILE, export_diffusers

    command = "fastgen " + shlex.join(common.ARGV)
    info = export_diffusers(src, dst, only=only, weights=weights, credentials_dir=credentials_dir, steps=steps,
                            command=command)
    from rich.markup import escape

    c = out()
    c.print(f"[bold green]exported[/bold green] {info['network']} of {escape(info['checkpoint'])} (iteration "
            f"{info['iteration']}) -> {escape(dst)} ({info['pipeline']}, {len(info['times'])} step(s), "
            f"{info['scheduler']})", soft_wrap=True)
    c.print(f"  call  {escape(str(info['call']))} (in {EXPORT_FILE})", soft_wrap=True)
    if info["global_seed"]:
        c.print("  note  this pipeline re-noises from torch's global generator: call torch.manual_seed(seed) "
                "before it to reproduce fastgen sample", soft_wrap=True)
    if "pdd" in info:
        c.print(f"  note  a PDD student in {len(info['pdd']['blocks'])} block(s): pass callback_on_step_end="
                f"fastgen.pipelines.pdd_blocks.PDDBlockWeights({escape(repr(dst))}) to the pipeline", soft_wrap=True)


class _ProgressBar:
    """A Rich bar over the bytes copied, shown for large checkpoints only (from 64 MiB)."""

    MIN_BYTES = 64 << 20

    def __init__(self) -> None:
        self.progress = None
        self.task = None

    def update(self, done: int, total: int) -> None:
        if total < self.MIN_BYTES:
            return
        if self.progress is None:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.progress = Progress(TextColumn("[bold]convert"), BarColumn(), DownloadColumn(binary_units=True),
                                     TransferSpeedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                     console=console(), transient=True)
            self.progress.start()
            self.task = self.progress.add_task("convert", total=total)
        self.progress.update(self.task, completed=done)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def register(app: typer.Typer) -> None:
    app.command("convert-ckpt", epilog=EPILOG)(convert_ckpt)
