"""Sampling from checkpoints and scoring samples (the library behind ``fastgen sample`` and ``fastgen eval``).

Stable API (the names below are importable from ``fastgen.evaluation`` directly; modules load on first use):

* ``evaluate_model(model, n, seed=0, steps=None, net=None, dataset=None, batch_size=256) -> dict`` - draw ``n``
  samples from a model in memory and score them for its data set (``evaluate.py``).
* ``draw_samples(model, n, seed=0, batch_size=256, net=None, steps=None, labels=None, label=None, progress=None)
  -> (samples, labels)``; ``load_run(path, config=None, device="cpu") -> LoadedRun``;
  ``select_net(run_or_model, "net" | "ema" | "teacher")``; ``save_samples(path, samples, labels, dataset)``;
  ``dataset_of_config(config)`` (``sampling.py``).
* ``frechet_distance_digits(images, labels=None) -> {"fd_digits", "num_samples"[, "accuracy"]}`` (``digits.py``).
* ``energy_distance(x, y) -> float``, ``sliced_wasserstein(x, y, projections=256, generator=None, p=1) -> float``,
  ``toy_metrics(points, name) -> dict`` (``toy.py``).
* ``frechet_distance(mu1, sigma1, mu2, sigma2) -> float``, ``feature_statistics(features) -> (mu, sigma)``,
  ``frechet_distance_to_statistics(features, mu, sigma) -> float`` (``frechet.py``).
* ``load_sample_files(path)``, ``detect_dataset(arr_0, hint)``, ``evaluate_arrays(arr_0, arr_1, dataset, ...)``
  (``evaluate.py``); ``load_inception(path)``, ``fid_from_images(...)`` (``inception.py``, ``fid.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "evaluate_model": "evaluate",
    "evaluate_arrays": "evaluate",
    "detect_dataset": "evaluate",
    "load_sample_files": "evaluate",
    "draw_samples": "sampling",
    "load_run": "sampling",  # fastgen.checkpoint.run, re-exported there
    "select_net": "sampling",
    "save_samples": "sampling",
    "dataset_of_config": "sampling",
    "frechet_distance_digits": "digits",
    "energy_distance": "toy",
    "sliced_wasserstein": "toy",
    "toy_metrics": "toy",
    "frechet_distance": "frechet",
    "feature_statistics": "frechet",
    "frechet_distance_to_statistics": "frechet",
    "load_inception": "inception",
    "fid_from_images": "fid",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fastgen.evaluation' has no attribute {name!r}")
    return getattr(importlib.import_module(f"fastgen.evaluation.{module}"), name)


__all__ = sorted(_EXPORTS)
