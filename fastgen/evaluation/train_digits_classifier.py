"""Train the digits classifier whose features define FD_digits, and write the weights the package ships.

    python -m fastgen.evaluation.train_digits_classifier [--out fastgen/assets/digits_classifier.pt]
        [--epochs 40] [--seed 0]

Data: the train split (1,617 images) of ``fastgen.datasets.digits.DigitsDataset`` - the same seeded 90/10
partition the diffusion recipes train on - with random +-1 pixel shifts and small Gaussian pixel noise, so that
the features are not thrown by the slight blur and noise of generated digits. The held-out ``val`` split (180
images) gives the test accuracy stored in the file's ``meta``. Adam (lr 2e-3, cosine decay), batch 64, CPU,
fully seeded: the same command writes the same weights on the same torch build.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fastgen.evaluation.digits import FEATURE_DIM, DigitsClassifier

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "assets" / "digits_classifier.pt"


def _augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random +-1 pixel translation (edge pixels are background, -1) and N(0, 0.05^2) pixel noise."""
    padded = nn.functional.pad(x, (1, 1, 1, 1), value=-1.0)
    dy, dx = torch.randint(0, 3, (2,), generator=generator).tolist()
    shifted = padded[:, :, dy : dy + 8, dx : dx + 8]
    return (shifted + 0.05 * torch.randn(shifted.shape, generator=generator)).clamp(-1, 1)


@torch.no_grad()
def evaluate(model: DigitsClassifier, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    return float((model(images).argmax(dim=1) == labels).float().mean())


def train(epochs: int = 40, seed: int = 0, batch_size: int = 64, lr: float = 2e-3) -> tuple[DigitsClassifier, dict[str, Any]]:
    """Train on the DigitsDataset train split; return the model and its ``meta`` (test accuracy on ``val``)."""
    from fastgen.datasets.digits import DigitsDataset

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    train_set, test_set = DigitsDataset("train"), DigitsDataset("val")
    model = DigitsClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    n = len(train_set)
    steps_per_epoch = math.ceil(n / batch_size)
    total = epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / total)))
    for _ in range(epochs):
        model.train()
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            x = _augment(train_set.images[idx], generator)
            loss = nn.functional.cross_entropy(model(x), train_set.labels[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
    model.eval()
    meta = {
        "test_accuracy": evaluate(model, test_set.images, test_set.labels),
        "train_accuracy": evaluate(model, train_set.images, train_set.labels),
        "train_split": "fastgen.datasets.digits.DigitsDataset('train') (90/10 partition, seed 0): 1617 images",
        "test_split": "fastgen.datasets.digits.DigitsDataset('val'): 180 images",
        "epochs": epochs,
        "seed": seed,
        "feature_dim": FEATURE_DIM,
        "torch_version": str(torch.__version__),
    }
    return model, meta


def save(model: DigitsClassifier, meta: dict[str, Any], path: Path) -> None:
    from fastgen.utils.io import atomic_write_with

    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    atomic_write_with(Path(path), lambda handle: torch.save({"state_dict": state, "meta": meta}, handle))
    Path(path).chmod(0o644)  # package data: readable by everyone (the temporary file was created 0600)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the weights")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 4)))
    model, meta = train(epochs=args.epochs, seed=args.seed)
    save(model, meta, args.out)
    # A script's report (this module is run as a program, not imported by the library).
    print(f"test accuracy {meta['test_accuracy']:.4f} (train {meta['train_accuracy']:.4f}); wrote {args.out}")  # noqa: T201


if __name__ == "__main__":
    main()
