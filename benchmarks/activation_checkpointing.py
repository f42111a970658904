"""Activation checkpointing: training peak memory with ``model.activation_checkpointing=True`` ÷ without, measured by
``fastgen profile-memory`` on the same recipe.

For each recipe (default: the DiT and U-Net digits teachers at batch 256) the script runs ``fastgen profile-memory``
without and then with checkpointing and reads each rank-0 snapshot with
``fastgen.profiling.analysis.measured_memory``: the training peak is the largest total of live blocks during the
data, forward, backward and optimizer phases. Allocation sizes do not depend on timing, so one run per side
decides it (a second run gives the same bytes). **Goal: peak ratio <= 0.6.** The recomputation costs about one
more forward pass per step; this script does not time it.

    .venv/bin/python benchmarks/activation_checkpointing.py [--batch 256] [--iters 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
RECIPES = ("Digits/config_sft_dit_digits", "Digits/config_sft_digits")


def profile(recipe: str, checkpointed: bool, batch: int, iters: int, folder: Path) -> int:
    from fastgen.profiling.analysis import measured_memory
    from fastgen.profiling.snapshot import load_snapshot

    out = folder / f"{recipe.replace('/', '_')}_{int(checkpointed)}.html"
    command = [str(BIN / "fastgen"), "profile-memory", "-c", recipe, "--iters", str(iters), "--out", str(out), "-",
               f"dataloader_train.batch_size={batch}", f"model.activation_checkpointing={checkpointed}",
               "log_config.name=ac_bench"]
    env = {**os.environ, "FASTGEN_OUTPUT_ROOT": str(folder / "runs"), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, cwd=folder)
    if result.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{result.stderr[-3000:]}")
    return measured_memory(load_snapshot(out.with_name(out.stem + "_rank0.json.gz")))["training_peak"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    print(f"batch {args.batch}, {args.iters} profiled iterations\n")
    print("| recipe | training peak without | with | ratio |\n|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for recipe in args.recipes:
            peaks = {checkpointed: profile(recipe, checkpointed, args.batch, args.iters, Path(folder))
                     for checkpointed in (False, True)}
            print(f"| {recipe} | {peaks[False] / 2**20:.1f} MiB | {peaks[True] / 2**20:.1f} MiB | "
                  f"{peaks[True] / peaks[False]:.3f} |")


if __name__ == "__main__":
    main()
