"""Fingerprint throughput: ``RankConsistencyCallback``'s tensor fingerprint against a plain memory copy.

What is measured
----------------
The tensors are the parameters and buffers of an EDM-sized UNet (``fastgen.networks.unet.UNet`` at 32x32,
128 channels, ``channel_mult=[2, 2, 2]``, 4 blocks per resolution, attention at 16x16: about 55M float32
parameters in about 400 tensors, from 128-element biases to 1.2M-element convolutions), so the per-tensor
costs (the lane fold, small tensors) count as they would in a real check.

* **A - fingerprint**: ``fingerprint_tensors(tensors)`` - every tensor's 64-bit fingerprint, read back to the
  host as one ``int64`` tensor (what the callback all-gathers).
* **B - copy**: ``torch._foreach_copy_(dst, tensors)`` into preallocated tensors of the same shapes - the
  cheapest thing that reads every byte once (and writes it once).

Throughput is bytes of the tensors over seconds, ``ratio = A GB/s / B GB/s``. Each round times A and B
alternately (``--reps`` times each, in the order A B A B ...) and keeps each side's median, so both see the same
machine state; the result is the median of the per-round ratios. **Goal: >= 0.5.** ``torch.set_num_threads``
(``--threads``, default 1) holds for both sides.

Usage::

    .venv/bin/python benchmarks/fingerprint.py [--rounds 5] [--reps 5] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from fastgen.callbacks.rank_consistency import fingerprint_tensors
from fastgen.networks.unet import UNet


def build_tensors() -> list[torch.Tensor]:
    net = UNet(img_resolution=32, in_channels=3, model_channels=128, channel_mult=[2, 2, 2], num_blocks=4,
               attn_resolutions=[16])
    return [p.detach() for p in net.parameters()] + [b for b in net.buffers()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions of each side per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    tensors = build_tensors()
    n_params = sum(t.numel() for t in tensors)
    n_bytes = sum(t.numel() * t.element_size() for t in tensors)
    dst = [torch.empty_like(t) for t in tensors]
    torch._foreach_copy_(dst, tensors)  # warm-up: page in the destination, and the fingerprint's scratch
    first = fingerprint_tensors(tensors)
    assert torch.equal(first, fingerprint_tensors(dst)), "a copy must fingerprint like its source"

    def time_fingerprint() -> float:
        t0 = time.perf_counter()
        fingerprint_tensors(tensors)
        return time.perf_counter() - t0

    def time_copy() -> float:
        t0 = time.perf_counter()
        torch._foreach_copy_(dst, tensors)
        return time.perf_counter() - t0

    print(f"{len(tensors)} tensors, {n_params / 1e6:.2f}M elements, {n_bytes / 1e6:.0f} MB; "
          f"torch {torch.__version__}, {args.threads} thread(s)")
    print("| round | fingerprint GB/s | copy GB/s | ratio |")
    print("|---:|---:|---:|---:|")
    rounds = []
    for r in range(args.rounds):
        fp_times, copy_times = [], []
        for _ in range(args.reps):
            fp_times.append(time_fingerprint())
            copy_times.append(time_copy())
        fp_gbs = n_bytes / statistics.median(fp_times) / 1e9
        copy_gbs = n_bytes / statistics.median(copy_times) / 1e9
        rounds.append({"fingerprint_gbs": fp_gbs, "copy_gbs": copy_gbs, "ratio": fp_gbs / copy_gbs})
        print(f"| {r + 1} | {fp_gbs:.2f} | {copy_gbs:.2f} | {fp_gbs / copy_gbs:.3f} |")
    median = statistics.median(x["ratio"] for x in rounds)
    print(f"median ratio: {median:.2f} (goal >= 0.5)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tensors": len(tensors), "elements": n_params, "bytes": n_bytes, "threads": args.threads,
                       "rounds": rounds, "median_ratio": median}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
