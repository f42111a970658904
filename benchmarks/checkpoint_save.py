"""Checkpoint saving: how long an asynchronous save blocks training, how fast a monolithic save writes, how much
memory a DDP save adds on each rank, and how many bytes a DMD2 checkpoint takes, all measured on fastgen's
``CheckpointManager`` (``fastgen.checkpoint.manager``) against a reference.

    .venv/bin/python benchmarks/checkpoint_save.py [--small] [--rounds 3] [--mono-rounds 5] [--warmup 1]
        [--rss-rounds 1] [--rss-method hwm|sample] [--bytes-edm] [--only stall|throughput|rss|bytes] [--json PATH]

What is saved
-------------
The state of ``EDM/config_sft_cifar10`` (``--small``: ``Digits/config_sft_digits``, for a quick smoke run): the
55M-parameter EDM U-Net ``net``, its ``ema`` copy, and Adam's state for ``net`` after one optimizer step (so
``exp_avg`` / ``exp_avg_sq`` exist), plus the LR scheduler. The method is built the way ``Trainer._build_model``
builds it (``instantiate(config.model_class)``, ``init_weights``, ``parallelize``), then ``init_optimizers``; the
one step uses constant gradients (no data: neither the dataset nor a data loader is built, so the loader entries
of the ``TrainingState`` are ``None``, and it carries no callbacks - ``trainer.callbacks={}``; both are a few bytes
of a checkpoint). The managers are built as the trainer builds its own (``trainer.checkpointer`` with
``async_save`` set, ``sharded=trainer.fsdp``) and save into a temporary folder, removed at the end. Measurement 4
builds a DMD2 method instead (its own section).

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

2. Monolithic save throughput (goal >= 0.95 against a durable torch.save)
-------------------------------------------------------------------------
One process, no process group; ``CheckpointManager(sharded=False)``, ``async_save=False``. Per round, in rotating
order:

* **manager**: ``manager.save(state)`` - the payload (``full_state_dict`` / ``full_optimizer_state_dict`` of every
  network and optimizer, keyed by parameter name, plus the scheduler, RNG and per-rank entries), one
  ``torch.save`` into a temporary file in the checkpoint folder, ``flush`` + ``fsync``, ``os.replace`` onto
  ``{iteration:07d}.pth`` and an ``fsync`` of the folder (``fastgen.utils.io.atomic_open``);
* **torch.save**: ``torch.save({"model": {name: net.state_dict()}, "optimizers": {name: opt.state_dict()}}, path)``
  into the same folder - the same tensors (every network in ``model_dict``, each optimizer's own state dict),
  building the dict included in the timed window, no fsync, no rename;
* **torch.save + fsync** (the reference of the goal): the same plain payload written through
  ``fastgen.utils.io.atomic_write_with`` (temporary file, fsync, rename, folder fsync): the durability the manager
  pays for, without the manager - so the ratio measures the manager's own work, not the fsyncs.

Throughput is (bytes of the file written) / (seconds), so the small differences in payload size (the manager's
names and extras) are fair. **Ratio = manager throughput / (torch.save + fsync + rename) throughput**, the goal's
figure (``ratio_vs_fsync`` in ``--json``); manager / plain ``torch.save`` (``ratio``) and (torch.save + fsync) /
torch.save (``fsync_vs_plain``) are reported as information. A file is deleted right after it is timed. No
``os.sync()`` is called around the timed windows: the page cache is in play for every side - a plain
``torch.save`` finishes once its pages are in the cache, while an ``fsync`` waits until they are on the disk. The
goal was once stated against the plain ``torch.save``; the manager keeps its fsync (a checkpoint whose name exists
is complete, also after a power loss), so the fair reference is the same durable write.

Both results are the medians of the per-round ratios, with their min-max range; the machine is shared and noisy,
so only ratios of interleaved measurements are reported, never absolute times as results (the per-round times
are printed and in ``--json`` for context).

3. Peak RSS of a DDP save (goals: rank 0 <= 1.1, every other rank <= 0.1)
-------------------------------------------------------------------------
Two gloo ranks launched as in 1., but ``trainer.ddp=True``, ``trainer.fsdp=False``: every rank holds the whole
state and the manager writes monolithic checkpoints (``sharded=False``), rank 0 alone building the payload and
writing the file. Per round, a synchronous save (``async_save=False``) and an asynchronous one (``async_save=True``;
its ``manager.wait()`` is inside the measured window, so the host copy the background write needs is counted);
sync first in odd rounds, async first in even ones. Each rank measures its own process:

* **baseline**: ``VmRSS`` right before the save, after ``gc.collect()`` and glibc's ``malloc_trim(0)`` (so memory
  an earlier save freed, but the allocator kept, cannot be reused unseen - the growth is what the save needs);
* **peak**: ``VmHWM`` at the end, after resetting it to the baseline by writing ``5`` to ``/proc/self/clear_refs``
  just before the save (the kernel's high-water mark: exact, every thread included, nothing running beside the
  save). Where that reset is refused or ineffective (or with ``--rss-method sample``), a thread samples
  ``VmRSS`` every millisecond instead; both agree to 0.1 MiB on the development machine.

**Ratio = (peak - baseline) / state bytes**, per rank and kind, where the state bytes are the tensors' bytes of
the saved state, computed from the model (``state_bytes``: every network of ``model_dict`` but the frozen ones,
i.e. ``net`` and its EMA, plus each optimizer's state - Adam's ``exp_avg``, ``exp_avg_sq``, ``step``; ~840 MiB at
full size). The goal figure is each (kind, rank)'s largest ratio over ``--rss-rounds``. The goals: an async save
may hold one host copy of the state on rank 0 (1.0) plus 10%; a sync save needs no copy; the other ranks write
nothing, so they must not build the payload (0.1 leaves room for the collectives and the first save's one-time
allocations, ~1.5 MiB). The goals are for the full-size state: ``--small``'s is 15.7 MiB, so that one-time
growth alone reads 0.10-0.15 there.

4. Checkpoint bytes of DMD2 (goal <= 1.02)
------------------------------------------
One process, no process group: the DMD2 method of ``Digits/config_dmd2_digits`` (``--bytes-edm``:
``EDM/config_dmd2_fast`` with a random teacher, ``model.teacher_ckpt=null``: ~1.5 GiB of state; about 20 s) built
as above - ``init_weights``, ``init_optimizers``, one step of every optimizer with constant gradients - and saved
once through ``CheckpointManager(sharded=False)``, ``async_save=False``. **Ratio = bytes of the file / (bytes of the
trained networks + their EMA networks + every optimizer's state)**, the denominator from the model's tensors
(``state_bytes``: ``model_dict`` minus ``frozen_modules``, e.g. the teacher, which a checkpoint need not hold: it is
rebuilt from its source). The file is measured as written, whatever the manager chooses to put in it; 2% leaves
room for ``torch.save``'s per-tensor records and the pickled names and extras. A checkpoint that also holds the
frozen teacher measures ~1.16 (digits) / ~1.14 (EDM); ``file / (state + frozen networks)`` is printed as
information.

Times on the 2-core machine: with ``--small`` about a minute for all four (shared, load 5-7); at full size
``stall`` and ``throughput`` ~40 s together when idle (``throughput`` alone, 3 rounds: ~15 s), ``rss`` ~20 s,
``bytes`` ~5 s (~20 s with ``--bytes-edm``). The full-size payload is ~840 MiB per monolithic save.
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
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import _loadavg  # the load average, as the other benchmarks report it

RECIPE = "EDM/config_sft_cifar10"
SMALL_RECIPE = "Digits/config_sft_digits"
BYTES_RECIPE = "Digits/config_dmd2_digits"
BYTES_EDM_RECIPE = "EDM/config_dmd2_fast"
BYTES_EDM_OVERRIDES = ["model.teacher_ckpt=null"]  # a random teacher: the file's size does not depend on its weights
WORLD = 2
STALL_GOAL = 0.15
THROUGHPUT_GOAL = 0.95  # manager / durable torch.save (fsync + rename)
RSS_GOALS = {0: 1.1, 1: 0.1}  # peak RSS growth / state bytes, by rank
BYTES_GOAL = 1.02
MEASUREMENTS = ("stall", "throughput", "rss", "bytes")


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
    parser.add_argument("--rss-rounds", type=int, default=1, help="sync/async saves whose peak RSS is measured, "
                        "per kind (default: 1)")
    parser.add_argument("--rss-method", choices=("hwm", "sample"), default="hwm",
                        help="peak RSS from VmHWM reset through /proc/self/clear_refs (default; falls back to "
                        "sampling where it cannot be reset), or from a thread sampling VmRSS every 1 ms")
    parser.add_argument("--bytes-edm", action="store_true", help=f"measure bytes on {BYTES_EDM_RECIPE} (random "
                        f"teacher; ~1.5 GiB of state) instead of {BYTES_RECIPE}")
    parser.add_argument("--only", choices=MEASUREMENTS, default=None, help="run one measurement")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--recipe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-kind", choices=("stall", "rss"), default="stall", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if (args.rounds < 1 or args.mono_rounds < 1 or args.rss_rounds < 1 or args.warmup < 0
            or args.threads < 1):
        parser.error("--rounds, --mono-rounds, --rss-rounds and --threads must be positive, --warmup not negative")
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
    from fastgen.distributed.parallelize import parallelize
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
    from fastgen.checkpoint.manager import CheckpointManager

    checkpointer = copy.deepcopy(config.trainer.checkpointer)
    checkpointer.async_save = async_save
    return CheckpointManager(checkpointer, run_dir, sharded=sharded, seed=config.trainer.seed)


def _state(model: Any, iteration: int) -> Any:
    from fastgen.callbacks.callback import CallbackDict
    from fastgen.checkpoint.manager import TrainingState

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


def _tensor_bytes(tree: Any, seen: set[tuple[int, int]]) -> int:
    """Bytes of the tensors in a nested dict / list / tuple; a memory region already in ``seen`` (a tensor shared
    by two entries, which ``torch.save`` writes once) is not counted again."""
    if isinstance(tree, torch.Tensor):
        key = (tree.data_ptr(), tree.nbytes)
        if tree.nbytes == 0 or key in seen:
            return 0
        seen.add(key)
        return tree.nbytes
    if isinstance(tree, dict):
        return sum(_tensor_bytes(value, seen) for value in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_tensor_bytes(value, seen) for value in tree)
    return 0


def state_bytes(model: Any) -> dict[str, Any]:
    """The bytes a checkpoint must hold, from the model's tensors: every network in ``model_dict`` except the
    frozen ones (``frozen_modules``, e.g. a distillation's teacher, which are rebuilt from their source and need
    not be saved) - the trained networks and their EMA copies - and each optimizer's state (Adam: ``exp_avg``,
    ``exp_avg_sq``, ``step``). The frozen networks' bytes are reported apart, for information."""
    frozen = set(getattr(model, "frozen_modules", ()) or ())
    seen: set[tuple[int, int]] = set()
    networks = {name: _tensor_bytes(module.state_dict(), seen)
                for name, module in model.model_dict.items() if name not in frozen}
    optimizers = {name: _tensor_bytes(optimizer.state_dict()["state"], seen)
                  for name, optimizer in model.optimizer_dict.items()}
    frozen_bytes = {name: _tensor_bytes(module.state_dict(), set())
                    for name, module in model.model_dict.items() if name in frozen}
    return {"networks": networks, "optimizers": optimizers, "frozen": frozen_bytes,
            "total": sum(networks.values()) + sum(optimizers.values())}


def _status_kib(field: str) -> int:
    """A ``VmRSS`` / ``VmHWM`` line of ``/proc/self/status``, in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _release_free_memory() -> None:
    """Collect garbage and hand the allocator's free pages back to the kernel (glibc's ``malloc_trim``), so that a
    baseline does not include memory freed by an earlier save that this save would reuse - that would hide
    part of its growth. Without glibc only the garbage is collected."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakRss:
    """The peak resident set size of this process during a ``with`` block, and its baseline just before.

    ``hwm``: the kernel's high-water mark ``VmHWM``, reset to the current RSS by writing ``5`` to
    ``/proc/self/clear_refs`` on entry. The kernel updates it before any page is unmapped, so it is exact
    (every thread of the process included: an async save's writer thread too) and costs nothing while the block
    runs. Where the reset is refused or has no effect (an old kernel, a sandbox), or with ``sample``: a daemon
    thread reads ``VmRSS`` every millisecond - a peak shorter than that, or one while the thread waits for the
    GIL, can be missed."""

    def __init__(self, method: str = "hwm") -> None:
        self.method = method
        self.baseline_kib = 0
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        _release_free_memory()
        self.baseline_kib = _status_kib("VmRSS")
        if self.method == "hwm" and not self._reset_hwm():
            self.method = "sample"
        if self.method == "sample":
            self.peak_kib = self.baseline_kib
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, name="peak-rss-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.peak_kib = max(self.peak_kib, _status_kib("VmRSS"))
        else:
            self.peak_kib = _status_kib("VmHWM")

    def _reset_hwm(self) -> bool:
        """Reset ``VmHWM`` to the current RSS; False where that is refused or does not take effect (the mark
        would then still be at the build's peak, above the baseline)."""
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")
        except OSError:
            return False
        return _status_kib("VmHWM") <= _status_kib("VmRSS") + 1024

    def _sample(self) -> None:
        with open("/proc/self/status", "rb", buffering=0) as status:
            while not self._stop.wait(0.001):
                status.seek(0)
                for line in status.read().split(b"\n"):
                    if line.startswith(b"VmRSS:"):
                        self.peak_kib = max(self.peak_kib, int(line.split()[1]))
                        break

    @property
    def growth_bytes(self) -> int:
        return max(0, self.peak_kib - self.baseline_kib) * 1024


# --------------------------------------------------------------------------------- 1. async stall (2 ranks)
def _two_rank_setup(args: argparse.Namespace, kind: str, sharded: bool) -> tuple[Any, int, Any, dict[str, Any]]:
    """A worker's process group, method and two managers (``async`` and ``sync``) saving under ``kind``'s folder:
    FSDP2 with sharded checkpoints, or DDP with monolithic ones."""
    import torch.distributed as dist

    from fastgen.distributed import group as dist_utils

    layout = ["trainer.fsdp=True"] if sharded else ["trainer.ddp=True", "trainer.fsdp=False"]
    config = _config(args.recipe, [*layout, f"log_config.name=checkpoint_save_{kind}"])
    mesh = dist_utils.init_distributed(config.trainer)
    model = build_method(config, mesh)
    root = args.worker.parent / kind
    managers = {"async": _manager(config, root / "async", sharded=sharded, async_save=True),
                "sync": _manager(config, root / "sync", sharded=sharded, async_save=False)}
    return config, dist.get_rank(), model, managers


def _stall_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    config, rank, model, managers = _two_rank_setup(args, "stall", sharded=True)
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


def _launch(args: argparse.Namespace, kind: str, result_file: Path) -> dict[str, Any]:
    """Run this script's ``kind`` worker on ``WORLD`` ranks through torchrun's agent; rank 0 writes the result."""
    from torch.distributed.run import get_args_parser, run

    run(get_args_parser().parse_args([
        "--standalone", f"--nproc-per-node={WORLD}", str(Path(__file__).resolve()), "--recipe", args.recipe,
        "--rounds", str(args.rounds), "--warmup", str(args.warmup), "--threads", str(args.threads),
        "--rss-rounds", str(args.rss_rounds), "--rss-method", args.rss_method,
        "--worker", str(result_file), "--worker-kind", kind]))
    return json.loads(result_file.read_text())


def run_stall(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return _launch(args, "stall", workdir / "stall.json")


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


# ------------------------------------------------------------------------ 3. peak RSS of a DDP save (2 ranks)
def _rss_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    config, rank, model, managers = _two_rank_setup(args, "rss", sharded=False)
    saved = state_bytes(model)
    iteration = 0

    def measured_save(kind: str) -> dict[str, Any]:
        """One save of ``kind`` (with its ``wait``) inside ``PeakRss``; every rank's figures, on rank 0."""
        nonlocal iteration
        iteration += 1
        manager = managers[kind]
        dist.barrier()
        with PeakRss(args.rss_method) as peak:
            t0 = time.perf_counter()
            marker = Path(manager.save(_state(model, iteration)))
            manager.wait()
            seconds = time.perf_counter() - t0
        own = {"rank": rank, "baseline_bytes": peak.baseline_kib * 1024, "peak_bytes": peak.peak_kib * 1024,
               "growth_bytes": peak.growth_bytes, "ratio": peak.growth_bytes / saved["total"],
               "method": peak.method, "seconds": seconds}
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, own)
        size = 0
        if rank == 0:
            size = marker.stat().st_size
            marker.unlink()
        dist.barrier()
        return {"kind": kind, "iteration": iteration, "file_bytes": size, "ranks": every}

    rows = []
    for r in range(1, args.rss_rounds + 1):
        # sync first in odd rounds: each baseline is taken after the allocator returned its free pages
        # (``_release_free_memory``), so an earlier save's freed memory does not hide a later one's growth
        order = ("sync", "async") if r % 2 else ("async", "sync")
        for kind in order:
            row = {"round": r, **measured_save(kind)}
            rows.append(row)
            if rank == 0:
                print(f"  rss round {r} {kind}: " + ", ".join(
                    f"rank {e['rank']} +{e['growth_bytes'] / 2**20:.1f} MiB ({e['ratio']:.3f}, {e['method']})"
                    for e in row["ranks"]), flush=True)
    if rank == 0:
        args.worker.write_text(json.dumps({"rows": rows, "state": saved, "parameters": _parameters(model)}))
    dist.barrier()
    dist.destroy_process_group()


def run_rss(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return _launch(args, "rss", workdir / "rss.json")


# ------------------------------------------------------------------------------ 4. checkpoint bytes of DMD2
def run_bytes(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    recipe, overrides = (BYTES_EDM_RECIPE, BYTES_EDM_OVERRIDES) if args.bytes_edm else (BYTES_RECIPE, [])
    config = _config(recipe, ["log_config.name=checkpoint_save_bytes", *overrides])
    model = build_method(config, None)
    saved = state_bytes(model)
    manager = _manager(config, workdir / "bytes", sharded=False, async_save=False)
    marker = Path(manager.save(_state(model, 1)))
    file_bytes = marker.stat().st_size
    marker.unlink()
    return {"recipe": recipe, "overrides": overrides, "file_bytes": file_bytes, "state": saved,
            "modules": list(model.model_dict), "frozen_modules": list(getattr(model, "frozen_modules", ()) or ()),
            "ratio": file_bytes / saved["total"],
            "ratio_with_frozen": file_bytes / (saved["total"] + sum(saved["frozen"].values()))}


# --------------------------------------------------------------------------------------------------- driver
def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _report_rss(rss: dict[str, Any], lines: list[str]) -> dict[str, Any]:
    """Print the RSS table; the goal figure per (kind, rank) is the largest ratio over the rounds."""
    state = rss["state"]
    print(f"3. peak RSS growth of a monolithic save, {WORLD} ranks, DDP ({rss['parameters']:,} parameters in net; "
          f"state {_mib(state['total'])}: networks {_mib(sum(state['networks'].values()))} "
          f"({', '.join(state['networks'])}), optimizer states {_mib(sum(state['optimizers'].values()))})")
    print("| round | save | rank | RSS before | peak growth | growth / state bytes | method | seconds |")
    print("|---:|---|---:|---:|---:|---:|---|---:|")
    worst: dict[str, dict[int, float]] = {}
    for row in rss["rows"]:
        for entry in row["ranks"]:
            print(f"| {row['round']} | {row['kind']} | {entry['rank']} | {_mib(entry['baseline_bytes'])} | "
                  f"{_mib(entry['growth_bytes'])} | {entry['ratio']:.3f} | {entry['method']} | "
                  f"{entry['seconds']:.2f} |")
            ratios = worst.setdefault(row["kind"], {})
            ratios[entry["rank"]] = max(ratios.get(entry["rank"], 0.0), entry["ratio"])
    met = all(ratio <= RSS_GOALS[min(rank, 1)] for ratios in worst.values() for rank, ratio in ratios.items())
    figures = "; ".join(f"{kind}: " + ", ".join(f"rank {rank} {ratio:.3f}" for rank, ratio in sorted(ratios.items()))
                        for kind, ratios in worst.items())
    lines.append(f"DDP save peak RSS growth / state bytes ({figures}); goals rank 0 <= {RSS_GOALS[0]}, other ranks "
                 f"<= {RSS_GOALS[1]} -> {'met' if met else 'NOT met'}")
    by_kind = {kind: {str(rank): ratio for rank, ratio in ratios.items()} for kind, ratios in worst.items()}
    return {**rss, "ratio": by_kind, "goal": {"rank0": RSS_GOALS[0], "other_ranks": RSS_GOALS[1]}, "goal_met": met}


def _report_bytes(measured: dict[str, Any], lines: list[str]) -> dict[str, Any]:
    state = measured["state"]
    frozen = sum(state["frozen"].values())
    print(f"4. checkpoint bytes, {measured['recipe']} (modules {', '.join(measured['modules'])}; frozen: "
          f"{', '.join(measured['frozen_modules']) or 'none'})")
    print("| part | bytes |")
    print("|---|---:|")
    for name, size in state["networks"].items():
        print(f"| network {name} | {size:,} |")
    for name, size in state["optimizers"].items():
        print(f"| optimizer {name} | {size:,} |")
    print(f"| **trained + EMA networks + optimizer states** | **{state['total']:,}** |")
    for name, size in state["frozen"].items():
        print(f"| (frozen {name}, not counted) | {size:,} |")
    print(f"| checkpoint file | {measured['file_bytes']:,} |")
    print(f"file / (that state + the frozen networks), information: {measured['ratio_with_frozen']:.4f} "
          f"(frozen networks {_mib(frozen)})")
    met = measured["ratio"] <= BYTES_GOAL
    lines.append(f"DMD2 checkpoint bytes / (trained + EMA networks + optimizer states): {measured['ratio']:.4f} "
                 f"({measured['recipe']}); goal <= {BYTES_GOAL} -> {'met' if met else 'NOT met'}")
    return {**measured, "goal": BYTES_GOAL, "goal_met": met}


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.worker is not None:
        (_rss_worker if args.worker_kind == "rss" else _stall_worker)(args)
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="fastgen_checkpoint_save_"))
    os.environ.update(FASTGEN_OUTPUT_ROOT=str(workdir / "runs"), OMP_NUM_THREADS=str(args.threads),
                      WANDB_MODE="disabled")
    print(f"fastgen checkpoint save: {args.recipe}, async stall on {WORLD} gloo ranks (FSDP2) x {args.rounds} rounds, "
          f"monolithic throughput x {args.mono_rounds} rounds, {args.warmup} warm-up save(s) each; peak RSS of a "
          f"{WORLD}-rank DDP save x {args.rss_rounds} round(s); checkpoint bytes of "
          f"{BYTES_EDM_RECIPE if args.bytes_edm else BYTES_RECIPE}; only {args.only or 'all'}; torch "
          f"{torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPU(s), load average {_loadavg()}, "
          f"saving under {workdir}", flush=True)
    t_start = time.perf_counter()
    runs = {"stall": run_stall, "throughput": run_throughput, "rss": run_rss, "bytes": run_bytes}
    measured: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    try:
        for name, measure in runs.items():
            if args.only in (None, name):
                t0 = time.perf_counter()
                measured[name] = measure(args, workdir)
                seconds[name] = time.perf_counter() - t0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    stall, throughput = measured.get("stall"), measured.get("throughput")

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
        print(f"manager / torch.save (not durable; information): median {summary['median']:.3f} "
              f"({summary['min']:.3f}-{summary['max']:.3f}); (torch.save + fsync) / torch.save: median "
              f"{fsync_cost['median']:.3f} ({fsync_cost['min']:.3f}-{fsync_cost['max']:.3f})")
        met = vs_fsync["median"] >= THROUGHPUT_GOAL
        result["throughput"] = {**throughput, "ratio": summary, "ratio_vs_fsync": vs_fsync,
                                "fsync_vs_plain": fsync_cost, "goal_of": "ratio_vs_fsync", "goal": THROUGHPUT_GOAL,
                                "goal_met": met}
        lines.append(f"monolithic manager / durable torch.save (fsync + rename) throughput: median "
                     f"{vs_fsync['median']:.3f} (min-max {vs_fsync['min']:.3f}-{vs_fsync['max']:.3f}, {len(rows)} "
                     f"rounds); goal >= {THROUGHPUT_GOAL} -> {'met' if met else 'NOT met'}")
        print()
    if "rss" in measured:
        result["rss"] = _report_rss(measured["rss"], lines)
        print()
    if "bytes" in measured:
        result["bytes"] = _report_bytes(measured["bytes"], lines)
        print()
    wall = time.perf_counter() - t_start
    result["wall_s"] = wall
    result["measurement_s"] = seconds
    print(f"wall time {wall:.0f} s, load average now {_loadavg()}")
    for line in lines:
        print(line)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
