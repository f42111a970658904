"""What keyed training noise costs: the generator against ``torch.randn``, and the quick-start's it/s with and
without it.

1. **Generator** (``--part generator``): ``KeyedNoise(seed, ids, step).randn(shape)`` (``fastgen.distributed.keyed_rng``:
   lowbias32 hash per element, Box-Muller) against ``torch.randn(shape)`` on the CPU, for a 64x1x8x8 batch (the
   digits quick-start) and a 512x3x32x32 batch (CIFAR-10 at batch 512). The two alternate call by call (``A B A B
   ...``) so both see the same machine state; each side keeps its median and its fastest call, and the ratio is
   keyed / randn. Run at ``--threads`` intra-op threads (default 1 and 2).
2. **Quick start** (``--part quickstart``): ``fastgen train - trainer.max_iter=200 log_config.name=...`` (the
   default recipe, DMD2 on digits, ``Digits/config_dmd2_digits``), keyed as shipped against the same command with
   ``FastGenModel.bind_batch`` patched to torch's global generator (what every draw used before keyed noise:
   the same calls, in the same order). Runs alternate ``keyed, global, keyed, global ...``; the it/s is the
   trainer's logged rate over iterations 101-200 (start-up, the first 100 steps and the final checkpoint are
   outside it); the result is the median of the per-round ratios keyed / global. On a shared machine whose speed
   drifts over tens of seconds this is coarse (the trainer logs one decimal), hence part 3.
3. **Steps** (``--part steps``): the quick-start's own training step (model, optimizers and data loader of
   ``Digits/config_dmd2_digits``, batch 64; forward, backward and optimizer step, student and critic iterations
   alternating as in training) timed in one process, keyed and global alternating step by step (``A B B A ...``)
   so both see the same machine state; the ratio of the median step times keyed / global.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/keyed_noise.py [--part generator|quickstart|steps|all]
                                                                 [--rounds 3] [--steps 200]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fastgen.distributed.keyed_rng import KeyedNoise

SHAPES = ((64, 1, 8, 8), (512, 3, 32, 32))
GLOBAL_NOISE_TRAIN = """
import contextlib, sys
from fastgen.methods.model import FastGenModel
from fastgen.distributed.keyed_rng import GLOBAL_NOISE

@contextlib.contextmanager
def _global(self, data, iteration, seed, stream="train"):
    yield GLOBAL_NOISE

FastGenModel.bind_batch = _global
from fastgen.cli.main import main
sys.argv = ["fastgen", *sys.argv[1:]]
sys.exit(main())
"""


def time_generator(shape: tuple[int, ...], calls: int) -> dict[str, float]:
    ids = torch.arange(shape[0])
    keyed, randn = [], []
    for step in range(calls + 3):
        t0 = time.perf_counter()
        KeyedNoise(0, ids, step).randn(shape)
        t1 = time.perf_counter()
        torch.randn(shape)
        t2 = time.perf_counter()
        if step >= 3:  # warm-up calls
            keyed.append(t1 - t0)
            randn.append(t2 - t1)
    return {"keyed_median_ms": 1e3 * statistics.median(keyed), "randn_median_ms": 1e3 * statistics.median(randn),
            "keyed_min_ms": 1e3 * min(keyed), "randn_min_ms": 1e3 * min(randn)}


def generator_part(threads: list[int], calls: int) -> None:
    print("| threads | shape | keyed median (ms) | randn median (ms) | ratio (median) | ratio (fastest) |")
    print("|---:|---|---:|---:|---:|---:|")
    for n in threads:
        torch.set_num_threads(n)
        for shape in SHAPES:
            r = time_generator(shape, calls if shape[0] > 64 else 10 * calls)
            print(f"| {n} | {'x'.join(map(str, shape))} | {r['keyed_median_ms']:.3f} | {r['randn_median_ms']:.3f} | "
                  f"{r['keyed_median_ms'] / r['randn_median_ms']:.2f} | {r['keyed_min_ms'] / r['randn_min_ms']:.2f} |",
                  flush=True)


def run_train(keyed: bool, root: Path, name: str) -> float:
    """One quick-start run; the logged it/s of its last window (iterations 101-200)."""
    command = [sys.executable, "-m", "fastgen.cli.main"] if keyed else [sys.executable, "-c", GLOBAL_NOISE_TRAIN]
    env = {**os.environ, "FASTGEN_OUTPUT_ROOT": str(root), "WANDB_MODE": "disabled", "FASTGEN_NO_PROGRESS": "1"}
    out = subprocess.run([*command, "train", "--eval-samples", "0", "-", "trainer.max_iter=200",
                          f"log_config.name={name}"], env=env, capture_output=True, text=True, check=True)
    rates = re.findall(r"iteration 200/200 .*?([0-9.]+) it/s", out.stdout + out.stderr)
    if not rates:
        raise RuntimeError(f"no it/s in the output of {name}:\n{(out.stdout + out.stderr)[-2000:]}")
    return float(rates[-1])


def quickstart_part(rounds: int) -> None:
    ratios = []
    print("| round | keyed it/s | global it/s | ratio |")
    print("|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            keyed = run_train(True, Path(tmp), f"keyed{i}")
            plain = run_train(False, Path(tmp), f"global{i}")
            ratios.append(keyed / plain)
            print(f"| {i + 1} | {keyed:.2f} | {plain:.2f} | {ratios[-1]:.3f} |", flush=True)
    print(f"median ratio keyed / global: {statistics.median(ratios):.3f}")


def steps_part(steps: int) -> None:
    from fastgen.configs.config_utils import load_config, validate_config
    from fastgen.configs.instantiate import instantiate
    from fastgen.distributed.keyed_rng import GLOBAL_NOISE

    torch.manual_seed(0)
    config = validate_config(load_config("Digits/config_dmd2_digits"))
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    model.init_optimizers()
    model.train()
    loader = instantiate(config.dataloader_train)
    times: dict[str, list[float]] = {"keyed": [], "global": []}
    for i in range(steps + 4):
        data = next(loader)
        for arm in (("keyed", "global") if i % 2 else ("global", "keyed")):
            t0 = time.perf_counter()
            if arm == "keyed":
                with model.bind_batch(data, i, seed=0):
                    loss, _ = model.single_train_step(data, i)
            else:
                assert model.rng is GLOBAL_NOISE
                loss, _ = model.single_train_step(data, i)
            loss["total_loss"].backward()
            for name in model.get_optimizers(i):
                model.optimizers[name].step()
            for optimizer in model.optimizers.values():
                optimizer.zero_grad(set_to_none=True)
            if i >= 4:  # warm-up steps
                times[arm].append(time.perf_counter() - t0)
    keyed, plain = statistics.median(times["keyed"]), statistics.median(times["global"])
    print(f"quick-start step ({steps} steps per side, alternating): keyed {1e3 * keyed:.1f} ms, global "
          f"{1e3 * plain:.1f} ms, ratio keyed / global {keyed / plain:.3f} (it/s ratio {plain / keyed:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--part", choices=("generator", "quickstart", "steps", "all"), default="all")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per side of part 3 (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="quick-start round pairs (default 3)")
    parser.add_argument("--calls", type=int, default=30, help="timed generator calls per side (default 30; x10 "
                        "for the small batch)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    if args.part in ("generator", "all"):
        generator_part(args.threads, args.calls)
    if args.part in ("quickstart", "all"):
        quickstart_part(args.rounds)
    if args.part in ("steps", "all"):
        torch.set_num_threads(1)
        steps_part(args.steps)


if __name__ == "__main__":
    main()
