"""Start-up time of ``fastgen --help`` against ``python -c "import torch"``, measured side by side.

The two commands run alternately (A B A B ...) as whole processes, so a drift in machine speed hits both; the
figure is the median of the per-pair ratios. ``fastgen --help`` must stay instant: the command line imports
torch, wandb and the config stack only inside the commands that need them.

    .venv/bin/python benchmarks/startup.py [--runs 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    fastgen = [str(Path(sys.executable).parent / "fastgen"), "--help"]
    torch_import = [sys.executable, "-c", "import torch"]
    wall(fastgen), wall(torch_import)  # warm the file cache
    a, b = [], []
    for _ in range(args.runs):
        a.append(wall(fastgen))
        b.append(wall(torch_import))
    ratios = [x / y for x, y in zip(a, b)]
    print(f"fastgen --help            median {statistics.median(a):.3f} s  (min {min(a):.3f}, max {max(a):.3f})")
    print(f'python -c "import torch"  median {statistics.median(b):.3f} s  (min {min(b):.3f}, max {max(b):.3f})')
    print(f"ratio (per pair, median)  {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
