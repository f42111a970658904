"""``fastgen train``: train or distill a model from a config file, a run's config.yaml or a built-in recipe."""

from __future__ import annotations

from typing import List, Optional

import typer
from fastgen.cli.common import console, interactive, out, print_error, resolve_config, setup_logging
from fastgen.cli.launching import (
    PANEL,
    launch_workers,
    nnodes_option,
    node_rank_option,
    nproc_per_node_option,
    rdzv_endpoint_option,
    rdzv_id_option,
    wants_launch,
)

EPILOG = """\b
Examples:

\b
  # the quick-start: distill the shipped digits teacher into a 1-step student with DMD2 (CPU, < 3 min),
  # then print the student's Frechet distance beside the 35-evaluation teacher's
  fastgen train

\b
  # a recipe by name, with overrides in Hydra's grammar
  fastgen train --config=Toy/config_sft_toy - trainer.max_iter=500 log_config.name=toy_run

\b
  # your own config file (defines create_config()); the lone '-' is optional
  fastgen train --config=configs/my_exp.py trainer.max_iter=10000 model.net_optimizer.lr=2e-4

\b
  # train a digits teacher, then score 2,000 of its samples
  fastgen train --config=Digits/config_sft_digits --eval-samples 2000

\b
  # check the resolved config without training, verbose logging
  fastgen train --config=Digits/config_sft_digits --dryrun
  fastgen train --config=Digits/config_sft_digits --log-level DEBUG

\b
  # distributed: 2 processes on this machine (torchrun's agent; gloo on CPU, NCCL on GPUs), DDP or FSDP2
  fastgen train --config=Digits/config_sft_digits --nproc-per-node 2 - trainer.ddp=True
  fastgen train --config=Digits/config_sft_digits --nproc-per-node 8 - trainer.fsdp=True
  # two nodes: the same command on each, --node-rank 0 on the node at --rdzv-endpoint
  fastgen train -c Digits/config_sft_digits --nnodes 2 --node-rank 0 --nproc-per-node 8 \\
      --rdzv-endpoint node0:29500 - trainer.fsdp=True

Overrides: key=value changes a key, +key=value adds one, ++key=value does either, key=null sets None,
~key deletes a dict key. A run resumes from its newest checkpoint (trainer.resume=True); give independent
runs distinct names with log_config.name=...
"""


def train(
    overrides: Optional[List[str]] = typer.Argument(None, help="Config overrides, e.g. trainer.max_iter=100.", show_default=False),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="Config .py file, a run's config.yaml, or a recipe name. Default: the digits quick-start.", show_default=False),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
    dryrun: bool = typer.Option(False, "--dryrun", "--dry-run", help="Resolve and print the config, then exit without training."),
    eval_samples: Optional[int] = typer.Option(
        None, "--eval-samples", min=0, show_default=False,
        help="After training, score this many samples of the model (and of its teacher, when it distills one) "
        "with `fastgen eval`'s metrics (the teacher's scores are cached beside its checkpoint). "
        "Default: 5000 for the quick-start, 0 otherwise."),
    nproc_per_node: Optional[int] = nproc_per_node_option("train"),
    nnodes: str = nnodes_option(),
    node_rank: int = node_rank_option(),
    rdzv_endpoint: Optional[str] = rdzv_endpoint_option(),
    rdzv_id: Optional[str] = rdzv_id_option(),
    max_restarts: int = typer.Option(0, "--max-restarts", rich_help_panel=PANEL,
                                     help="Restart the workers this many times after a failure (they resume from the newest checkpoint). "
                                     "CUDA (NCCL) only: on CPU, torch's gloo backend cannot re-form the group after a "
                                     "restart, so the flag is refused; rerun the command to resume."),
) -> None:
    """Train or distill a model."""
    setup_logging(log_level)
    resolved = resolve_config(config, overrides)
    if not dryrun and resolved.trainer.max_iter == 0:
        from fastgen.utils.errors import ConfigError

        raise ConfigError("trainer.max_iter=0 trains nothing (it counts optimizer steps in total, restored ones "
                          "included): set it to the step to train up to")
    if not dryrun:
        from fastgen.configs.checks import check_data_paths

        check_data_paths(resolved)  # a missing or placeholder data path: one line, before any run directory
    if wants_launch(nproc_per_node, nnodes):
        if dryrun:
            from fastgen.utils.errors import UsageError

            raise UsageError("--dryrun does not launch workers; use `fastgen dryrun --nproc-per-node N` for the "
                             "per-rank plan")
        if max_restarts > 0:
            _refuse_restarts_on_gloo(resolved.trainer.device)
        launch_workers(resolved, nproc_per_node or 1, nnodes, node_rank, rdzv_endpoint, rdzv_id, max_restarts)
        return
    if dryrun:
        from fastgen.cli.dryrun import show_plan

        show_plan(resolved, as_yaml=False)
        return
    from fastgen.cli.progress import ProgressBarCallback

    from fastgen.distributed.group import get_rank, launched_world_size
    from fastgen.trainer import Trainer

    rank0 = get_rank() == 0
    extra = {"_progress_bar": ProgressBarCallback(console())} if interactive() and rank0 else {}
    trainer = Trainer(resolved, extra_callbacks=extra)
    model = trainer.run()
    if not rank0:
        return  # rank 0 reports and evaluates
    _summary(trainer)
    if eval_samples is None:
        eval_samples = QUICKSTART_EVAL_SAMPLES if config is None else 0
    if eval_samples > 0:
        if launched_world_size() > 1:  # the networks may be sharded: evaluate the saved weights, on this rank
            from fastgen.evaluation.sampling import load_run, resolve_device

            model = load_run(trainer.last_checkpoint, config=resolved, device=resolve_device("auto")).model
        _evaluate(model, resolved, eval_samples, trainer.run_dir)


QUICKSTART_EVAL_SAMPLES = 5000  # at 1,000 the same teacher's score moves by +-0.25 from seed to seed


def _evaluate(model, config, n: int, run_dir) -> None:  # noqa: ANN001 - a method, its BaseConfig, a Path
    """Score the trained model's samples (and its teacher's, for distillation), print them side by side and
    write them to ``<run dir>/evaluation.json``."""
    import contextlib
    import json
    from pathlib import Path

    from rich.table import Table

    from fastgen.distributed.group import is_rank0
    from fastgen.evaluation.evaluate import evaluate_model
    from fastgen.evaluation.sampling import dataset_of_config
    from fastgen.evaluation.teacher_cache import teacher_metrics
    from fastgen.utils.io import atomic_write_text

    dataset = dataset_of_config(config)
    if dataset is None or dataset in ("cifar10", "imagenet"):
        console().print("evaluation skipped: no built-in metric without reference data for this data set "
                        "(use `fastgen sample` and `fastgen eval`)")
        return
    teacher = getattr(model, "teacher", None)
    table = Table(title=f"evaluation on {n} samples ({dataset})")
    results = []  # (key in evaluation.json, row label, metrics)
    cached_from = None  # the teacher's cache file, when its scores were read from one
    with console().status("evaluating samples...") if interactive() else contextlib.nullcontext():
        name = "student" if teacher is not None else "model"
        results.append((name, name, evaluate_model(model, n, seed=0, net=model.sampling_net(), dataset=dataset)))
        if teacher is not None:  # 35 evaluations per sample: scored once per teacher and cached
            steps = model.config.sample_steps
            metrics, cached_from = teacher_metrics(model, n, steps, dataset, seed=0)
            label = f"teacher ({2 * steps - 1} evaluations{', cached' if cached_from is not None else ''})"
            results.append(("teacher", label, metrics))
    keys = [k for k in results[0][2] if k not in ("dataset", "num_samples")]
    table.add_column("network")
    for key in keys:
        table.add_column(key, justify="right")
    for _, label, metrics in results:
        table.add_row(label, *(f"{metrics[k]:.4f}" if isinstance(metrics[k], float) else str(metrics[k]) for k in keys))
    out().print(table)  # results go to stdout; progress and logs to stderr
    if cached_from is not None:
        out().print(f"teacher scores read from {cached_from}", soft_wrap=True)
    if is_rank0():
        record = {"num_samples": n, "dataset": dataset, "teacher_scores_cached": cached_from is not None,
                  "results": {name: metrics for name, _, metrics in results}}
        atomic_write_text(Path(run_dir) / "evaluation.json", json.dumps(record, indent=2) + "\n")


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


def _refuse_restarts_on_gloo(device: str) -> None:
    """``--max-restarts`` on CPU: after torchrun's agent restarts the workers, gloo's ``connectFullMesh`` fails
    ("Connection refused") when the new workers form their group (torch 2.13; plain torchrun fails the same way),
    so the restart the flag promises never trains. Refuse it up front instead of failing after the first crash."""
    from fastgen.utils.errors import UsageError

    if device == "cpu" or (device == "auto" and not _cuda_available()):
        raise UsageError("--max-restarts needs CUDA workers (NCCL): on CPU torch's gloo backend cannot re-form the "
                         "process group after a restart; drop the flag and rerun the command to resume")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
