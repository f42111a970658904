"""KV-cached chunk-by-chunk generation against re-running the whole prefix for every evaluation
(``fastgen.networks.causal_sampling.sample_chunks``, ``use_cache`` on / off), for 2, 4 and 8 chunks of 2 frames
with the recipe's block-causal DiT (``Digits/config_causal_sft_moving_digits``: hidden 96, depth 4; random
weights - the cost does not depend on them), batch 16, 4 Heun steps per chunk (7 evaluations). Both samplers run
in the same process, alternating, 5 rounds; medians. Prints each time relative to the cached 2-chunk run and the
speed-up of the cache.

    .venv/bin/python benchmarks/causal_cache.py
"""

from __future__ import annotations

import statistics
import time

import torch


def main() -> None:
    from fastgen.configs.instantiate import instantiate
    from fastgen.configs.net_dit import causal_video_dit
    from fastgen.networks.causal_sampling import sample_chunks

    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = instantiate(causal_video_dit()).eval()
    labels = torch.arange(16) % 10
    times: dict[tuple[int, bool], list[float]] = {}
    for _ in range(5):
        for chunks in (2, 4, 8):
            noise = torch.randn(16, 1, 2 * chunks, 8, 16)
            for cached in (True, False):
                start = time.perf_counter()
                sample_chunks(net, noise, labels, steps=4, num_classes=10, use_cache=cached)
                times.setdefault((chunks, cached), []).append(time.perf_counter() - start)
    base = statistics.median(times[(2, True)])
    print("| chunks | cached (x the 2-chunk cached time) | re-run prefix (x) | speed-up of the cache |")
    print("|---:|---:|---:|---:|")
    for chunks in (2, 4, 8):
        cached, rerun = statistics.median(times[(chunks, True)]), statistics.median(times[(chunks, False)])
        print(f"| {chunks} | {cached / base:.2f} | {rerun / base:.2f} | {rerun / cached:.2f} |")


if __name__ == "__main__":
    main()
