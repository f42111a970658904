"""``fastgen ema``: reconstruct an EMA of any width after training from a run's power-EMA snapshots (EDM2's
post-hoc EMA, ``fastgen.utils.posthoc_ema``)."""

from __future__ import annotations

from typing import Optional

import typer
from fastgen.cli.common import console, out, setup_logging

EPILOG = """\b
Examples:

\b
  # the run kept EDM2's pair (fastgen.configs.callbacks.POSTHOC_EMA_CALLBACKS); an EMA of width 0.08 at the end
  fastgen ema FASTGEN_OUTPUT/fastgen/digits/my_run --sigma-rel 0.08 -o ema_008.pth

\b
  # the same at update 2000, then use it as a distillation teacher
  fastgen ema runs/teacher --sigma-rel 0.12 --at 2000 -o teacher.pth
  fastgen train --config Digits/config_dmd2_digits - model.teacher_ckpt=teacher.pth

Writes OUT as a checkpoint with one network, `net` (what model.teacher_ckpt, model.student_ckpt,
pretrained_ckpt_path and `fastgen sample` read). The table lists each snapshot's weight in the least-squares
combination and the relative error of the combined averaging profile (0: exact; large: snapshots too sparse or a
width far outside the tracked ones). A reconstruction is refused when --at is not an update a snapshot was
written at (between snapshots, or past the newest, the profile cannot be matched) or when its error exceeds
--max-error (default 0.05); OUT is never overwritten.
"""


def ema(
    run: str = typer.Argument(..., metavar="RUN", help="A run directory (with ema_snapshots/) or a snapshot folder."),
    sigma_rel: float = typer.Option(..., "--sigma-rel", help="Relative width of the EMA to reconstruct (EDM2's sigma_rel, e.g. 0.05-0.2)."),
    out_path: str = typer.Option(..., "--out", "-o", help="Where to write the reconstructed network (.pth)."),
    at: Optional[int] = typer.Option(None, "--at", help="EMA update count to reconstruct at: a snapshot's update (default: the newest snapshot's).", show_default=False),
    max_error: float = typer.Option(0.05, "--max-error", help="Refuse a reconstruction whose relative profile error exceeds this (0: exact)."),
    log_level: str = typer.Option("WARNING", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Reconstruct an EMA of any width from a run's power-EMA snapshots (post-hoc EMA)."""
    from pathlib import Path

    from fastgen.utils.errors import UsageError

    setup_logging(log_level)
    if not sigma_rel > 0:
        raise UsageError("--sigma-rel must be positive")
    if at is not None and at <= 0:
        raise UsageError("--at must be positive")
    if not max_error > 0:
        raise UsageError("--max-error must be positive")
    from fastgen.utils.io import atomic_open, check_writable_dir

    target = Path(out_path).expanduser()
    if target.exists() or target.is_symlink():
        raise UsageError(f"{target} exists: fastgen ema never overwrites; choose a new -o")
    check_writable_dir(target.parent, what="the folder of -o", hint="Choose another -o path.")
    from fastgen.utils.posthoc_ema import reconstruct

    with console().status("solving for the snapshot weights"):
        state, info = reconstruct(run, sigma_rel, at, max_error=max_error)
    import torch
    from fastgen.checkpoint.checkpointer import FORMAT

    with atomic_open(target) as handle:
        torch.save({"format": FORMAT, "version": 1, "iteration": info["t"], "model": {"net": state},
                    "posthoc_ema": info}, handle)
    from rich.table import Table

    table = Table(title=f"sigma_rel {sigma_rel} (gamma {info['gamma']:.3f}) at update {info['t']}")
    for column in ("snapshot", "t", "gamma", "weight"):
        table.add_column(column, justify="left" if column == "snapshot" else "right")
    for snap in info["snapshots"]:
        table.add_row(snap["file"], str(snap["t"]), f"{snap['gamma']:.3f}", f"{snap['weight']:+.4f}")
    c = out()
    c.print(table)
    c.print(f"relative profile error {info['relative_profile_error']:.2e}", soft_wrap=True)
    c.print(f"wrote {target}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("ema", epilog=EPILOG)(ema)
