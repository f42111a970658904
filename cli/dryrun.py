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
  fastgen dryrun -c Digits/config_sft_digits --world-size 8 - trainer.fsdp=true   # memory per rank, sharded

The memory estimate (parameters, gradients, optimizer state per rank) is computed on the meta device;
`fastgen profile-memory` measures the real peak, activations included.
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
    console.print(memory_table(config, model, world_size))
    console.print(f"run directory: {config.log_config.save_path}", markup=False)


def memory_table(config: BaseConfig, model: Any, world_size: int | None = None) -> Any:
    """The per-rank memory estimate (``fastgen.profiling.estimate``) as a Rich table."""
    from rich.table import Table

    from fastgen.profiling.estimate import estimate_memory
    from fastgen.profiling.report import fmt_bytes

    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    estimate = estimate_memory(config, world_size=world_size, model=model)
    layout = f"sharded over {world_size} ranks (FSDP)" if estimate["sharded"] else \
        f"{world_size} rank{'s' if world_size > 1 else ''}, replicated" if world_size > 1 else "1 rank"
    table = Table(title=f"memory per rank (estimate, {layout})", show_edge=False)
    table.add_column("state")
    table.add_column("bytes", justify="right")
    table.add_column("size", justify="right")
    table.add_column("counted from")
    notes = {
        "parameters": "parameters and buffers of every module (EMA included)",
        "gradients": "one per parameter an optimizer steps",
        "optimizer_state": estimate["method"],
    }
    for key, label in (("parameters", "parameters"), ("gradients", "gradients"), ("optimizer_state", "optimizer state")):
        table.add_row(label, f"{estimate[key]:,}", fmt_bytes(estimate[key]), notes[key])
    table.add_row("[bold]total[/bold]", f"{estimate['total']:,}", fmt_bytes(estimate["total"]),
                  "+ activations: measure with `fastgen profile-memory`")
    return table


def dryrun(
    overrides: Optional[List[str]] = typer.Argument(None, help="Config overrides, e.g. trainer.max_iter=100.", show_default=False),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Config .py file, config.yaml or recipe name.", show_default=False),
    as_yaml: bool = typer.Option(False, "--yaml", help="Print the resolved config as YAML instead of a tree."),
    log_level: str = typer.Option("WARNING", "--log_level", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
    world_size: Optional[int] = typer.Option(None, "--world-size", help="Ranks for the per-rank memory estimate. Default: $WORLD_SIZE or 1.", show_default=False),
) -> None:
    """Resolve, validate and print a config and its build plan (parameter counts, memory per rank); writes nothing."""
    setup_logging(log_level)
    if world_size is not None and world_size < 1:
        from fastgen.utils.errors import UsageError

        raise UsageError(f"--world-size must be at least 1, got {world_size}")
    show_plan(resolve_config(config, overrides), as_yaml, world_size)


def register(app: typer.Typer) -> None:
    app.command("dryrun", epilog=EPILOG)(dryrun)
