"""``fastgen dryrun``: resolve and validate a config, print it and what the run would build. Writes nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

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
"""


def parameter_counts(config: BaseConfig) -> list[tuple[str, int, int]]:
    """``(module, total, trainable)`` per module of the model, built on the meta device (no weights, no data)."""
    import torch

    from fastgen.configs.instantiate import instantiate

    with torch.device("meta"):
        model = instantiate(config.model_class, config=config.model)
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


def show_plan(config: BaseConfig, as_yaml: bool) -> None:
    from rich.table import Table

    from fastgen.configs.config_utils import config_to_yaml

    console = out()
    if as_yaml:
        console.print(config_to_yaml(config), end="", markup=False, soft_wrap=True)
        return
    console.print(_tree(config, f"[bold]config[/bold] [dim]({type(config).__name__})[/dim]"))
    table = Table(title="build plan", show_edge=False)
    table.add_column("module")
    table.add_column("parameters", justify="right")
    table.add_column("trainable", justify="right")
    for name, total, trainable in parameter_counts(config):
        table.add_row(name, f"{total:,}", f"{trainable:,}")
    console.print(table)
    console.print(f"run directory: {config.log_config.save_path}", markup=False)


def dryrun(
    overrides: Optional[List[str]] = typer.Argument(None, help="Config overrides, e.g. trainer.max_iter=100.", show_default=False),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Config .py file, config.yaml or recipe name.", show_default=False),
    as_yaml: bool = typer.Option(False, "--yaml", help="Print the resolved config as YAML instead of a tree."),
    log_level: str = typer.Option("WARNING", "--log_level", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Resolve, validate and print a config and its build plan (parameter counts); writes nothing."""
    setup_logging(log_level)
    show_plan(resolve_config(config, overrides), as_yaml)


def register(app: typer.Typer) -> None:
    app.command("dryrun", epilog=EPILOG)(dryrun)
