"""``fastgen train``: train or distill a model from a config file, a run's config.yaml or a built-in recipe."""

from __future__ import annotations

from typing import List, Optional

import typer

from fastgen.cli.common import console, interactive, print_error, resolve_config, setup_logging

EPILOG = """\b
Examples:

\b
  # the quick-start: a class-conditional digits diffusion model on CPU
  fastgen train

\b
  # a recipe by name, with overrides in Hydra's grammar
  fastgen train --config=Toy/config_sft_toy - trainer.max_iter=500 log_config.name=toy_run

\b
  # your own config file (defines create_config()); the lone '-' is optional
  fastgen train --config=configs/my_exp.py trainer.max_iter=10000 model.net_optimizer.lr=2e-4

\b
  # check the resolved config without training, verbose logging
  fastgen train --config=Digits/config_sft_digits --dryrun
  fastgen train --config=Digits/config_sft_digits --log_level DEBUG

Overrides: key=value changes a key, +key=value adds one, ++key=value does either, key=null sets None,
~key deletes a dict key. A run resumes from its newest checkpoint (trainer.resume=True); give independent
runs distinct names with log_config.name=...
"""


def train(
    overrides: Optional[List[str]] = typer.Argument(None, help="Config overrides, e.g. trainer.max_iter=100.", show_default=False),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Config .py file, a run's config.yaml, or a recipe name. Default: the digits quick-start.", show_default=False),
    log_level: str = typer.Option("INFO", "--log_level", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
    dryrun: bool = typer.Option(False, "--dryrun", "--dry-run", help="Resolve and print the config, then exit without training."),
) -> None:
    """Train or distill a model."""
    setup_logging(log_level)
    resolved = resolve_config(config, overrides)
    if dryrun:
        from fastgen.cli.dryrun import show_plan

        show_plan(resolved, as_yaml=False)
        return
    from fastgen.cli.progress import ProgressBarCallback
    from fastgen.trainer import Trainer

    extra = {"_progress_bar": ProgressBarCallback(console())} if interactive() else {}
    trainer = Trainer(resolved, extra_callbacks=extra)
    trainer.run()
    _summary(trainer)


def _summary(trainer) -> None:  # noqa: ANN001 - a Trainer; annotated loosely to keep imports lazy
    from rich.markup import escape

    c = console()
    c.print(f"[bold green]done[/bold green]: {trainer.iteration} iterations")
    c.print(f"  run directory  {escape(str(trainer.run_dir))}", soft_wrap=True)
    if trainer.last_checkpoint is not None:
        c.print(f"  checkpoint     {escape(str(trainer.last_checkpoint))}", soft_wrap=True)
    if trainer.last_sample_path is not None:
        c.print(f"  samples        {escape(str(trainer.last_sample_path))}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command(
        "train",
        epilog=EPILOG,
        context_settings={"allow_interspersed_args": True},
    )(train)


__all__ = ["print_error", "register", "train"]
