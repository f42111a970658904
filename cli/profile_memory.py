"""``fastgen profile-memory``: run a few iterations with memory tracking and write a self-contained HTML report.

Two forms, one command group::

    fastgen profile-memory [--config C] [--iters N] [--out PATH] [-] [key=value ...]   # profile a recipe
    fastgen profile-memory report SNAPSHOT [SNAPSHOT ...] [--out PATH]                 # re-render a snapshot

The group's default command (the first form) runs when the first word is not ``report``; its usage and help
read as ``fastgen profile-memory``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import typer
from fastgen.cli.common import DEFAULT_RECIPE, console, interactive, out, setup_logging
from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:
    from fastgen.configs.config import BaseConfig

_DEFAULT = "run"
TRACKER_NAME = "mem_tracker"

EPILOG = """\b
Examples:

\b
  # the quick-start recipe: 3 iterations, report in the run directory
  fastgen profile-memory

\b
  # a recipe with overrides in Hydra's grammar, 2 tracked iterations, report where you want it
  fastgen profile-memory --config=Digits/config_sft_digits --iters 2 --out mem/digits.html - dataloader_train.batch_size=128

\b
  # re-render a saved snapshot (one per rank; a folder works too)
  fastgen profile-memory report FASTGEN_OUTPUT/fastgen/digits/config_sft_digits_memory/memory/memory_report_rank0.json.gz

The run is named <name>_memory (override with log_config.name=...), starts from scratch (trainer.resume=False;
its checkpoints are removed when it ends) and logs nothing to W&B (log_config.wandb_mode=disabled) unless you override those keys. The report (.html),
one snapshot per rank (<stem>_rank<r>.json.gz) and, on CUDA, PyTorch's own snapshot (<stem>_rank<r>.pickle,
for its memory viewer) are written together.
"""

REPORT_EPILOG = """\b
Examples:

\b
  fastgen profile-memory report run/memory/memory_report_rank0.json.gz
  fastgen profile-memory report run/memory/                       # every rank's snapshot in the folder
  fastgen profile-memory report run/memory/memory_report_rank0.pickle --out cuda.html

A fastgen snapshot is gzip JSON. A PyTorch CUDA snapshot (.pickle) is read with a restricted unpickler that
accepts plain data only (dicts, lists, numbers, strings), so a crafted file cannot run code; the fastgen
snapshot beside it supplies the phases and categories.
"""


# Typer ships its own copy of click: build on the classes it uses (its Context raises the Exit it catches).
class _DefaultContext(TyperCommand.context_class):  # type: ignore[misc,name-defined]
    """The default command's context: its path is the group's (``fastgen profile-memory``, no ``run``)."""

    @property
    def command_path(self) -> str:
        return self.parent.command_path if self.parent is not None else super().command_path


class _DefaultCommand(TyperCommand):
    context_class = _DefaultContext


class _ProfileMemoryGroup(TyperGroup):
    """Routes ``profile-memory ARGS`` to the hidden default command unless ARGS starts with a subcommand."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands or args[0] == _DEFAULT:
            args = [_DEFAULT, *args]
        return super().parse_args(ctx, args)


def profile(
    overrides: Optional[List[str]] = typer.Argument(None, help="Config overrides, e.g. dataloader_train.batch_size=128.", show_default=False),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Config .py file, a run's config.yaml, or a recipe name. Default: the digits quick-start.", show_default=False),
    iters: int = typer.Option(3, "--iters", "-n", help="Iterations to run and record (from iteration 0: the first optimizer step allocates its state)."),
    output: Optional[str] = typer.Option(None, "--out", "-o", help="Report path (.html); snapshots go beside it. Default: <run dir>/memory/memory_report.html.", show_default=False),
    log_level: str = typer.Option("WARNING", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Run a few iterations with memory tracking; print the peak and the top consumers; write an HTML report.

    `fastgen profile-memory report SNAPSHOT` re-renders a saved snapshot.
    """
    from fastgen.utils.errors import UsageError

    setup_logging(log_level)
    if iters < 1:
        raise UsageError(f"--iters must be at least 1, got {iters}")
    if output is not None and Path(output).suffix not in ("", ".html"):
        raise UsageError(f"--out must name an .html file, got {output}")
    resolved = profile_config(config, overrides, iters, output)
    from fastgen.distributed import group as dist_utils
    from fastgen.trainer import Trainer

    extra: dict[str, Any] = {}
    if interactive():
        from fastgen.cli.progress import ProgressBarCallback

        extra["_progress_bar"] = ProgressBarCallback(console())
    trainer = Trainer(resolved, extra_callbacks=extra)
    trainer.run()
    tracker = trainer.callbacks[TRACKER_NAME]
    if not dist_utils.is_rank0():
        return
    _remove_profiling_checkpoints(trainer)
    if tracker.report_path is None:
        from fastgen.utils.errors import FastGenRuntimeError

        raise FastGenRuntimeError("no memory report was written (see the messages above; --log_level INFO shows more)")
    from fastgen.profiling.snapshot import load_snapshot

    snapshots = []
    for rank in range(dist_utils.get_world_size()):
        path = tracker.snapshot_file(rank)
        if path.is_file():
            snapshots.append((load_snapshot(path), path))
    print_summary(snapshots, tracker.report_path)


def _remove_profiling_checkpoints(trainer: Any) -> None:
    """A profiling run is never resumed, and a run directory holds one run: its checkpoints go, so the same
    command can profile again (it starts with trainer.resume=False, which refuses a folder holding checkpoints)."""
    import shutil

    folder = getattr(trainer.checkpoints.files, "save_dir", None)  # None: checkpoints in S3 are left as they are
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def profile_config(config_spec: str | None, overrides: list[str] | None, iters: int, output: str | None) -> BaseConfig:
    """The recipe with profiling defaults (overridable), the user's overrides, the tracker first in the
    callbacks (so phase boundaries fall before other callbacks' work) and ``trainer.max_iter = iters``."""
    from omegaconf import DictConfig

    from fastgen.configs.config_utils import apply_overrides, load_config, validate_config
    from fastgen.configs.instantiate import LazyCall

    config = load_config(config_spec or DEFAULT_RECIPE)
    config.log_config.name = f"{config.log_config.name}_memory"
    config.log_config.wandb_mode = "disabled"
    config.trainer.resume = False
    apply_overrides(config, overrides or [])
    config.trainer.max_iter = iters
    tracker = LazyCall("fastgen.callbacks.mem_tracker.MemTrackerCallback")(
        start_iter=0, num_iters=iters, output=str(Path(output).resolve()) if output else None, estimate=True)
    others = {k: v for k, v in config.trainer.callbacks.items() if k != TRACKER_NAME}
    config.trainer.callbacks = DictConfig({TRACKER_NAME: tracker, **others})
    return validate_config(config)


def report(
    snapshots: Optional[List[str]] = typer.Argument(None, help="Snapshot files (one per rank) or a folder holding them.", show_default=False),
    output: Optional[str] = typer.Option(None, "--out", "-o", help="Report path (.html). Default: beside the snapshot.", show_default=False),
) -> None:
    """Re-render the HTML report from saved snapshots (fastgen .json.gz, or PyTorch's CUDA .pickle)."""
    from fastgen.profiling.report import write_report
    from fastgen.profiling.snapshot import load_any
    from fastgen.utils.errors import UsageError

    if not snapshots:
        raise UsageError("give the snapshot to render: fastgen profile-memory report <stem>_rank0.json.gz (or its folder)")
    if output is not None and Path(output).suffix != ".html":
        raise UsageError(f"--out must name an .html file, got {output}")
    paths = _expand(snapshots)
    loaded = []
    for path in paths:
        if path.suffix in (".pickle", ".pkl"):
            console().print(f"reading PyTorch's CUDA snapshot {path} with a restricted unpickler (plain data only; "
                            "nothing in the file is executed)", markup=False, soft_wrap=True)
        loaded.append((load_any(path), path))
    ranks = [int(s.get("rank", 0)) for s, _ in loaded]
    duplicates = sorted({r for r in ranks if ranks.count(r) > 1})
    if duplicates:
        raise UsageError(f"more than one snapshot for rank(s) {', '.join(map(str, duplicates))}; give one per rank")
    target = Path(output) if output else _default_report_path(loaded)
    write_report([s for s, _ in loaded], target, [p.name for _, p in loaded])
    print_summary(loaded, target)


def _expand(items: list[str]) -> list[Path]:
    from fastgen.utils.errors import UsageError

    paths: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(path.glob("*_rank*.json.gz"), key=lambda p: (_stem_and_rank(p)[0], _stem_and_rank(p)[1]))
            if not found:
                raise UsageError(f"no memory snapshots (*_rank<r>.json.gz) in {path}")
            paths.extend(found)
        elif path.is_file():
            paths.append(path)
        else:
            raise UsageError(f"memory snapshot not found: {path}")
    return paths


def _stem_and_rank(path: Path) -> tuple[str, int]:
    name = path.name
    for suffix in (".json.gz", ".json", ".pickle", ".pkl"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    match = re.match(r"^(?P<stem>.*)_rank(?P<rank>\d+)$", name)
    return (match["stem"], int(match["rank"])) if match else (name, -1)


def _default_report_path(loaded: list[tuple[dict[str, Any], Path]]) -> Path:
    """``<stem>.html`` beside the snapshots when every rank of the run is there, else ``<file stem>.html``."""
    first_snapshot, first = loaded[0]
    stem, _ = _stem_and_rank(first)
    world = int(first_snapshot.get("world_size", 1))
    if len(loaded) == world and all(_stem_and_rank(p)[0] == stem for _, p in loaded):
        return first.with_name(f"{stem}.html")
    name, rank = _stem_and_rank(first)
    return first.with_name(f"{name}_rank{rank}.html" if rank >= 0 else f"{name}.html")


def print_summary(loaded: list[tuple[dict[str, Any], Path]], report_path: Path) -> None:
    """The peak, the breakdown and the largest sites per rank as tables, then the paths to open."""
    from rich.markup import escape
    from rich.table import Table

    from fastgen.profiling.analysis import analyse
    from fastgen.profiling.report import CATEGORY_LABELS, fmt_bytes, fmt_time
    from fastgen.profiling.snapshot import CATEGORIES

    console_out = out()
    for snapshot, path in sorted(loaded, key=lambda p: int(p[0].get("rank", 0))):
        analysis = analyse(snapshot)
        phase = analysis.peak_phase
        where = f"{phase.name}, iteration {phase.iteration}" if phase else "window start"
        estimate = snapshot.get("estimate") or {}
        crash = snapshot.get("crash")
        title = (f"rank {analysis.rank}: peak {fmt_bytes(analysis.peak_bytes)} at {fmt_time(analysis.peak_time)} "
                 f"({where}) on {snapshot.get('device')}")
        console_out.print(f"[bold]{escape(title)}[/bold]", soft_wrap=True)
        if crash:
            console_out.print(f"[red]the run {'ran out of memory' if crash.get('oom') else 'crashed'} in iteration "
                              f"{crash.get('iteration')}: {escape(str(crash.get('type')))}[/red]", soft_wrap=True)
        table = Table(show_edge=False, title="peak by category")
        for column in ("category", "at peak", "share", "max in window", "estimate"):
            table.add_column(column, justify="left" if column == "category" else "right")
        for category in CATEGORIES:
            value = analysis.peak_breakdown[category]
            est = estimate.get(category)
            table.add_row(CATEGORY_LABELS[category], fmt_bytes(value), f"{100 * value / max(analysis.peak_bytes, 1):.1f}%",
                          fmt_bytes(analysis.max_by_category[category]), fmt_bytes(est) if est is not None else "-")
        table.add_row("[bold]total[/bold]", f"[bold]{fmt_bytes(analysis.peak_bytes)}[/bold]", "100%", "",
                      fmt_bytes(estimate["total"]) if estimate.get("total") is not None else "-")
        console_out.print(table)
        sites = Table(show_edge=False, title="largest allocation sites (live at the peak)")
        for column in ("site", "live at peak", "blocks", "allocated in window", "allocations"):
            sites.add_column(column, justify="left" if column == "site" else "right", overflow="fold")
        for row in analysis.sites[:10]:
            sites.add_row(escape(row.label), fmt_bytes(row.peak_bytes), f"{row.peak_blocks:,}", fmt_bytes(row.alloc_bytes),
                          f"{row.alloc_count:,}")
        console_out.print(sites)
        console_out.print(f"snapshot  {escape(str(path))}", soft_wrap=True)
        if snapshot.get("raw"):
            console_out.print(f"CUDA snapshot (PyTorch memory viewer)  {escape(str(path.with_name(snapshot['raw'])))}",
                              soft_wrap=True)
    resolved = Path(report_path).resolve()
    console_out.print(f"report    {escape(str(resolved))}", soft_wrap=True)
    console_out.print(f"open      {escape(resolved.as_uri())}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        cls=_ProfileMemoryGroup,
        help="Run a few iterations with memory tracking; write a self-contained HTML report.",
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    group.command(_DEFAULT, hidden=True, epilog=EPILOG, cls=_DefaultCommand,
                  context_settings={"allow_interspersed_args": True})(profile)
    group.command("report", epilog=REPORT_EPILOG)(report)
    app.add_typer(group, name="profile-memory")
