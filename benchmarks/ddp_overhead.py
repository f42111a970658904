"""Distributed trainer overhead: fastgen's ``Trainer`` with ``trainer.ddp=True`` on 2 gloo ranks against a
minimal hand-written DDP loop on the same process group, network, loss and batch.

What is measured
----------------
Training steps per second of two loops on 2 ranks (one CPU thread each), both launched by torchrun's agent:

* **A - fastgen**: ``Trainer(config).run()`` on ``Digits/config_sft_digits`` with ``trainer.ddp=True``: the
  network replicated with torch's composable ``replicate`` (DDP's reducer), per-rank batch 32 (global 64), the
  trainer's per-step collective stop-flag check, the resumable rank-aware loader, ``SFTModel.single_train_step``
  and the optimizer step. The callbacks are off (``trainer.callbacks={}``: the hand-written loop has no clipping,
  EMA or logging either; ``benchmarks/overhead.py`` measures those in one process).
* **B - hand-written**: ``benchmarks/overhead.py``'s loop (same network, SFT EDM loss, Adam(1e-3)) with its
  network wrapped in ``torch.nn.parallel.DistributedDataParallel``, per-rank batch 32 drawn by random indices.

Both loops run in the same workers on the same gloo group. As in ``benchmarks/overhead.py`` they are interleaved
step by step (``A B A B ...``: a callback runs one hand-written step after every fastgen step, on both ranks, and
times each side separately), so both see the same machine state; each round has fresh models and its own
warm-up; the result is the median of the per-round ratios ``A steps/s / B steps/s`` (rank 0's clock; the ranks
wait for each other in every all-reduce, so their step times agree). Goal: ``>= 0.97``.

Usage (about 3 minutes on the 2-core machine)::

    python benchmarks/ddp_overhead.py [--rounds 5] [--steps 80] [--warmup 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # noqa: E402 - the single-process benchmark's hand-written loop and step timer

PER_RANK_BATCH = 32
WORLD = 2


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=80, help="timed steps per round (default: 80)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


class HandwrittenDDPLoop(overhead.HandwrittenLoop):
    """``overhead.HandwrittenLoop`` with its network in ``DistributedDataParallel`` and this rank's batch."""

    def __init__(self, seed: int) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        super().__init__(seed)
        self.module = self.net
        self.net = DistributedDataParallel(self.module)
        self.scheduler = self.module.noise_scheduler
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=overhead.LR)
        self.generator = torch.Generator().manual_seed(seed + 1 + dist.get_rank())

    def step(self) -> None:
        g = self.generator
        idx = torch.randint(0, self.images.shape[0], (PER_RANK_BATCH,), generator=g)
        x0, labels = self.images[idx], self.labels[idx]
        sigma = self.scheduler.sample_t(PER_RANK_BATCH, generator=g)
        eps = torch.randn(x0.shape, generator=g)
        x_t = self.scheduler.add_noise(x0, eps, sigma)
        pred = self.net(x_t, sigma, condition=labels)
        loss = (self.scheduler.loss_weight(sigma) * (pred - x0).square().flatten(1).mean(dim=1)).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.loss = loss.detach()


def _worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from fastgen.configs.config_utils import apply_overrides, load_config, validate_config
    from fastgen.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rows = []
    for r in range(1, args.rounds + 1):
        config = load_config(overhead.RECIPE)
        max_iter = args.warmup + args.steps
        apply_overrides(config, ["trainer.device=cpu", f"trainer.max_iter={max_iter}", f"trainer.seed={args.seed}",
                                 "trainer.resume=False", "trainer.validation_iter=null", "trainer.ddp=True",
                                 f"trainer.save_ckpt_iter={max_iter + 1_000_000}", "trainer.callbacks={}",
                                 f"dataloader_train.batch_size={PER_RANK_BATCH}", "log_config.wandb_mode=disabled",
                                 f"log_config.name=ddp_overhead_{r}"])
        config = validate_config(config)
        partner = HandwrittenDDPLoop(args.seed)
        timer = overhead._make_step_timer(args.warmup, args.steps, partner)
        Trainer(config, extra_callbacks={"overhead_timer": timer}).run()
        partner.check()
        a, b = timer.fastgen, timer.handwritten
        rows.append({"round": r, "fastgen_steps_per_s": len(a) / sum(a), "handwritten_steps_per_s": len(b) / sum(b),
                     "ratio": (len(a) / sum(a)) / (len(b) / sum(b)),
                     "median_step_ratio": statistics.median(b) / statistics.median(a)})
        if rank == 0:
            print(f"  round {r}: fastgen {rows[-1]['fastgen_steps_per_s']:.2f} steps/s, hand-written DDP "
                  f"{rows[-1]['handwritten_steps_per_s']:.2f} steps/s, ratio {rows[-1]['ratio']:.3f}", flush=True)
    if rank == 0:
        args.worker.write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.worker is not None:
        _worker(args)
        return 0
    from torch.distributed.run import get_args_parser, run

    workdir = Path(tempfile.mkdtemp(prefix="fastgen_ddp_overhead_"))
    os.environ.update(FASTGEN_OUTPUT_ROOT=str(workdir / "runs"), OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    result_file = workdir / "rows.json"
    print(f"fastgen DDP overhead: {overhead.RECIPE}, {WORLD} gloo ranks x batch {PER_RANK_BATCH}, {args.rounds} rounds "
          f"x ({args.warmup} warm-up + {args.steps} timed steps), interleaved by step, torch {torch.__version__}, "
          f"{os.cpu_count()} CPU(s)", flush=True)
    t0 = time.perf_counter()
    try:
        run(get_args_parser().parse_args([
            "--standalone", f"--nproc-per-node={WORLD}", str(Path(__file__).resolve()), "--rounds", str(args.rounds),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed),
            "--worker", str(result_file)]))
        rows: list[dict[str, Any]] = json.loads(result_file.read_text())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ratio = statistics.median(row["ratio"] for row in rows)
    step_ratio = statistics.median(row["median_step_ratio"] for row in rows)
    print()
    print("| round | fastgen steps/s | hand-written DDP steps/s | ratio | median-step ratio |")
    print("|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['round']} | {row['fastgen_steps_per_s']:.2f} | {row['handwritten_steps_per_s']:.2f} "
              f"| {row['ratio']:.3f} | {row['median_step_ratio']:.3f} |")
    print()
    print(f"median of the median-step ratios: {step_ratio:.3f}; wall time {time.perf_counter() - t0:.0f} s")
    print(f"goal: median ratio >= 0.97 -> {'met' if ratio >= 0.97 else 'NOT met'}")
    print(f"median ratio: {ratio:.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "median_ratio": ratio, "median_step_ratio": step_ratio,
                                         "goal": 0.97}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
