"""A distillation teacher's scores, cached in the user's cache folder.

Why: after a distillation run, ``fastgen train --eval-samples N`` scores the student beside its teacher. The
teacher's samples cost ``2 * steps - 1`` network evaluations each (35 for 18 Heun steps) against the student's one,
so at the sample counts that make a Frechet distance trustworthy (5,000 digits: the 1,000-sample score of one
and the same teacher moves by +-0.25 from seed to seed) the teacher alone would take longer than the whole
quick-start's training. Its score is a pure function of its weights and the sampling settings, so it is computed
once and stored.

Where: ``$XDG_CACHE_HOME/fastgen/teacher_eval/<checkpoint stem>-<weights digest>.eval.json`` (``~/.cache`` when
``XDG_CACHE_HOME`` is unset), one file per teacher, named by its checkpoint and the digest of its weights: two
different teachers never share a file. Never beside the checkpoint: the quick-start's teacher lives inside the
installed package (``fastgen/assets/digits_teacher.pth``), and a run must not write into a package (read-only for
other users, and in a development checkout a tracked file). A ``<teacher checkpoint>.eval.json`` beside the
checkpoint is still *read*, as a read-only seed: the package ships ``digits_teacher.eval.json`` so the quick-start's
teacher row costs nothing, and older fastgen versions wrote their caches there. A cache folder that cannot be
written only costs the recomputation (a warning says so); the evaluation itself never fails for it.

An entry is used only when everything the score depends on matches: the SHA-256 of the teacher's weights (not of
the file, so the copy inside a run's checkpoint matches too), the data set, the number of samples, the seed, the
sampler's steps, the guidance scale and the dtype. Anything else is computed afresh and written to the user cache.
"""

from __future__ import annotations

import hashlib
import json
import os
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


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/fastgen/teacher_eval``, or ``~/.cache/fastgen/teacher_eval`` (the XDG base-directory rules:
    an unset, empty or relative ``XDG_CACHE_HOME`` means ``~/.cache``). Raises ``RuntimeError`` when there is no
    home folder to fall back to."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "fastgen" / "teacher_eval"


def cache_path(teacher_ckpt: str | Path, digest: str) -> Path:
    """The cache file of the teacher whose weights hash to ``digest``: ``digits_teacher.pth`` ->
    ``<cache folder>/digits_teacher-<first 16 hex digits>.eval.json``."""
    return cache_folder() / f"{Path(teacher_ckpt).stem}-{digest[:16]}.eval.json"


def seed_path(teacher_ckpt: str | Path) -> Path:
    """The read-only cache beside the checkpoint: ``digits_teacher.pth`` -> ``digits_teacher.eval.json``."""
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
    except OSError as exc:  # the scores are fine; only the next evaluation pays for them again
        logger.warning("could not cache the teacher's scores in %s (%s): they will be computed again next time "
                       "(set XDG_CACHE_HOME to a writable folder to keep them)", path, exc.strerror or exc)


def _valid(entry: Any, digest: str) -> bool:
    return isinstance(entry, dict) and entry.get("weights_sha256") == digest and isinstance(entry.get("metrics"), dict)


def teacher_metrics(model: Any, n: int, steps: int, dataset: str, seed: int = 0,
                    evaluate: Callable[..., dict[str, Any]] | None = None) -> tuple[dict[str, Any], Path | None]:
    """``(metrics, source)`` of ``model.teacher`` sampled with ``steps`` steps, ``n`` samples and ``seed`` (the
    scores ``evaluate_model(model, n, seed, steps, net=model.teacher, dataset)`` returns); ``source`` is the cache
    file they were read from, ``None`` when they were computed now."""
    if evaluate is None:
        from fastgen.evaluation.evaluate import evaluate_model as evaluate

    teacher = model.teacher

    def compute() -> dict[str, Any]:
        return evaluate(model, n, seed=seed, steps=steps, net=teacher, dataset=dataset)

    ckpt = getattr(model.config, "teacher_ckpt", None)
    if not ckpt:
        return compute(), None
    digest = weights_digest(teacher)
    key = cache_key(digest, dataset, n, seed, steps, model.config.guidance_scale, model.precision)
    try:
        path: Path | None = cache_path(ckpt, digest)
    except RuntimeError as exc:  # Path.home(): no HOME and no password entry
        logger.warning("no cache folder for the teacher's scores (%s): they are computed on every evaluation "
                       "(set XDG_CACHE_HOME to keep them)", exc)
        path = None
    entries = _read(path) if path is not None else {}
    beside = seed_path(ckpt)
    for source, known in ((path, entries), (beside, _read(beside))):  # the user's cache first, then the seed
        entry = known.get(key)
        if source is not None and _valid(entry, digest):
            logger.info("teacher scores from %s (computed with torch %s)", source, entry.get("torch", "?"))
            return entry["metrics"], source
    metrics = compute()
    if path is not None:
        entries[key] = {"weights_sha256": digest, "metrics": metrics, "torch": torch.__version__}
        _write(path, entries)
    return metrics, None


__all__ = ["CACHE_FORMAT", "cache_folder", "cache_key", "cache_path", "seed_path", "teacher_metrics", "weights_digest"]
