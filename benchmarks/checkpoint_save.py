"""Checkpoint saving: how long an asynchronous save blocks training, and how fast a monolithic save writes, both
measured on fastgen's ``CheckpointManager`` (``fastgen.utils.checkpoint_manager``) against a reference.

    .venv/bin/python benchmarks/checkpoint_save.py [--small] [--rounds 3] [--mono-rounds 5] [--warmup 1]
        [--only stall|throughput] [--json PATH]

What is saved
-------------
The state of ``EDM/config_sft_cifar10`` (``--small``: ``Digits/config_sft_digits``, for a quick smoke run): the
55M-parameter EDM U-Net ``net``, its ``ema`` copy, and Adam's state for ``net`` after one optimizer step (so
``exp_avg`` / ``exp_avg_sq`` exist), plus the LR scheduler. The method is built the way ``Trainer._build_model``
builds it (``instantiate(config.model_class)``, ``init_weights``, ``parallelize``), then ``init_optimizers``; the
one step uses constant gradients (no data: neither the dataset nor a data loader is built, so the loader entries
of the ``TrainingState`` are ``None``, and it carries no callbacks - ``trainer.callbacks={}``; both are a few bytes
of a checkpoint). The managers are built as the trainer builds its own (``trainer.checkpointer`` with
``async_save`` set, ``sharded=trainer.fsdp``) and save into a temporary folder, removed at the end.

1. Async save stall (goal <= 0.15)
----------------------------------
Two gloo ranks on CPU (one thread each), launched through torchrun's agent (``torch.distributed.run``, as
``benchmarks/ddp_overhead.py``), ``trainer.fsdp=True``: every network and the optimizer state are sharded with
FSDP2 and saved as sharded checkpoints (a DCP folder plus the marker ``.pth``). Per round, after a barrier:

* **async**: ``manager.save(state)`` with ``trainer.checkpointer.async_save=True`` is timed - that is how long the
  training loop is blocked (DCP's staging of each rank's shards into host copies, the save plan's collectives,
  the hand-off to DCP's writer thread) - then ``manager.wait()`` is timed on its own (the write, the fsyncs and
  the marker; in training it overlaps the following steps);
* **sync**: ``manager.save(state)`` with ``async_save=False`` (the same state; the whole write, fsyncs included).

Each rank times its own calls; the larger of the two ranks' durations counts (the collectives inside a save keep
the ranks together, so they differ little). **Ratio = async stall / sync save.** The order alternates every round
(async first in odd rounds); every save goes to a new checkpoint folder (a new iteration) and is deleted after the
round. ``--warmup`` untimed saves of each kind come first: the first asynchronous save of a run also creates the
manager's dedicated gloo group for asynchronous DCP (a collective, once per run) - its stall is reported
separately as ``first_stall_ratio``, not in the median.

2. Monolithic save throughput (goal >= 0.9)
-------------------------------------------
One process, no process group; ``CheckpointManager(sharded=False)``, ``async_save=False``. Per round, in rotating
order:

* **manager**: ``manager.save(state)`` - the payload (``full_state_dict`` / ``full_optimizer_state_dict`` of every
  network and optimizer, keyed by parameter name, plus the scheduler, RNG and per-rank entries), one
  ``torch.save`` into a temporary file in the checkpoint folder, ``flush`` + ``fsync``, ``os.replace`` onto
  ``{iteration:07d}.pth`` and an ``fsync`` of the folder (``fastgen.utils.io.atomic_open``);
* **torch.save**: ``torch.save({"model": {name: net.state_dict()}, "optimizers": {name: opt.state_dict()}}, path)``
  into the same folder - the same tensors (every network in ``model_dict``, each optimizer's own state dict),
  building the dict included in the timed window, no fsync, no rename;
* **torch.save + fsync** (reference, not a goal): the same plain payload written through
  ``fastgen.utils.io.atomic_write_with`` (temporary file, fsync, rename, folder fsync): the durability the manager
  pays for, without the manager. It tells the cost of the fsyncs apart from the manager's own work.

Throughput is (bytes of the file written) / (seconds), so the small differences in payload size (the manager's
names and extras) are fair. **Ratio = manager throughput / torch.save throughput**; a file is deleted right after
it is timed. No ``os.sync()`` is called around the timed windows: the page cache is in play for every side - a
plain ``torch.save`` finishes once its pages are in the cache, while the manager's ``fsync`` waits until they are
on the disk, which is the main difference between the two on a real disk (the third side shows how much).

Both results are the medians of the per-round ratios, with their min-max range; the machine is shared and noisy,
so only ratios of interleaved measurements are reported, never absolute times as results (the per-round times
are printed and in ``--json`` for context). About 1-2 minutes with ``--small``, several minutes at full size on
the 2-core machine (the full-size payload is ~840 MiB per monolithic save).
"""

from __future__ import annotations

import argparse
import copy
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
from overhead import _loadavg  # the load average, as the other benchmarks report it

RECIPE = "EDM/config_sft_cifar10"
SMALL_RECIPE = "Digits/config_sft_digits"
WORLD = 2
STALL_GOAL = 0.15
THROUGHPUT_GOAL = 0.9


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help=f"use {SMALL_RECIPE} (a quick smoke run) instead of "
                        f"{RECIPE}")
    parser.add_argument("--rounds", type=int, default=3, help="async/sync rounds on 2 ranks (default: 3)")
    parser.add_argument("--mono-rounds", type=int, default=5, help="monolithic manager/torch.save rounds "
                        "(default: 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed saves of each kind first (default: 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process (default: 1)")
    parser.add_argument("--only", choices=("stall", "throughput"), default=None, help="run one measurement")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--recipe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.mono_rounds < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--rounds, --mono-rounds and --threads must be positive, --warmup not negative")
    args.recipe = args.recipe or (SMALL_RECIPE if args.small else RECIPE)
    return args


# ------------------------------------------------------------------------------------------------ the state
def _config(recipe: str, overrides: list[str]) -> Any:
    from fastgen.configs.config_utils import (
        apply_overrides,
        load_config,
        validate_config,
    )

    config = load_config(recipe)
    apply_overrides(config, ["trainer.device=cpu", "trainer.resume=False", "trainer.callbacks={}",
                             "log_config.wandb_mode=disabled", *overrides])
    return validate_config(config)


def build_method(config: Any, mesh: Any) -> Any:
    """The method as ``Trainer._build_model`` builds it on a fresh run (not ``meta_init``), its optimizers, and one
    optimizer step with constant gradients (Adam's state then exists), and one scheduler step."""
    from fastgen.configs.instantiate import instantiate
    from fastgen.utils.parallelize import parallelize
    from fastgen.utils.rng import seed_everything

    seed_everything(config.trainer.seed)
    model = instantiate(config.model_class, config=config.model)
    model.to(torch.device("cpu"))
    model.init_weights()
    parallelize(model, config.trainer, mesh)
    model.train()
    model.init_optimizers()
    for optimizer in model.optimizer_dict.values():
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = torch.full_like(p, 1e-3)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for scheduler in model.scheduler_dict.values():
        scheduler.step()
    return model


def _manager(config: Any, run_dir: Path, sharded: bool, async_save: bool) -> Any:
    """A ``CheckpointManager`` as ``Trainer.__init__`` builds it, with ``async_save`` set."""
    from fastgen.utils.checkpoint_manager import CheckpointManager

    checkpointer = copy.deepcopy(config.trainer.checkpointer)
    checkpointer.async_save = async_save
    return CheckpointManager(checkpointer, run_dir, sharded=sharded, seed=config.trainer.seed)


def _state(model: Any, iteration: int) -> Any:
    from fastgen.callbacks.callback import CallbackDict
    from fastgen.utils.checkpoint_manager import TrainingState

    return TrainingState(model=model, callbacks=CallbackDict(), loaders={"train": None, "val": None},
                         iteration=iteration)


def _bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _parameters(model: Any) -> int:
    """The parameters of ``net`` (a sharded parameter's ``numel`` is the full tensor's)."""
    return sum(p.numel() for p in model.net.parameters())


def _ratio_summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


# --------------------------------------------------------------------------------- 1. async stall (2 ranks)
def _stall_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from fastgen.utils import distributed as dist_utils

    torch.set_num_threads(args.threads)
    config = _config(args.recipe, ["trainer.fsdp=True", "log_config.name=checkpoint_save_stall"])
    mesh = dist_utils.init_distributed(config.trainer)
    rank = dist.get_rank()
    model = build_method(config, mesh)
    root = args.worker.parent / "stall"
    managers = {"async": _manager(config, root / "async", sharded=True, async_save=True),
                "sync": _manager(config, root / "sync", sharded=True, async_save=False)}
    iteration = 0

    def timed_save(kind: str) -> dict[str, float]:
        nonlocal iteration
        iteration += 1
        manager = managers[kind]
        dist.barrier()
        t0 = time.perf_counter()
        marker = manager.save(_state(model, iteration))
        t1 = time.perf_counter()
        manager.wait()
        t2 = time.perf_counter()
        times = torch.tensor([t1 - t0, t2 - t1], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slower rank's durations
        size = 0
        dist.barrier()
        if rank == 0:
            marker = Path(marker)
            size = _bytes(marker) + _bytes(marker.with_suffix(".dcp"))
            marker.unlink()
            shutil.rmtree(marker.with_suffix(".dcp"))
        dist.barrier()
        return {"save_s": float(times[0]), "wait_s": float(times[1]), "bytes": size}

    first = {}
    for w in range(args.warmup):
        for kind in ("async", "sync"):
            timing = timed_save(kind)
            if w == 0:
                first[kind] = timing
    rows = []
    for r in range(1, args.rounds + 1):
        order = ("async", "sync") if r % 2 else ("sync", "async")
        timings = {kind: timed_save(kind) for kind in order}
        a, s = timings["async"], timings["sync"]
        row = {"round": r, "order": "/".join(order), "async_stall_s": a["save_s"], "async_wait_s": a["wait_s"],
               "sync_save_s": s["save_s"], "ratio": a["save_s"] / s["save_s"],
               "async_total_ratio": (a["save_s"] + a["wait_s"]) / s["save_s"], "checkpoint_bytes": s["bytes"]}
        rows.append(row)
        if rank == 0:
            print(f"  stall round {r} ({row['order']}): async stall {row['async_stall_s']:.3f} s (+ wait "
                  f"{row['async_wait_s']:.3f} s), sync save {row['sync_save_s']:.3f} s, ratio {row['ratio']:.3f}",
                  flush=True)
    if rank == 0:
        result = {"rows": rows, "parameters": _parameters(model),
                  "first": ({"stall_s": first["async"]["save_s"], "sync_s": first["sync"]["save_s"],
                             "ratio": first["async"]["save_s"] / first["sync"]["save_s"]} if first else None)}
        args.worker.write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def run_stall(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from torch.distributed.run import get_args_parser, run

    result_file = workdir / "stall.json"
    run(get_args_parser().parse_args([
        "--standalone", f"--nproc-per-node={WORLD}", str(Path(__file__).resolve()), "--recipe", args.recipe,
        "--rounds", str(args.rounds), "--warmup", str(args.warmup), "--threads", str(args.threads),
        "--worker", str(result_file)]))
    return json.loads(result_file.read_text())


# ------------------------------------------------------------------------- 2. monolithic throughput (1 process)
def run_throughput(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from fastgen.utils.io import atomic_write_with

    torch.set_num_threads(args.threads)
    config = _config(args.recipe, ["log_config.name=checkpoint_save_throughput"])
    model = build_method(config, None)
    manager = _manager(config, workdir / "throughput", sharded=False, async_save=False)
    folder = Path(manager.files.save_dir)
    folder.mkdir(parents=True, exist_ok=True)
    plain = folder / "plain.pt"
    iteration = 0

    def plain_payload() -> dict[str, Any]:
        return {"model": {name: net.state_dict() for name, net in model.model_dict.items()},
                "optimizers": {name: opt.state_dict() for name, opt in model.optimizer_dict.items()}}

    def timed(write: Any) -> tuple[float, int]:
        """Seconds of ``write()`` (which returns the file it wrote) and that file's size; the file is removed."""
        t0 = time.perf_counter()
        path = write()
        seconds = time.perf_counter() - t0
        size = path.stat().st_size
        path.unlink()
        return seconds, size

    def manager_save() -> Path:
        nonlocal iteration
        iteration += 1
        return Path(manager.save(_state(model, iteration)))

    def plain_save() -> Path:
        torch.save(plain_payload(), plain)
        return plain

    def plain_save_fsync() -> Path:
        payload = plain_payload()
        atomic_write_with(plain, lambda handle: torch.save(payload, handle))
        return plain

    sides = {"manager": manager_save, "torch_save": plain_save, "torch_save_fsync": plain_save_fsync}
    names = list(sides)
    for _ in range(args.warmup):
        for name in names:
            timed(sides[name])
    rows = []
    for r in range(1, args.mono_rounds + 1):
        order = names[(r - 1) % 3:] + names[:(r - 1) % 3]
        measured = {name: timed(sides[name]) for name in order}
        rate = {name: size / seconds for name, (seconds, size) in measured.items()}
        row = {"round": r, "order": "/".join(order),
               **{f"{name}_s": measured[name][0] for name in names},
               **{f"{name}_bytes": measured[name][1] for name in names},
               "ratio": rate["manager"] / rate["torch_save"],
               "ratio_vs_fsync": rate["manager"] / rate["torch_save_fsync"],
               "fsync_vs_plain": rate["torch_save_fsync"] / rate["torch_save"]}
        rows.append(row)
        print(f"  throughput round {r} ({row['order']}): manager {row['manager_s']:.3f} s, torch.save "
              f"{row['torch_save_s']:.3f} s, torch.save+fsync {row['torch_save_fsync_s']:.3f} s; "
              f"ratio {row['ratio']:.3f} (vs +fsync {row['ratio_vs_fsync']:.3f})", flush=True)
    return {"rows": rows, "parameters": _parameters(model)}


# --------------------------------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.worker is not None:
        _stall_worker(args)
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="fastgen_checkpoint_save_"))
    os.environ.update(FASTGEN_OUTPUT_ROOT=str(workdir / "runs"), OMP_NUM_THREADS=str(args.threads),
                      WANDB_MODE="disabled")
    print(f"fastgen checkpoint save: {args.recipe}, async stall on {WORLD} gloo ranks (FSDP2) x {args.rounds} rounds, "
          f"monolithic throughput x {args.mono_rounds} rounds, {args.warmup} warm-up save(s) each, torch "
          f"{torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPU(s), load average {_loadavg()}, "
          f"saving under {workdir}", flush=True)
    t_start = time.perf_counter()
    stall = throughput = None
    try:
        if args.only in (None, "stall"):
            stall = run_stall(args, workdir)
        if args.only in (None, "throughput"):
            throughput = run_throughput(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    result: dict[str, Any] = {"recipe": args.recipe, "torch": torch.__version__, "cpu_count": os.cpu_count(),
                              "threads": args.threads, "warmup": args.warmup}
    lines = []
    print()
    if stall is not None:
        rows = stall["rows"]
        print(f"1. async save stall, {WORLD} ranks, FSDP2 ({stall['parameters']:,} parameters in net; checkpoint "
              f"{rows[0]['checkpoint_bytes'] / 2**20:.1f} MiB)")
        print("| round | order | async stall / sync save | (async stall + wait) / sync save |")
        print("|---:|---|---:|---:|")
        for row in rows:
            print(f"| {row['round']} | {row['order']} | {row['ratio']:.3f} | {row['async_total_ratio']:.3f} |")
        summary = _ratio_summary([row["ratio"] for row in rows])
        total = _ratio_summary([row["async_total_ratio"] for row in rows])
        if stall["first"] is not None:
            print(f"first (warm-up) save: async stall / sync save {stall['first']['ratio']:.3f}")
        print(f"(async stall + wait) / sync save: median {total['median']:.3f} ({total['min']:.3f}-{total['max']:.3f})")
        result["stall"] = {**stall, "ratio": summary, "async_total_ratio": total, "goal": STALL_GOAL,
                           "goal_met": summary["median"] <= STALL_GOAL,
                           "first_stall_ratio": stall["first"]["ratio"] if stall["first"] else None}
        lines.append(f"async stall / sync save: median {summary['median']:.3f} (min-max {summary['min']:.3f}-"
                     f"{summary['max']:.3f}, {len(rows)} rounds); goal <= {STALL_GOAL} -> "
                     f"{'met' if summary['median'] <= STALL_GOAL else 'NOT met'}")
        print()
    if throughput is not None:
        rows = throughput["rows"]
        print(f"2. monolithic save throughput, 1 process ({throughput['parameters']:,} parameters in net; manager's "
              f"file {rows[0]['manager_bytes'] / 2**20:.1f} MiB, torch.save's "
              f"{rows[0]['torch_save_bytes'] / 2**20:.1f} MiB)")
        print("| round | order | manager / torch.save | manager / (torch.save + fsync) | (torch.save + fsync) / "
              "torch.save |")
        print("|---:|---|---:|---:|---:|")
        for row in rows:
            print(f"| {row['round']} | {row['order']} | {row['ratio']:.3f} | {row['ratio_vs_fsync']:.3f} "
                  f"| {row['fsync_vs_plain']:.3f} |")
        summary = _ratio_summary([row["ratio"] for row in rows])
        vs_fsync = _ratio_summary([row["ratio_vs_fsync"] for row in rows])
        fsync_cost = _ratio_summary([row["fsync_vs_plain"] for row in rows])
        print(f"manager / (torch.save + fsync + rename): median {vs_fsync['median']:.3f} "
              f"({vs_fsync['min']:.3f}-{vs_fsync['max']:.3f}); (torch.save + fsync) / torch.save: median "
              f"{fsync_cost['median']:.3f} ({fsync_cost['min']:.3f}-{fsync_cost['max']:.3f})")
        result["throughput"] = {**throughput, "ratio": summary, "ratio_vs_fsync": vs_fsync,
                                "fsync_vs_plain": fsync_cost, "goal": THROUGHPUT_GOAL,
                                "goal_met": summary["median"] >= THROUGHPUT_GOAL}
        lines.append(f"monolithic manager / torch.save throughput: median {summary['median']:.3f} (min-max "
                     f"{summary['min']:.3f}-{summary['max']:.3f}, {len(rows)} rounds); goal >= {THROUGHPUT_GOAL} -> "
                     f"{'met' if summary['median'] >= THROUGHPUT_GOAL else 'NOT met'}")
        print()
    wall = time.perf_counter() - t_start
    result["wall_s"] = wall
    print(f"wall time {wall:.0f} s, load average now {_loadavg()}")
    for line in lines:
        print(line)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
