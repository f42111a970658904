"""Digits metrics: a Fréchet distance in the feature space of a small shipped classifier, and class accuracy.

FID's Inception network knows nothing about 8x8 grayscale digits, so digits samples are scored the same way in
a feature space that does: ``DigitsClassifier``, a ~50k-parameter CNN trained on the train split of
``fastgen.datasets.digits.DigitsDataset`` (the 90/10 partition with seed 0 that the diffusion recipes train on)
by ``python -m fastgen.evaluation.train_digits_classifier``. Its weights ship in the package
(``fastgen/assets/digits_classifier.pt``, with the measured test accuracy in the file's ``meta``).

* **FD_digits** - the Fréchet distance (Heusel et al. 2017, Eq. 6; ``fastgen.evaluation.frechet``) between the
  64-d penultimate features (taken before the ReLU, so no dimension is dead) of the samples and of the *reference set: all
  1,797 real digits*. Reference images go through the same uint8 quantisation as samples (the ``.npz`` format),
  and their statistics are computed once per process.
* **accuracy** - for class-conditional samples, the fraction the classifier assigns to the class they were
  drawn for.

Images may be uint8 (``0..255``; NHWC ``(N, 8, 8, 1)``, ``(N, 8, 8)``) as ``fastgen sample`` writes them, or
float in ``[-1, 1]`` (NCHW ``(N, 1, 8, 8)``), the range the digits recipes train in.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import numpy as np
import torch
from torch import nn

from fastgen.evaluation.frechet import feature_statistics, frechet_distance_to_statistics
from fastgen.utils.safe_pickle import torch_load

CLASSIFIER_FILE = "digits_classifier.pt"
FEATURE_DIM = 64


class DigitsClassifier(nn.Module):
    """conv(1->16) -> conv(16->32) -> maxpool -> conv(32->32) -> flatten(512) -> linear 64 (the features)
    -> ReLU -> dropout -> 10 logits. All convolutions are 3x3 with ReLU."""

    def __init__(self, num_classes: int = 10, feature_dim: int = FEATURE_DIM) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, feature_dim),
        )
        self.dropout = nn.Dropout(0.2)
        self.head = nn.Linear(feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, 1, 8, 8)`` in ``[-1, 1]`` -> ``(N, feature_dim)``."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(torch.relu(self.features(x))))


def to_model_input(images: Any) -> torch.Tensor:
    """Digits images in any of the accepted layouts -> float ``(N, 1, 8, 8)`` in ``[-1, 1]``."""
    x = torch.as_tensor(np.asarray(images) if not isinstance(images, torch.Tensor) else images)
    if x.dim() == 3:
        x = x.unsqueeze(1) if x.shape[-1] == 8 else x
    if x.dim() == 4 and x.shape[-1] == 1 and x.shape[1] == 8:
        x = x.permute(0, 3, 1, 2)
    if x.dim() != 4 or tuple(x.shape[1:]) != (1, 8, 8):
        raise ValueError(f"digits images must be (N, 8, 8, 1), (N, 8, 8) or (N, 1, 8, 8); got {tuple(x.shape)}")
    if x.dtype == torch.uint8:
        return x.float().div(127.5).sub(1.0)
    return x.float().clamp(-1.0, 1.0)


def quantize(images: torch.Tensor) -> torch.Tensor:
    """``[-1, 1]`` floats through the uint8 round trip that saved samples go through."""
    return ((images.clamp(-1, 1) + 1) * 127.5).round().div(127.5).sub(1.0)


def classifier_path() -> Any:
    """The shipped weights (package data of ``fastgen``: ``fastgen/assets/digits_classifier.pt``)."""
    return resources.files("fastgen") / "assets" / CLASSIFIER_FILE


@functools.lru_cache(maxsize=1)
def load_classifier() -> tuple[DigitsClassifier, dict[str, Any]]:
    """The shipped classifier (eval mode, CPU) and its ``meta`` (test accuracy, split, epochs). Cached."""
    path = classifier_path()
    with resources.as_file(path) as file:
        payload = torch_load(file)
    model = DigitsClassifier(feature_dim=int(payload["meta"].get("feature_dim", FEATURE_DIM)))
    model.load_state_dict(payload["state_dict"])
    return model.eval().requires_grad_(False), dict(payload["meta"])


@torch.no_grad()
def classifier_outputs(images: Any, batch_size: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """``(features (N, 64) float64, predicted labels (N,))`` of the shipped classifier."""
    model, _ = load_classifier()
    x = to_model_input(images)
    feats, preds = [], []
    for start in range(0, x.shape[0], batch_size):
        f = model.features(x[start : start + batch_size])
        feats.append(f.double().numpy())
        preds.append(model.head(torch.relu(f)).argmax(dim=1).numpy())
    return np.concatenate(feats), np.concatenate(preds)


@functools.lru_cache(maxsize=1)
def reference_statistics() -> tuple[np.ndarray, np.ndarray]:
    """``(mu, sigma)`` of the classifier features of all 1,797 real digits (uint8-quantised). Cached."""
    from fastgen.datasets.digits import load_digits_tensors

    images, _ = load_digits_tensors()
    features, _ = classifier_outputs(quantize(images))
    return feature_statistics(features)


def classifier_accuracy(images: Any, labels: Any) -> float:
    """Fraction of ``images`` the shipped classifier assigns to ``labels``."""
    _, preds = classifier_outputs(images)
    labels = np.asarray(labels).reshape(-1)
    if labels.shape[0] != preds.shape[0]:
        raise ValueError(f"{preds.shape[0]} images but {labels.shape[0]} labels")
    return float((preds == labels).mean())


def frechet_distance_digits(images: Any, labels: Any = None) -> dict[str, float]:
    """Score digits samples against the real digits.

    Returns ``{"fd_digits": float, "num_samples": n}`` plus ``"accuracy"`` (classifier accuracy against
    ``labels``) when ``labels`` are given. ``images``: uint8 NHWC as written by ``fastgen sample``, or float
    NCHW in ``[-1, 1]``."""
    features, preds = classifier_outputs(images)
    result: dict[str, float] = {"fd_digits": frechet_distance_to_statistics(features, *reference_statistics()),
                                "num_samples": int(features.shape[0])}
    if labels is not None:
        labels = np.asarray(labels).reshape(-1)
        if labels.shape[0] != preds.shape[0]:
            raise ValueError(f"{preds.shape[0]} images but {labels.shape[0]} labels")
        result["accuracy"] = float((preds == labels).mean())
    return result


__all__ = [
    "DigitsClassifier",
    "classifier_accuracy",
    "classifier_outputs",
    "frechet_distance_digits",
    "load_classifier",
    "reference_statistics",
    "to_model_input",
]
