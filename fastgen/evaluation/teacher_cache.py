"""A distillation teacher's scores, cached beside its checkpoint.

Why: after a distillation run, ``fastgen train --eval-samples N`` scores the student beside its teacher. The
teacher's samples cost ``2 * steps - 1`` network evaluations each (35 for 18 Heun steps) against the student's one,
so at the sample counts that make a Frechet distance trustworthy (5,000 digits: the 1,000-sample score of one
and the same teacher moves by +-0.25 from seed to seed) the teacher alone would take longer than the whole
quick-start's training. Its score is a pure function of its weights and the sampling settings, so it is computed
once and stored in ``<teacher checkpoint>.eval.json`` (``digits_teacher.pth`` ships with
``digits_teacher.eval.json``).

An entry is used only when everything the score depends on matches: the SHA-256 of the teacher's weights (not of
the file, so the copy inside a run's checkpoint matches too), the data set, the number of samples, the seed, the
sampler's steps, the guidance scale and the dtype. Anything else is computed afresh, and written back when the
folder is writable (a read-only install just recomputes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

CACHE_FORMAT = "fastgen-teacher-eval-v1"


def weights_digest(module: nn.Module) -> str:
    """SHA-256 over the module's state (names, dtypes, shapes and bytes, in name order)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{data.dtype}|{tuple(data.shape)}|".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def cache_path(teacher_ckpt: str | Path) -> Path:
    """``digits_teacher.pth`` -> ``digits_teacher.eval.json`` (same folder)."""
    path = Path(teacher_ckpt)
    return path.with_name(path.stem + ".eval.json")


def cache_key(digest: str, dataset: str, n: int, seed: int, steps: int, guidance: float | None, dtype: Any) -> str:
    return f"{digest[:16]}|{dataset}|n={n}|seed={seed}|steps={steps}|guidance={guidance}|{dtype}"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


def _write(path: Path, entries: dict[str, Any]) -> None:
    from fastgen.utils.io import atomic_write_text

    try:
        atomic_write_text(path, json.dumps({"format": CACHE_FORMAT, "entries": entries}, indent=2, sort_keys=True) + "\n")
    except OSError as exc:  # a read-only install: the score is simply recomputed next time
        logger.debug("could not write the teacher's scores to %s: %s", path, exc)


def teacher_metrics(model: Any, n: int, steps: int, dataset: str, seed: int = 0,
                    evaluate: Callable[..., dict[str, Any]] | None = None) -> tuple[dict[str, Any], bool]:
    """``(metrics, from_cache)`` of ``model.teacher`` sampled with ``steps`` steps, ``n`` samples and ``seed``
    (the scores ``evaluate_model(model, n, seed, steps, net=model.teacher, dataset)`` returns)."""
    if evaluate is None:
        from fastgen.evaluation.evaluate import evaluate_model as evaluate

    teacher = model.teacher

    def compute() -> dict[str, Any]:
        return evaluate(model, n, seed=seed, steps=steps, net=teacher, dataset=dataset)

    ckpt = getattr(model.config, "teacher_ckpt", None)
    if not ckpt:
        return compute(), False
    path = cache_path(ckpt)
    digest = weights_digest(teacher)
    key = cache_key(digest, dataset, n, seed, steps, model.config.guidance_scale, model.precision)
    entries = _read(path)
    entry = entries.get(key)
    if isinstance(entry, dict) and entry.get("weights_sha256") == digest and isinstance(entry.get("metrics"), dict):
        logger.info("teacher scores from %s (computed with torch %s)", path, entry.get("torch", "?"))
        return entry["metrics"], True
    metrics = compute()
    entries[key] = {"weights_sha256": digest, "metrics": metrics, "torch": torch.__version__}
    _write(path, entries)
    return metrics, False


__all__ = ["CACHE_FORMAT", "cache_key", "cache_path", "teacher_metrics", "weights_digest"]
