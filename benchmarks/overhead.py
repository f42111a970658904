"""Trainer overhead: fastgen's ``Trainer`` against a minimal hand-written PyTorch loop, same work.

What is measured
----------------
Training steps per second of two loops that train the same network on the same data, in one process:

* **A - fastgen**: ``Trainer(config).run()`` on the quick-start recipe ``Digits/config_sft_digits`` with its
  default callbacks - ``grad_clip`` (global-norm clipping, non-finite check), ``ema`` (EDM2 power EMA) and
  ``wandb`` (scalar logging every ``trainer.logging_iter`` steps, in ``offline`` mode so nothing leaves the
  machine). Everything a real run does per step is inside the timed window: data loading from the resumable
  loader, ``SFTModel.single_train_step`` (condition dropout included), backward, the callbacks, the optimizer
  step, ``zero_grad``, the loss/log bookkeeping.
* **B - hand-written**: the same network (``instantiate(config.model.net)``), the same SFT EDM loss
  (``sigma = sample_t``, ``x_t = add_noise(x0, eps, sigma)``, ``pred = net(x_t, sigma, condition=labels)``,
  ``loss = mean(loss_weight(sigma) * mean_pixels((pred - x0)^2))``), batch 64 of the ``DigitsDataset`` train
  split drawn by random indices, ``Adam(lr=1e-3)``, ``zero_grad(set_to_none=True)``; no clipping, no EMA, no
  logging.

The ratio ``A / B`` is the fraction of the bare PyTorch speed that fastgen keeps: ``1 - ratio`` is what the
framework (its loop, callbacks, data loader and method wrapper) costs per step. The network is tiny (~1M
parameters, 8x8 images), so per-step Python and host-sync overhead is as visible here as it will ever be.

Kept out of the timed window
----------------------------
* setup: config loading, model / optimizer / data construction, ``wandb.init``;
* the first ``--warmup`` steps of every round (allocator and autograd warm-up);
* validation (``trainer.validation_iter=null``);
* checkpoints: ``trainer.save_ckpt_iter`` is set beyond ``max_iter``, and the one save the trainer always makes
  at ``max_iter`` runs after the last timed step;
* sample grids: ``trainer.callbacks.wandb.sample_iter=0`` turns off the periodic grid, and the final grid that
  ``WandbCallback.on_train_end`` always draws runs after the loop, as does ``wandb`` ``finish``.

Steps are timed by an extra callback (``StepTimer``, added last, so it runs after ``ema`` and ``wandb``) that
reads ``time.perf_counter()`` at ``on_training_step_end``; the timed window is from the end of step
``warmup`` to the end of step ``warmup + steps``. Work the trainer does after the hooks of step ``k`` (the
periodic loss log, the validation / checkpoint checks) lands in the interval of step ``k + 1``, so it is timed.
The hand-written loop is timed the same way, from the end of its step ``warmup`` to the end of step
``warmup + steps``.

Why rounds
----------
The benchmark machine has a few shared, noisy cores, so the two loops run alternately - ``A B A B ...`` for
``--rounds`` rounds, each a fresh model with ``--warmup`` untimed plus ``--steps`` timed steps - with
``torch.set_num_threads`` set once for both. Each round's ratio compares two measurements taken seconds apart;
the reported figure is the median of the per-round ratios, which drifts in machine load do not bias the way a
ratio of two long, separate runs would.

The goal
--------
``median ratio >= 0.95``. The reference system reaches about 0.85 on this machine: its gradient clipping checks
every gradient tensor for finiteness with a host sync per parameter, and its EMA is a Python loop over the
parameters. fastgen clips with one fused ``_foreach_norm`` and reads the single global norm once (one host sync
per step), and updates the EMA with one ``torch._foreach_lerp_``.

Usage::

    python benchmarks/overhead.py [--rounds 5] [--steps 150] [--warmup 10] [--threads N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

RECIPE = "Digits/config_sft_digits"
BATCH_SIZE = 64
LR = 1e-3


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="A/B round pairs (default: 5)")
    parser.add_argument("--steps", type=int, default=150, help="timed steps per round and loop (default: 150)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before each timed window (default: 10)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads for both loops (default: 1; see the module docstring)")
    parser.add_argument("--seed", type=int, default=0, help="seed of both loops (default: 0)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 1 or args.threads < 1:
        parser.error("--rounds, --steps, --warmup and --threads must be positive")
    return args


# ------------------------------------------------------------------------------------------------ A: fastgen
def _make_step_timer(warmup: int, steps: int) -> Any:
    from fastgen.callbacks.callback import Callback

    class StepTimer(Callback):
        """Records ``perf_counter`` at the end of steps ``warmup .. warmup + steps`` (completed-step counts)."""

        def __init__(self) -> None:
            self.stamps: dict[int, float] = {}

        def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                                 iteration: int = 0) -> None:
            if warmup <= iteration <= warmup + steps:
                self.stamps[iteration] = time.perf_counter()

    return StepTimer()


def _fastgen_config(run_name: str, max_iter: int, seed: int, workdir: Path) -> Any:
    from fastgen.configs.config_utils import apply_overrides, load_config, validate_config

    config = load_config(RECIPE)
    apply_overrides(config, [
        "trainer.device=cpu",
        f"trainer.max_iter={max_iter}",
        f"trainer.seed={seed}",
        "trainer.resume=False",
        "trainer.validation_iter=null",
        f"trainer.save_ckpt_iter={max_iter + 1_000_000}",
        "trainer.callbacks.wandb.sample_iter=0",
        "log_config.wandb_mode=offline",
        f"log_config.name={run_name}",
        f"credentials_dir={workdir / 'no_credentials'}",
    ])
    return validate_config(config)


def run_fastgen(round_index: int, warmup: int, steps: int, seed: int, workdir: Path) -> dict[str, float]:
    from fastgen.trainer import Trainer

    t_setup = time.perf_counter()
    config = _fastgen_config(f"overhead_round{round_index}", warmup + steps, seed, workdir)
    # The trainer's own batch size and step count are the ones the hand-written loop uses.
    assert config.dataloader_train.batch_size == BATCH_SIZE, config.dataloader_train.batch_size
    assert float(config.model.net_optimizer.lr) == LR, config.model.net_optimizer.lr
    timer = _make_step_timer(warmup, steps)
    trainer = Trainer(config, extra_callbacks={"overhead_timer": timer})
    trainer.run()
    t_done = time.perf_counter()
    if sorted(timer.stamps) != list(range(warmup, warmup + steps + 1)):
        raise RuntimeError(f"step timer saw iterations {sorted(timer.stamps)[:3]}..., expected {warmup}..{warmup + steps}")
    if trainer.accum_rounds != 1:
        raise RuntimeError(f"expected 1 accumulation round, the trainer ran {trainer.accum_rounds}")
    elapsed = timer.stamps[warmup + steps] - timer.stamps[warmup]
    return {"steps_per_s": steps / elapsed, "timed_s": elapsed, "total_s": t_done - t_setup}


# ------------------------------------------------------------------------------------------- B: hand-written
_DIGITS: tuple[torch.Tensor, torch.Tensor] | None = None


def _digits_train() -> tuple[torch.Tensor, torch.Tensor]:
    global _DIGITS
    if _DIGITS is None:
        from fastgen.datasets.digits import DigitsDataset

        dataset = DigitsDataset(split="train")
        _DIGITS = (dataset.images, dataset.labels)
    return _DIGITS


def run_handwritten(warmup: int, steps: int, seed: int) -> dict[str, float]:
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.instantiate import instantiate

    t_setup = time.perf_counter()
    config = load_config(RECIPE)
    images, labels = _digits_train()
    torch.manual_seed(seed)
    net = instantiate(config.model.net).to(torch.float32)
    net.train()
    scheduler = net.noise_scheduler
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(seed)
    n = images.shape[0]

    stamps: dict[int, float] = {}
    for step in range(1, warmup + steps + 1):
        idx = torch.randint(0, n, (BATCH_SIZE,), generator=generator)
        x0, cond = images[idx], labels[idx]
        sigma = scheduler.sample_t(BATCH_SIZE)
        eps = torch.randn_like(x0)
        x_t = scheduler.add_noise(x0, eps, sigma)
        pred = net(x_t, sigma, condition=cond)
        loss = (scheduler.loss_weight(sigma) * (pred - x0).square().flatten(1).mean(dim=1)).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= warmup:
            stamps[step] = time.perf_counter()
    t_done = time.perf_counter()
    if not torch.isfinite(loss):
        raise RuntimeError(f"hand-written loop diverged (loss {float(loss)})")
    elapsed = stamps[warmup + steps] - stamps[warmup]
    return {"steps_per_s": steps / elapsed, "timed_s": elapsed, "total_s": t_done - t_setup}


# --------------------------------------------------------------------------------------------------- driver
def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| round | fastgen steps/s | hand-written steps/s | ratio |", "|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['round']} | {row['fastgen_steps_per_s']:.1f} | {row['handwritten_steps_per_s']:.1f} "
                     f"| {row['ratio']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    t_start = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="fastgen_overhead_"))
    # Everything a run writes (run dirs, checkpoints, offline W&B runs, W&B's own config/cache) stays in workdir.
    os.environ["FASTGEN_OUTPUT_ROOT"] = str(workdir / "runs")
    for var, sub in (("WANDB_DIR", "wandb"), ("WANDB_CONFIG_DIR", "wandb_config"), ("WANDB_CACHE_DIR", "wandb_cache"),
                     ("WANDB_DATA_DIR", "wandb_data")):
        os.environ[var] = str(workdir / sub)
    os.environ["WANDB_SILENT"] = "true"
    os.environ.pop("WANDB_MODE", None)
    logging.getLogger("fastgen").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    print(f"fastgen trainer overhead: {RECIPE}, batch {BATCH_SIZE}, {args.rounds} rounds x "
          f"({args.warmup} warm-up + {args.steps} timed steps) per loop, torch {torch.__version__}, "
          f"{threads} thread(s), {os.cpu_count()} CPU(s)", flush=True)
    rows: list[dict[str, Any]] = []
    try:
        for r in range(1, args.rounds + 1):
            a = run_fastgen(r, args.warmup, args.steps, args.seed, workdir)
            b = run_handwritten(args.warmup, args.steps, args.seed)
            row = {"round": r, "fastgen_steps_per_s": a["steps_per_s"], "handwritten_steps_per_s": b["steps_per_s"],
                   "ratio": a["steps_per_s"] / b["steps_per_s"], "fastgen_round_s": a["total_s"],
                   "handwritten_round_s": b["total_s"]}
            rows.append(row)
            print(f"  round {r}: fastgen {row['fastgen_steps_per_s']:.1f} steps/s ({a['total_s']:.1f} s with setup), "
                  f"hand-written {row['handwritten_steps_per_s']:.1f} steps/s ({b['total_s']:.1f} s), "
                  f"ratio {row['ratio']:.3f}", flush=True)
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)

    median_ratio = statistics.median(row["ratio"] for row in rows)
    median_a = statistics.median(row["fastgen_steps_per_s"] for row in rows)
    median_b = statistics.median(row["handwritten_steps_per_s"] for row in rows)
    wall = time.perf_counter() - t_start
    print()
    print(_table(rows))
    print()
    print(f"median steps/s: fastgen {median_a:.1f}, hand-written {median_b:.1f} (goal: ratio >= 0.95)")
    print(f"wall time: {wall:.1f} s")
    print(f"median ratio: {median_ratio:.2f}")
    if args.json is not None:
        result = {
            "recipe": RECIPE, "batch_size": BATCH_SIZE, "rounds": args.rounds, "steps": args.steps,
            "warmup": args.warmup, "threads": threads, "seed": args.seed, "torch": torch.__version__,
            "python": platform.python_version(), "cpu_count": os.cpu_count(), "per_round": rows,
            "median_fastgen_steps_per_s": median_a, "median_handwritten_steps_per_s": median_b,
            "median_ratio": median_ratio, "wall_s": wall,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
