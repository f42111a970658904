"""``fastgen check-ranks``: do the ranks of a job agree - software, config, liveness, model and checkpoint bytes?

Launches workers like ``fastgen train`` (or runs as one inside any torchrun job) and runs the three tiers of
``fastgen.distributed.rank_check`` on every rank; rank 0 prints the result to stdout. Exit 0: consistent; 1: a mismatch
or a rank that did not arrive; 2: a usage error.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, List, Optional

import typer
from fastgen.cli.common import out, print_error, resolve_config, setup_logging
from fastgen.cli.launching import (
    launch_workers,
    nnodes_option,
    node_rank_option,
    nproc_per_node_option,
    rdzv_endpoint_option,
    rdzv_id_option,
    wants_launch,
)

if TYPE_CHECKING:
    from fastgen.distributed.rank_check import RankCheckReport

EPILOG = """\b
Examples:

\b
  # two processes on this machine, the config as DDP would train it (gloo on CPU, NCCL on GPUs)
  fastgen check-ranks -c Toy/config_sft_toy --nproc-per-node 2 - trainer.ddp=True

\b
  # 8 GPUs, FSDP2, a checkpoint that every rank reads from its own file system
  fastgen check-ranks -c Digits/config_sft_digits --nproc-per-node 8 \\
      --checkpoint FASTGEN_OUTPUT/fastgen/digits/run/checkpoints/0001000.pth - trainer.fsdp=True

\b
  # two nodes: the same command on each, --node-rank 0 on the node at --rdzv-endpoint
  fastgen check-ranks -c Digits/config_sft_digits --nnodes 2 --node-rank 0 --nproc-per-node 8 \\
      --rdzv-endpoint node0:29500 --checkpoint ckpt.pth - trainer.fsdp=True

\b
  # inside a job that torchrun (or srun + torchrun) starts
  torchrun --nproc-per-node 8 -m fastgen check-ranks -c Digits/config_sft_digits - trainer.ddp=True

\b
  # a rank that hangs: give up after 20 s, with torch's own collective checks switched on
  fastgen check-ranks -c Toy/config_sft_toy --nproc-per-node 2 --timeout 20 --detail - trainer.fsdp=True

Tiers: 1 environment (python, torch, CUDA, NCCL, fastgen versions and the config's sha256, compared across
ranks; host and device shown); 2 liveness (a monitored barrier after every rank has built the model and read the
checkpoint names the ranks that did not arrive within --timeout); 3 fingerprints (the model built as the
trainer builds it, the tensors as built, replicated tensors after loading, each shard against the same slice of
the checkpoint its rank read, and every checkpoint tensor as each rank read it). One line per mismatch, naming
the rank and the key or tensor. Exit 0 consistent, 1 a mismatch or a stuck rank, 2 usage.
"""

MAX_LINES = 50  # mismatch lines printed (the rest are counted)


def check_ranks(
    overrides: Optional[List[str]] = typer.Argument(None, help="Config overrides, e.g. trainer.ddp=True.", show_default=False),
    config: str = typer.Option(..., "--config", "-c", help="The job's config: a .py file, a run's config.yaml, or a recipe name.",
                               show_default=False),
    checkpoint: Optional[str] = typer.Option(
        None, "--checkpoint", show_default=False,
        help="A checkpoint every rank reads from its own file system (a relative path: from each node's working "
        "directory) and loads as a resume would; its tensors are compared across ranks."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds rank 0 waits at the liveness barrier for the other ranks."),
    detail: bool = typer.Option(False, "--detail", help="Run the workers with TORCH_DISTRIBUTED_DEBUG=DETAIL (torch checks "
                                "that the ranks' collectives match and logs more on a failure). Not for a DDP config "
                                "on CPU, where torch's DDP crashes under DETAIL."),
    log_level: str = typer.Option("WARNING", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
    nproc_per_node: Optional[int] = nproc_per_node_option("check"),
    nnodes: str = nnodes_option(),
    node_rank: int = node_rank_option(),
    rdzv_endpoint: Optional[str] = rdzv_endpoint_option(),
    rdzv_id: Optional[str] = rdzv_id_option(),
) -> None:
    """Check that the ranks of a job agree: environment, liveness, model and checkpoint fingerprints."""
    from fastgen.utils.errors import UsageError

    setup_logging(log_level)
    if timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout:g}")
    resolved = resolve_config(config, overrides)
    if detail:
        from fastgen.distributed.rank_check import refuse_detail_with_gloo_ddp

        refuse_detail_with_gloo_ddp(resolved)
    if wants_launch(nproc_per_node, nnodes):
        if checkpoint is not None:  # workers would each find the same: say it once, before they start
            from fastgen.distributed.rank_check import check_checkpoint_path

            check_checkpoint_path(checkpoint)
        if detail:
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"  # read by torch when a worker starts
        else:  # the report names what failed: spare the C++ warnings of the store a stopped rank leaves behind
            os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        launch_workers(resolved, nproc_per_node or 1, nnodes, node_rank, rdzv_endpoint, rdzv_id)
        return
    if detail and os.environ.get("TORCH_DISTRIBUTED_DEBUG") != "DETAIL":
        _restart_with_detail()
    from fastgen.distributed.rank_check import run_rank_checks
    from fastgen.trainer import Trainer

    report = run_rank_checks(resolved, Trainer, checkpoint=checkpoint, timeout_s=timeout)
    if report.error is not None:
        raise report.error  # the same failure on every rank: bad input, one line
    from fastgen.distributed.group import get_rank

    if get_rank() == 0:
        render(report, config, checkpoint)
    if not report.consistent:
        _fail_worker(summary(report, detail), primary=get_rank() == 0 or report.stuck == (0,))


def _restart_with_detail() -> None:
    """Torch reads TORCH_DISTRIBUTED_DEBUG once, at start-up: run this worker again (same process id, so a
    torchrun agent keeps track of it) with DETAIL set."""
    from fastgen.cli.common import ARGV

    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "fastgen", *ARGV],
              {**os.environ, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"})


def summary(report: RankCheckReport, detail: bool) -> str:
    """The one line a failed check ends with."""
    from fastgen.distributed.rank_check import stuck_message

    if report.stuck:
        hint = "" if detail else "; --detail runs the workers with TORCH_DISTRIBUTED_DEBUG=DETAIL"
        return stuck_message(report.stuck, report.timeout_s) + hint
    n = len(report.findings)
    more = f" (and {n - 1} more mismatch{'es' if n > 2 else ''}, listed by rank 0)" if n > 1 else ""
    return report.findings[0].line() + more


def _fail_worker(message: str, primary: bool) -> None:
    """End this rank with exit code 1: a worker of a launcher hands the line to it (the launcher prints a primary
    one first), a process without one prints it if primary. ``os._exit``: after a stuck rank no collective -
    teardown included - would end."""
    from fastgen.distributed.launch import launched, record_worker_error

    if not (launched() and record_worker_error(message, secondary=not primary)) and primary:
        print_error(message)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def render(report: RankCheckReport, config: str, checkpoint: Optional[str]) -> None:
    """Rank 0's result on stdout: the ranks, the tiers, then "consistent" or one line per mismatch."""
    from rich.markup import escape
    from rich.table import Table

    from fastgen.distributed.rank_check import TIERS

    console = out()
    title = f"check-ranks: {report.world_size} rank(s), config {config}"
    if checkpoint is not None:
        title += f", checkpoint {checkpoint}"
    ranks = Table(title=escape(title), title_justify="left")
    columns = [("rank", "rank"), ("host", "hostname"), ("device", "device"), ("python", "python"),
               ("torch", "torch"), ("CUDA", "cuda"), ("NCCL", "nccl"), ("fastgen", "fastgen"), ("config sha256", "config"),
               ("debug", "debug")]
    for label, _ in columns:
        ranks.add_column(label)
    for rank, info in enumerate(report.ranks):
        values = {**info, "rank": str(rank), "config": info.get("config", "")[:12]}
        ranks.add_row(*(escape(values.get(key, "?")) for _, key in columns))
    console.print(ranks)
    tiers = Table(title="checks", title_justify="left")
    tiers.add_column("tier")
    tiers.add_column("result")
    for i, tier in enumerate(TIERS, 1):
        result = report.tiers.get(tier, "not run")
        style = "green" if result.startswith(("consistent", "all ")) else "red"
        tiers.add_row(f"{i} {tier}", f"[{style}]{escape(result)}[/{style}]")
    console.print(tiers)
    if report.consistent:
        console.print("[bold green]consistent[/bold green]")
        return
    for finding in report.findings[:MAX_LINES]:
        console.print(f"[bold red]mismatch[/bold red] ({finding.tier}) {escape(finding.line())}", soft_wrap=True)
    if len(report.findings) > MAX_LINES:
        console.print(f"... and {len(report.findings) - MAX_LINES} more mismatches", soft_wrap=True)
    if report.stuck:
        from fastgen.distributed.rank_check import stuck_message

        console.print(f"[bold red]stuck[/bold red] (liveness) {escape(stuck_message(report.stuck, report.timeout_s))}",
                      soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command(
        "check-ranks",
        epilog=EPILOG,
        context_settings={"allow_interspersed_args": True},
    )(check_ranks)
