"""What the commands that start workers share (``fastgen train``, ``fastgen check-ranks``): the torchrun-style
launch options, the worker's command line, and the launch through torchrun's agent (``fastgen.distributed.launch``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import typer

if TYPE_CHECKING:
    from fastgen.configs.config import BaseConfig

PANEL = "Distributed"
LAUNCHER_FLAGS = ("--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id", "--max-restarts")


def nproc_per_node_option(what: str, needs: str = "; the config must set trainer.ddp or trainer.fsdp") -> Any:
    return typer.Option(
        None, "--nproc-per-node", min=1, show_default=False, rich_help_panel=PANEL,
        help=f"Launch this many worker processes on this node through torchrun's agent (torch.distributed.run) "
        f"to {what}{needs}.")


def nnodes_option() -> Any:
    return typer.Option("1", "--nnodes", rich_help_panel=PANEL, help="Number of nodes (N or MIN:MAX), as torchrun.")


def node_rank_option() -> Any:
    return typer.Option(0, "--node-rank", rich_help_panel=PANEL, help="This node's rank (multi-node).")


def rdzv_endpoint_option() -> Any:
    return typer.Option(None, "--rdzv-endpoint", show_default=False, rich_help_panel=PANEL,
                        help="HOST:PORT of node 0 for multi-node rendezvous.")


def rdzv_id_option() -> Any:
    return typer.Option(None, "--rdzv-id", show_default=False, rich_help_panel=PANEL,
                        help="Rendezvous id, as torchrun.")


def wants_launch(nproc_per_node: Optional[int], nnodes: str) -> bool:
    """True when the command line asks this process to start workers (rather than be one)."""
    return nproc_per_node is not None or nnodes != "1"


def worker_argv(argv: list[str]) -> list[str]:
    """The command line without the launcher's flags: what each worker runs."""
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0].replace("_", "-")  # torchrun's underscore spellings too
        if name in LAUNCHER_FLAGS:
            skip = "=" not in token
            continue
        out.append(token)
    return out


def launch_workers(config: BaseConfig, nproc_per_node: int, nnodes: str, node_rank: int, rdzv_endpoint: Optional[str],
                   rdzv_id: Optional[str], max_restarts: int = 0) -> None:
    """Start the workers through torchrun's agent (fastgen.distributed.launch) with this command minus the launch flags.
    The config was resolved here first, so a bad config fails once, before any worker starts."""
    from fastgen.utils.errors import ConfigError

    if not (config.trainer.ddp or config.trainer.fsdp):
        raise ConfigError("torchrun distributes training only when the config sets trainer.ddp or trainer.fsdp: add "
                          "- trainer.ddp=True (replicate the model) or - trainer.fsdp=True (shard it)")
    shard_size = config.trainer.fsdp_shard_size
    world = nproc_per_node * int(nnodes.split(":")[-1]) if nnodes.split(":")[-1].isdigit() else None
    if config.trainer.fsdp and shard_size is not None and world is not None and world % shard_size:
        raise ConfigError(f"trainer.fsdp_shard_size={shard_size} must divide the world size {world}")
    launch_this_command(nproc_per_node, nnodes, node_rank, rdzv_endpoint, rdzv_id, max_restarts)


def launch_this_command(nproc_per_node: int, nnodes: str, node_rank: int, rdzv_endpoint: Optional[str],
                        rdzv_id: Optional[str], max_restarts: int = 0) -> None:
    """Run this command again as torchrun workers (``fastgen.distributed.launch``), minus the launch flags: what
    every command with ``--nproc-per-node`` does once it has checked its input."""
    from fastgen.cli.common import ARGV

    from fastgen.distributed.launch import launch, torchrun_args

    launch(worker_argv(ARGV), torchrun_args(nproc_per_node, nnodes, node_rank, rdzv_endpoint, rdzv_id, max_restarts),
           nproc_per_node)
