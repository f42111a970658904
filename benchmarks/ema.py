"""EMA update cost on an EDM-sized U-Net: ``EMACallback`` vs ``_foreach_lerp_`` vs a per-parameter loop vs the floor.

The network is fastgen's U-Net at 32x32 with 128 channels, ``channel_mult=[2, 2, 2]``, 4 blocks per level and
attention at 16x16: ~55M parameters in ~390 tensors, the size class of EDM's CIFAR-10 model (56M).

* **ema** - what training runs: ``EMACallback.update`` on the real online and EMA networks (flat buffers, one
  ``lerp_`` per buffer, plus its per-step check that the parameters still point into the buffers);
* **foreach** - the previous implementation: ``torch._foreach_lerp_(ema, net, 1 - beta)`` over separately
  allocated tensors;
* **loop** - the same update as a Python loop over parameters (``e.lerp_(p, 1 - beta)``), as the reference
  system does;
* **floor** - one in-place ``a.add_(b)`` over two flat buffers with the same number of elements: it reads two
  buffers and writes one, exactly the bytes the EMA update moves, with no per-tensor overhead. No EMA
  implementation can beat it by much.

The four run alternately, one call at a time (A B C D A B C D ...), ``--repeats`` calls each per round; a round
keeps each one's fastest call, and the result is the median over rounds of each per-round ratio. Goal: ema <= 1.2x
the floor, and faster than the loop. Run it with one thread, on a machine as idle as possible:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ema.py [--rounds 9] [--repeats 8]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from types import SimpleNamespace

import torch
from torch import nn

from fastgen.callbacks.ema import EMACallback
from fastgen.networks.unet import UNet


def timed_round(fns, repeats: int) -> tuple[float, ...]:
    """Fastest of ``repeats`` calls of each of ``fns``, in seconds. Calls are interleaved one by one
    (A B C D A B C D ...) so that every function sees the same machine state, and the minimum (as ``timeit``
    recommends) drops calls slowed by other processes: on a shared machine the speed drifts over seconds."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return tuple(best)


def main() -> None:
    parser = argparse.ArgumentParser(description="EMA update: EMACallback vs foreach vs loop vs bandwidth floor")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    net = UNet(img_resolution=32, in_channels=3, model_channels=128, channel_mult=[2, 2, 2], num_blocks=4,
               attn_resolutions=[16], num_classes=10)
    # The previous implementation's operands: separately allocated tensors, copied before the callback
    # lays the networks out flat.
    src = [p.detach().clone() for p in net.parameters()]
    ema = [p.clone() for p in src]
    model = SimpleNamespace(net=net, ema_nets=nn.ModuleDict({"ema": copy.deepcopy(net).requires_grad_(False)}))
    callback = EMACallback(ema_name="ema", type="constant", beta=0.999)
    callback.on_model_init_end(model)
    numel = sum(p.numel() for p in src)
    flat_a, flat_b = torch.randn(numel), torch.randn(numel)
    beta = 0.999

    def ema_callback() -> None:
        callback.update(model, beta)

    def foreach() -> None:
        torch._foreach_lerp_(ema, src, 1.0 - beta)

    def loop() -> None:
        for e, p in zip(ema, src):
            e.lerp_(p, 1.0 - beta)

    def floor() -> None:
        flat_a.add_(flat_b)

    fns = (ema_callback, foreach, loop, floor)
    for fn in fns:  # warm-up
        fn()
    rows = [timed_round(fns, args.repeats) for _ in range(args.rounds)]
    flat_groups = len(callback._current_plan(model).groups)
    gbytes = 3 * numel * 4 / 1e9
    print(f"EMA update, {numel / 1e6:.1f}M float32 parameters in {len(src)} tensors ({flat_groups} flat buffer(s) "
          f"in the callback), {torch.get_num_threads()} thread(s), {args.rounds} rounds x {args.repeats} updates")
    print("| round | ema ms | foreach ms | loop ms | floor ms | ema/floor | foreach/floor | loop/ema |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, (e, f, lp, fl) in enumerate(rows, 1):
        print(f"| {i} | {e * 1e3:.1f} | {f * 1e3:.1f} | {lp * 1e3:.1f} | {fl * 1e3:.1f} | {e / fl:.2f} | {f / fl:.2f} "
              f"| {lp / e:.2f} |")
    ema_vs_floor = statistics.median(e / fl for e, _, _, fl in rows)
    foreach_vs_floor = statistics.median(f / fl for _, f, _, fl in rows)
    loop_vs_ema = statistics.median(lp / e for e, _, lp, _ in rows)
    print(f"floor bandwidth: {gbytes / statistics.median(r[3] for r in rows):.1f} GB/s (3 x 4 bytes per element)")
    print(f"median ema/floor: {ema_vs_floor:.2f} (goal <= 1.2)")
    print(f"median foreach/floor: {foreach_vs_floor:.2f} (the previous implementation)")
    print(f"median loop/ema: {loop_vs_ema:.2f} (goal > 1)")


if __name__ == "__main__":
    main()
