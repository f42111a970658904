"""EMA update cost on an EDM-sized U-Net: fused ``_foreach_lerp_`` vs a per-parameter loop vs the bandwidth floor.

The network is fastgen's U-Net at 32x32 with 128 channels, ``channel_mult=[2, 2, 2]``, 4 blocks per level and
attention at 16x16: ~55M parameters in ~390 tensors, the size class of EDM's CIFAR-10 model (56M).

* **fused** - what ``EMACallback`` does: ``torch._foreach_lerp_(ema, net, 1 - beta)``, i.e.
  ``ema <- beta * ema + (1 - beta) * net`` for all tensors in one call;
* **loop** - the same update as a Python loop over parameters (``e.lerp_(p, 1 - beta)``), as the reference
  system does;
* **floor** - one in-place ``a.add_(b)`` over two flat buffers with the same number of elements: it reads two
  buffers and writes one, exactly the bytes the EMA update moves, with no per-tensor overhead. No EMA
  implementation can beat it by much.

The three run alternately in each round (A B C A B C ...), and the result is the median over rounds of each
per-round ratio. Goal: fused <= 1.2x the floor, and faster than the loop.

    .venv/bin/python benchmarks/ema.py [--rounds 7] [--repeats 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fastgen.networks.unet import UNet


def timed(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description="EMA update: fused vs loop vs bandwidth floor")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    net = UNet(img_resolution=32, in_channels=3, model_channels=128, channel_mult=[2, 2, 2], num_blocks=4,
               attn_resolutions=[16], num_classes=10)
    src = [p.detach() for p in net.parameters()]
    ema = [p.clone() for p in src]
    numel = sum(p.numel() for p in src)
    flat_a, flat_b = torch.randn(numel), torch.randn(numel)
    beta = 0.999

    def fused() -> None:
        torch._foreach_lerp_(ema, src, 1.0 - beta)

    def loop() -> None:
        for e, p in zip(ema, src):
            e.lerp_(p, 1.0 - beta)

    def floor() -> None:
        flat_a.add_(flat_b)

    rows = []
    for _ in range(args.rounds):
        t_fused, t_loop, t_floor = timed(fused, args.repeats), timed(loop, args.repeats), timed(floor, args.repeats)
        rows.append((t_fused, t_loop, t_floor))
    gbytes = 3 * numel * 4 / 1e9
    print(f"EMA update, {numel / 1e6:.1f}M float32 parameters in {len(src)} tensors, {torch.get_num_threads()} thread(s), "
          f"{args.rounds} rounds x {args.repeats} updates")
    print("| round | fused ms | loop ms | floor ms | fused/floor | loop/fused |")
    print("|---:|---:|---:|---:|---:|---:|")
    for i, (f, lp, fl) in enumerate(rows, 1):
        print(f"| {i} | {f * 1e3:.1f} | {lp * 1e3:.1f} | {fl * 1e3:.1f} | {f / fl:.2f} | {lp / f:.2f} |")
    fused_vs_floor = statistics.median(f / fl for f, _, fl in rows)
    loop_vs_fused = statistics.median(lp / f for f, lp, _ in rows)
    print(f"floor bandwidth: {gbytes / statistics.median(fl for _, _, fl in rows):.1f} GB/s (3 x 4 bytes per element)")
    print(f"median fused/floor: {fused_vs_floor:.2f} (goal <= 1.2)")
    print(f"median loop/fused: {loop_vs_fused:.2f} (goal > 1)")


if __name__ == "__main__":
    main()
