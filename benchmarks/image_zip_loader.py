"""Image-zip loader throughput: fastgen's ``ImageZipDataset`` + ``ResumableLoader`` against a minimal reader of the
same files, side by side in one run.

The data: an EDM-style zip written by ``fastgen.datasets.image_zip.write_image_zip`` (uncompressed PNGs +
``dataset.json``), CIFAR-sized by default (32x32 RGB, 10 classes; random pixels, so the PNGs are as large as they
get). Both sides read shuffled batches of ``--batch`` images in the same order and return float32 ``(B, 3, H, W)``
in [-1, 1] plus int64 labels:

* **fastgen** - ``build_dataloader(ImageZipDataset(path), batch_size, seed)``; ``next(loader)`` (which also adds
  ``sample_ids``), single process (``num_workers=0``);
* **minimal** - what one writes by hand: one open ``zipfile.ZipFile``, the sorted image names and the labels from
  ``dataset.json``, the same ``torch.randperm`` order; per batch ``zf.read`` + ``PIL.Image.open`` + ``np.asarray``
  per image, ``np.stack``, ``permute``, ``float() / 127.5 - 1``.

The two alternate batch by batch (A B A B ...) so a drift in machine speed hits both; each round reports
samples/s of each side and their ratio, and the run ends with the median ratio. **Goal: >= 0.9.**

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/image_zip_loader.py [--images 10000] [--rounds 5] [--batches 40]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import PIL.Image
import torch

from fastgen.datasets.image_zip import ImageZipDataset, encode_png, write_image_zip
from fastgen.datasets.loader import build_dataloader


def make_zip(path: Path, count: int, size: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    items = ((encode_png(rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)), int(rng.integers(10)))
             for _ in range(count))
    write_image_zip(path, items, count)


class MinimalReader:
    """The hand-written baseline (see the module docstring)."""

    def __init__(self, path: Path, batch_size: int, seed: int) -> None:
        self.archive = zipfile.ZipFile(path)
        self.names = sorted(n for n in self.archive.namelist() if n.endswith(".png"))
        labels = dict(json.loads(self.archive.read("dataset.json"))["labels"])
        self.labels = torch.tensor([labels[n] for n in self.names], dtype=torch.int64)
        self.batch_size, self.seed, self.epoch, self.position = batch_size, seed, 0, 0
        self.order = torch.randperm(len(self.names), generator=torch.Generator().manual_seed(seed))

    def next(self) -> dict[str, torch.Tensor]:
        if self.position + self.batch_size > len(self.names):
            self.epoch, self.position = self.epoch + 1, 0
            self.order = torch.randperm(len(self.names), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        indices = self.order[self.position:self.position + self.batch_size].tolist()
        self.position += self.batch_size
        pixels = np.stack([np.asarray(PIL.Image.open(io.BytesIO(self.archive.read(self.names[i])))) for i in indices])
        images = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 127.5 - 1
        return {"real": images, "condition": self.labels[indices]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=40, help="timed batches per side and round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.zip"
        make_zip(path, args.images, args.size)
        loader = build_dataloader(ImageZipDataset(str(path)), batch_size=args.batch, seed=0)
        minimal = MinimalReader(path, args.batch, seed=0)
        check_a, check_b = next(loader), minimal.next()  # the same batch on both sides: a fair comparison
        assert torch.equal(check_a["real"], check_b["real"]) and torch.equal(check_a["condition"], check_b["condition"])
        for _ in range(args.warmup):
            next(loader), minimal.next()
        ratios = []
        print(f"{args.images} images {args.size}x{args.size}, batch {args.batch}, {args.threads} thread(s)")
        print("| round | fastgen samples/s | minimal samples/s | ratio |\n|---:|---:|---:|---:|")
        for round_index in range(args.rounds):
            spent = {"fastgen": 0.0, "minimal": 0.0}
            for _ in range(args.batches):
                start = time.perf_counter()
                next(loader)
                middle = time.perf_counter()
                minimal.next()
                spent["fastgen"] += middle - start
                spent["minimal"] += time.perf_counter() - middle
            rates = {k: args.batches * args.batch / v for k, v in spent.items()}
            ratios.append(rates["fastgen"] / rates["minimal"])
            print(f"| {round_index} | {rates['fastgen']:,.0f} | {rates['minimal']:,.0f} | {ratios[-1]:.3f} |")
        print(f"median ratio: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
