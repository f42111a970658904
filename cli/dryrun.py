"""``fastgen dryrun``: resolve and validate a config, print it and what the run would build. Writes nothing."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, List, Optional

import typer

from fastgen.cli.common import out, resolve_config, setup_logging

if TYPE_CHECKING:
    from fastgen.configs.config import BaseConfig

EPILOG = """\b
Examples:

\b
  fastgen dryrun                                         # the quick-start recipe
  fastgen dryrun --config=Toy/config_sft_toy --yaml      # as YAML (what config.yaml will hold)
  fastgen dryrun -c configs/my_exp.py - trainer.max_iter=10 model.use_ema=false
  fastgen dryrun -c Digits/config_sft_digits --nproc-per-node 8 - trainer.fsdp=true   # memory per rank, sharded
  fastgen dryrun -c Digits/config_sft_digits --nnodes 2 --nproc-per-node 8 - trainer.fsdp=true trainer.fsdp_shard_size=8

The memory per rank (parameters, gradients, optimizer state) comes from the real plan: the method is built on the
meta device and, under trainer.fsdp, sharded by the trainer's own code on a fake process group of that many ranks
(nothing is allocated, nothing is launched); with uneven shards the busiest rank is shown. The training peak
(activations and temporaries included) comes from a few training steps run on fake tensors - shapes and sizes, no
data - with a batch of the training loader's shapes; without the training data it is not estimated.
`fastgen profile-memory` measures the real peak.
"""


def parameter_counts(config: BaseConfig, model: Any = None) -> list[tuple[str, int, int]]:
    """``(module, total, trainable)`` per module of the model, built on the meta device (no weights, no data)."""
    from fastgen.profiling.estimate import build_meta_model

    if model is None:
        model = build_meta_model(config)
    rows = []
    trainable_names = set(getattr(model, "trainable_modules", {"net": None}))
    for name, module in model.model_dict.items():
        total = sum(p.numel() for p in module.parameters())
        trainable = total if name in trainable_names else 0
        rows.append((name, total, trainable))
    return rows


def _tree(node, label: str):  # noqa: ANN001, ANN202 - rich objects built lazily
    import attrs
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from rich.markup import escape
    from rich.tree import Tree

    tree = Tree(label)

    def add(parent, key: str, value) -> None:  # noqa: ANN001
        if attrs.has(type(value)):
            branch = parent.add(f"[bold]{escape(key)}[/bold] [dim]({type(value).__name__})[/dim]")
            for f in attrs.fields(type(value)):
                add(branch, f.name, getattr(value, f.name))
        elif isinstance(value, (DictConfig, dict)) and len(value) > 0:
            target = value.get("_target_") if isinstance(value, (DictConfig, dict)) else None
            suffix = f" [dim]-> {escape(str(target))}[/dim]" if target else ""
            branch = parent.add(f"[bold]{escape(key)}[/bold]{suffix}")
            for k, v in value.items():
                if k != "_target_":
                    add(branch, str(k), v)
        else:
            if isinstance(value, (ListConfig, DictConfig)):
                value = OmegaConf.to_container(value)
            parent.add(f"{escape(key)}: [cyan]{escape(repr(value))}[/cyan]")

    for f in attrs.fields(type(node)):
        add(tree, f.name, getattr(node, f.name))
    return tree


def show_plan(config: BaseConfig, as_yaml: bool, world_size: int | None = None) -> None:
    from rich.table import Table

    from fastgen.configs.config_utils import config_to_yaml
    from fastgen.profiling.estimate import build_meta_model

    console = out()
    if as_yaml:
        console.print(config_to_yaml(config), end="", markup=False, soft_wrap=True)
        return
    console.print(_tree(config, f"[bold]config[/bold] [dim]({type(config).__name__})[/dim]"))
    model = build_meta_model(config)
    table = Table(title="build plan", show_edge=False)
    table.add_column("module")
    table.add_column("parameters", justify="right")
    table.add_column("trainable", justify="right")
    for name, total, trainable in parameter_counts(config, model):
        table.add_row(name, f"{total:,}", f"{trainable:,}")
    console.print(table)
    memory, state, needed = memory_table(config, model, world_size)
    console.print(memory)
    console.print(f"run directory: {config.log_config.save_path}", markup=False)
    warn_what_train_needs(config, state, needed, world_size or int(os.environ.get("WORLD_SIZE", "1") or 1))


GPU_BYTES = 80 << 30  # the memory of the usual training GPU (A100 / H100 80 GB), what "fits" is measured against


def warn_what_train_needs(config: BaseConfig, state: int, needed: int, world_size: int) -> None:
    """On stderr, after the plan (which stays useful without data): each file ``fastgen train`` would refuse to
    start without, and a plan that does not fit one 80 GiB GPU per rank, with the launch that would."""
    from fastgen.cli.common import console
    from fastgen.configs.checks import data_path_problems
    from fastgen.profiling.report import fmt_bytes

    for problem in data_path_problems(config):
        console().print(f"warning: train would stop here: {problem}", markup=False, soft_wrap=True)
    if needed <= GPU_BYTES:
        return
    sharded = bool(config.trainer.fsdp) and world_size > 1
    whole_state = state * world_size if sharded else state  # FSDP divides the state kept from step to step
    transient = needed - state  # activations and temporaries: not divided by sharding
    ranks = next((n for n in (2 ** k for k in range(1, 13)) if n > world_size or not sharded
                  if whole_state / n + transient <= 0.9 * GPU_BYTES), None)
    told = (f"warning: the plan needs {fmt_bytes(needed)} per rank on {world_size} rank(s), more than an 80 GiB GPU "
            "holds: ")
    if ranks is None:
        console().print(told + f"{fmt_bytes(transient)} of it is activations, which sharding does not divide; lower "
                        "the batch size or checkpoint activations", markup=False, soft_wrap=True)
        return
    per_node = min(ranks, 8)
    launch = f"--nproc-per-node {per_node}" + (f" --nnodes {ranks // per_node}" if ranks > per_node else "")
    shard = "" if config.trainer.fsdp else " - trainer.fsdp=True"
    console().print(told + f"shard it over about {ranks} ranks (`fastgen dryrun {launch} ...{shard}` checks it)",
                    markup=False, soft_wrap=True)


def memory_table(config: BaseConfig, model: Any, world_size: int | None = None) -> tuple[Any, int, int]:
    """The per-rank memory plan (``fastgen.profiling.plan``) as a Rich table (the busiest rank's bytes), the state
    kept from step to step, and the bytes a rank needs: the training peak when it is estimated, else that state."""
    from rich.table import Table

    from fastgen.profiling.plan import plan_state
    from fastgen.profiling.report import fmt_bytes

    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    plan = plan_state(config, world_size, model=model)
    busiest, lightest = plan.busiest, plan.lightest
    which = f"; rank {busiest.rank}, which holds the most" if busiest.total != lightest.total else ""
    table = Table(title=f"memory per rank (plan: {plan.layout}{which})", show_edge=False)
    table.add_column("state")
    table.add_column("bytes", justify="right")
    table.add_column("size", justify="right")
    table.add_column("counted from")
    notes = {
        "parameters": "parameters and buffers of every module (EMA included)" + (", local shards" if plan.sharded else ""),
        "gradients": "one per parameter an optimizer steps",
        "optimizer_state": plan.method,
    }
    for key, label in (("parameters", "parameters"), ("gradients", "gradients"), ("optimizer_state", "optimizer state")):
        value = getattr(busiest, key)
        table.add_row(label, f"{value:,}", fmt_bytes(value), notes[key])
    table.add_row("[bold]total[/bold]", f"{busiest.total:,}", fmt_bytes(busiest.total), "kept from step to step")
    if busiest.total != lightest.total:
        table.add_row(f"rank {lightest.rank} (least)", f"{lightest.total:,}", fmt_bytes(lightest.total),
                      "uneven shards: torch.chunk gives the first ranks the larger pieces")
    peak, how = training_peak(config, world_size, plan.sharded)
    table.add_row("[bold]training peak[/bold]", "-" if peak is None else f"{peak:,}",
                  "-" if peak is None else fmt_bytes(peak), how)
    return table, busiest.total, busiest.total if peak is None else max(peak, busiest.total)


def training_peak(config: BaseConfig, world_size: int, sharded: bool) -> tuple[int | None, str]:
    """Rank 0's peak during training steps traced on fake tensors (``fastgen.profiling.step_trace``), or ``None``
    and why there is no estimate (no training data here, or a step that reads tensor values)."""
    from fastgen.profiling.step_trace import StepTraceError, first_batch, trace_step_peak
    from fastgen.utils.errors import FastGenError

    try:
        batch = first_batch(config)
    except FastGenError as exc:
        return None, f"not estimated without the training data ({' '.join(str(exc).split())})"
    try:
        found = trace_step_peak(config, world_size, batch)
    except StepTraceError as exc:
        reason = "it reads a tensor's value" if "DataDependent" in str(exc) else str(exc)
        return None, f"not estimated: the step cannot run on fake tensors ({reason}); use `fastgen profile-memory`"
    parts = "activations, temporaries" + (", all-gathered parameters" if sharded else "") + (
        ", DDP's gradient buckets" if found.buckets else "")
    return found.peak, f"{found.iterations} training steps traced on fake tensors: the state + {parts}"


def check_ranks(config: BaseConfig, world_size: int) -> None:
    """Refuse what ``fastgen train --nproc-per-node`` would refuse: fewer than one rank, several ranks for a config
    that distributes nothing (it would train a replica per rank), an HSDP shard size that does not divide them."""
    from fastgen.profiling.plan import check_world_size
    from fastgen.utils.errors import ConfigError

    check_world_size(config.trainer, world_size)
    if world_size > 1 and not (config.trainer.ddp or config.trainer.fsdp):
        raise ConfigError(
            f"a plan for {world_size} ranks needs a distributed config, as torchrun distributes training only when the "
            "config sets trainer.ddp or trainer.fsdp: add - trainer.ddp=True (replicate the model) or - "
            "trainer.fsdp=True (shard it)")


def dryrun(
    overrides: Optional[List[str]] = typer.Argument(None, help="Config overrides, e.g. trainer.max_iter=100.", show_default=False),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Config .py file, config.yaml or recipe name.", show_default=False),
    as_yaml: bool = typer.Option(False, "--yaml", help="Print the resolved config as YAML instead of a tree."),
    log_level: str = typer.Option("WARNING", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
    nproc_per_node: Optional[int] = typer.Option(
        None, "--nproc-per-node", show_default=False, rich_help_panel="Distributed",
        help="Plan the memory per rank of a job of this many workers per node (as `fastgen train --nproc-per-node`). "
        "Default: $WORLD_SIZE or 1."),
    nnodes: int = typer.Option(1, "--nnodes", rich_help_panel="Distributed", help="Number of nodes of that job."),
    world_size: Optional[int] = typer.Option(None, "--world-size", show_default=False, rich_help_panel="Distributed",
                                             help="Total ranks (--nproc-per-node N on one node)."),
) -> None:
    """Resolve, validate and print a config and its build plan (parameter counts, memory per rank); writes nothing."""
    from fastgen.utils.errors import UsageError

    setup_logging(log_level)
    if world_size is not None and (nproc_per_node is not None or nnodes != 1):
        raise UsageError("give either --world-size or --nproc-per-node / --nnodes, not both")
    for flag, value in (("--nproc-per-node", nproc_per_node), ("--nnodes", nnodes), ("--world-size", world_size)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if world_size is None and (nproc_per_node is not None or nnodes != 1):
        world_size = (nproc_per_node or 1) * nnodes
    resolved = resolve_config(config, overrides)
    check_ranks(resolved, world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1") or 1))
    show_plan(resolved, as_yaml, world_size)


def register(app: typer.Typer) -> None:
    app.command("dryrun", epilog=EPILOG)(dryrun)
