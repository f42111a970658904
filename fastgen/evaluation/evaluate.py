"""Score samples for their data set: one entry point for files (``fastgen eval``) and for models in memory.

* ``load_sample_files(path)`` - an ``.npz`` written by ``fastgen sample`` (or any ``arr_0``/``arr_1`` file of the
  guided-diffusion convention), or a folder of them (concatenated in name order).
* ``detect_dataset(arr_0, hint)`` - ``digits`` (uint8 8x8 grayscale), ``moving_digits`` (uint8 videos of 8-row
  grayscale frames), ``toy:<name>`` (float ``(N, 2)``; the name
  from the file's ``fastgen_dataset`` or the hint), ``cifar10`` (32x32 RGB), ``imagenet`` (other square RGB).
* ``evaluate_arrays(arr_0, arr_1, dataset, ...)`` - the metrics of ``dataset``:
  digits ``fd_digits`` (+ ``accuracy`` with labels, ``fastgen.evaluation.digits``); moving_digits (uint8
  ``(N, F, 8, W, 1)`` videos) ``fd_per_frame``, ``temporal_consistency`` (+ ``accuracy`` with labels,
  ``fastgen.evaluation.moving_digits``); audio_video_digits (those videos and their ``audio``) adds
  ``spectral_fd``, ``pitch_accuracy``, ``av_sync`` (``fastgen.evaluation.audio_video_digits``); toy ``energy_distance`` and
  ``sliced_wasserstein`` (``fastgen.evaluation.toy``); cifar10/imagenet ``fid`` (``fastgen.evaluation.fid``,
  needs local Inception weights and reference statistics).
* ``evaluate_model(model, n, seed, steps, net, dataset)`` - draw ``n`` samples from a model in memory and score
  them exactly as the saved file would be scored (images go through uint8 first).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastgen.utils.errors import UsageError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

DATASETS = ("digits", "moving_digits", "audio_video_digits", "toy:<name>", "cifar10", "imagenet")


@dataclass
class SampleSet:
    """Samples loaded from one or more ``.npz`` files."""

    arr_0: np.ndarray
    arr_1: np.ndarray | None
    dataset: str | None  # from the files' ``fastgen_dataset`` entry, when present
    files: list[Path] = field(default_factory=list)
    audio: np.ndarray | None = None  # an audio-visual model's audio samples, paired with the videos of arr_0


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray | None, str | None, np.ndarray | None]:
    import zipfile

    if not zipfile.is_zipfile(path):
        raise UsageError(f"{path} is not an .npz file: `fastgen eval` reads the .npz files `fastgen sample` writes "
                         "(a file, a folder of them, or a run directory)")
    try:
        with np.load(path, allow_pickle=False) as data:
            if "arr_0" not in data:
                raise UsageError(f"{path} has no arr_0 (keys: {', '.join(data.files) or 'none'}); "
                                 "expected samples from `fastgen sample`")
            labels = np.asarray(data["arr_1"]) if "arr_1" in data else None
            dataset = str(data["fastgen_dataset"]) if "fastgen_dataset" in data else None
            audio = np.asarray(data["audio"]) if "audio" in data else None
            return np.asarray(data["arr_0"]), labels, dataset, audio
    except (OSError, ValueError, EOFError) as exc:
        raise UsageError(f"cannot read {path} as .npz samples ({str(exc).strip().splitlines()[0][:160]})") from None


def load_sample_files(path: str | os.PathLike[str]) -> SampleSet:
    """Read an ``.npz`` of samples, or every ``*.npz`` in a folder - for a run directory, its ``samples/`` folder
    (same shapes; labels in all or none)."""
    target = Path(path).expanduser()
    if target.is_dir():
        files = sorted(target.glob("*.npz"))
        if not files and (target / "samples").is_dir():  # a run directory: `fastgen sample` writes to samples/
            target = target / "samples"
            files = sorted(target.glob("*.npz"))
        if not files:
            hint = f" or {target / 'samples'}" if target.name != "samples" else ""
            raise UsageError(f"no .npz files in {target}{hint}; write some with `fastgen sample RUN_DIR`")
    elif target.is_file():
        files = [target]
    else:
        raise UsageError(f"samples not found: {target}")
    parts = [_read_npz(f) for f in files]
    shapes = {p[0].shape[1:] for p in parts}
    if len(shapes) > 1:
        raise UsageError(f"the .npz files in {target} hold samples of different shapes: {sorted(shapes)[:3]}")
    with_labels = [p[1] is not None for p in parts]
    if any(with_labels) and not all(with_labels):
        raise UsageError(f"some .npz files in {target} have labels (arr_1) and some do not")
    datasets = {p[2] for p in parts if p[2]}
    if len(datasets) > 1:
        raise UsageError(f"the .npz files in {target} come from different data sets: {', '.join(sorted(datasets))}")
    arr_0 = np.concatenate([p[0] for p in parts])
    arr_1 = np.concatenate([p[1] for p in parts]) if all(with_labels) else None
    if arr_1 is not None and arr_1.shape[0] != arr_0.shape[0]:
        raise UsageError(f"{target}: {arr_0.shape[0]} samples but {arr_1.shape[0]} labels")
    with_audio = [p[3] is not None for p in parts]
    if any(with_audio) and not all(with_audio):
        raise UsageError(f"some .npz files in {target} have audio and some do not")
    audio = np.concatenate([p[3] for p in parts]) if all(with_audio) else None
    return SampleSet(arr_0, arr_1, datasets.pop() if datasets else None, files, audio)


def _toy_name(name: str) -> str:
    from fastgen.datasets.toy import TOY_DISTRIBUTIONS

    if name not in TOY_DISTRIBUTIONS:
        raise UsageError(f"unknown toy distribution {name!r}; choose one of {', '.join(TOY_DISTRIBUTIONS)}")
    return name


def detect_dataset(arr_0: np.ndarray, hint: str | None = None, recorded: str | None = None) -> str:
    """The data set of ``arr_0``: ``hint`` (``--dataset``) if given and compatible, else ``recorded`` (the file's
    ``fastgen_dataset``), else from the shape. A ``UsageError`` for shapes no metric knows."""
    shape, dtype = tuple(arr_0.shape), arr_0.dtype
    points = arr_0.ndim == 2 and shape[1] == 2 and np.issubdtype(dtype, np.floating)
    digits = dtype == np.uint8 and (shape[1:] in ((8, 8), (8, 8, 1)))
    moving = dtype == np.uint8 and arr_0.ndim == 5 and shape[2] == 8 and shape[4] == 1 and shape[3] >= 8
    rgb = dtype == np.uint8 and arr_0.ndim == 4 and shape[3] == 3 and shape[1] == shape[2]
    choice = hint or recorded
    if choice:
        if choice.startswith("toy:") or choice == "toy":
            if not points:
                raise UsageError(f"--dataset {choice}: expected float (N, 2) points, got {dtype} {shape}")
            if choice == "toy":
                raise UsageError("--dataset toy needs the distribution: toy:eight_gaussians, toy:checkerboard, ...")
            return f"toy:{_toy_name(choice.split(':', 1)[1])}"
        if choice in ("moving_digits", "audio_video_digits"):
            if not moving:
                raise UsageError(f"--dataset {choice}: expected uint8 (N, F, 8, W, 1) videos, got {dtype} {shape}")
            return choice
        if choice == "digits":
            if not digits:
                raise UsageError(f"--dataset digits: expected uint8 (N, 8, 8, 1) images, got {dtype} {shape}")
            return choice
        if choice in ("cifar10", "imagenet"):
            if not (rgb or (dtype == np.uint8 and arr_0.ndim == 4 and shape[3] == 1)):
                raise UsageError(f"--dataset {choice}: expected uint8 (N, H, W, 3) images, got {dtype} {shape}")
            return choice
        raise UsageError(f"unknown dataset {choice!r}; choose one of {', '.join(DATASETS)}")
    if digits:
        return "digits"
    if moving:
        return "moving_digits"
    if points:
        raise UsageError("2-D points: name the toy distribution with --dataset toy:<name> (eight_gaussians, "
                         "checkerboard, two_moons, swiss_roll)")
    if rgb:
        return "cifar10" if shape[1] == 32 else "imagenet"
    raise UsageError(f"cannot tell the data set of samples with dtype {dtype} and shape {shape}; expected uint8 "
                     "NHWC images or float (N, 2) points (pass --dataset)")


def evaluate_arrays(arr_0: np.ndarray, arr_1: np.ndarray | None, dataset: str, seed: int = 12345,
                    inception_weights: str | os.PathLike[str] | None = None,
                    ref_stats: str | os.PathLike[str] | None = None, batch_size: int = 64,
                    device: str = "cpu", progress: Callable[[int], None] | None = None,
                    audio: np.ndarray | None = None) -> dict[str, Any]:
    """Metrics of samples for ``dataset`` (see the module docstring); always includes ``dataset`` and
    ``num_samples``. ``seed`` draws the toy reference points and projections."""
    if dataset == "digits":
        check_fd_sample_count(len(arr_0), "digits")
        from fastgen.evaluation.digits import frechet_distance_digits

        metrics: dict[str, Any] = frechet_distance_digits(arr_0, arr_1)
    elif dataset in ("moving_digits", "audio_video_digits"):
        check_fd_sample_count(len(arr_0), "digits")
        import torch

        from fastgen.evaluation.moving_digits import score_videos

        videos = torch.from_numpy(np.ascontiguousarray(arr_0)).float().div(127.5).sub(1.0).permute(0, 4, 1, 2, 3)
        if dataset == "moving_digits":
            metrics = score_videos(videos, arr_1)
        else:
            from fastgen.evaluation.audio_video_digits import score_audio_video

            if audio is None or len(audio) != len(arr_0):
                raise UsageError("audio_video_digits samples need their audio (the .npz's audio entry, one per video)")
            metrics = score_audio_video(videos, torch.from_numpy(np.asarray(audio, dtype=np.float32)), arr_1)
    elif dataset.startswith("toy:"):
        from fastgen.evaluation.toy import toy_metrics

        metrics = toy_metrics(arr_0, _toy_name(dataset.split(":", 1)[1]), seed=seed)
    elif dataset in ("cifar10", "imagenet"):
        from fastgen.evaluation.fid import fid_from_images, load_reference_statistics
        from fastgen.evaluation.inception import load_inception, resolve_weights_path

        weights = resolve_weights_path(inception_weights)  # fail before any work when it is missing
        if ref_stats is None:
            raise UsageError(f"FID on {dataset} needs reference statistics: --ref-stats PATH (an .npz with mu/sigma, "
                             "an .npz of reference images, or an image folder)")
        check_fd_sample_count(len(arr_0), "inception")
        cache: dict[str, Any] = {}

        def model() -> Any:
            if "net" not in cache:
                cache["net"] = load_inception(weights, device=device)
            return cache["net"]

        reference = load_reference_statistics(ref_stats, model, batch_size=batch_size, device=device)
        metrics = fid_from_images(arr_0, reference, model(), batch_size=batch_size, device=device, progress=progress)
    else:
        raise UsageError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    return {"dataset": dataset, **metrics}


# Samples for a Fréchet distance whose sampling error is small against the differences it is used to tell apart:
# the covariance of D-dimensional features is rank-deficient below D samples and noisy up to several times D.
# Inception FID is conventionally reported on 50,000 (Heusel et al. 2017); below 10,000 it is biased upward by
# several points.
STABLE_FD_SAMPLES = {"digits": 1000, "inception": 10000}


def check_fd_sample_count(count: int, features: str) -> None:
    """A Fréchet distance needs a covariance: refuse fewer than 2 samples (``UsageError``), and warn below the
    count at which the distance is stable, saying how many it needs."""
    if count < 2:
        raise UsageError(f"a Fréchet distance needs at least 2 samples (a covariance), got {count}: draw more, "
                         f"e.g. `fastgen sample RUN -n {STABLE_FD_SAMPLES[features]}`")
    if count < STABLE_FD_SAMPLES[features]:
        logger.warning("%d samples are too few for a stable Fréchet distance with %s features: it is biased upward "
                       "and noisy; use at least %d", count, features, STABLE_FD_SAMPLES[features])


def evaluate_model(model: Any, n: int, seed: int = 0, steps: int | None = None, net: Any = None,
                   dataset: str | None = None, batch_size: int = 256, **fid_options: Any) -> dict[str, Any]:
    """Draw ``n`` samples from ``model`` (``draw_samples``: ``net`` default ``model.sampling_net()``, ``steps``
    default the method's) and score them for ``dataset`` (default: ``digits`` for 8x8 single-channel models;
    2-D models need ``toy:<name>``, e.g. from ``dataset_of_config(config)``). Images are scored after the uint8
    round trip, so the numbers equal ``fastgen eval`` on the saved file. ``fid_options``: ``inception_weights``,
    ``ref_stats``, ``device`` for cifar10/imagenet."""
    from fastgen.evaluation.sampling import draw_samples, sample_arrays

    samples, labels = draw_samples(model, n, seed=seed, batch_size=batch_size, net=net, steps=steps)
    audio = None
    if isinstance(samples, dict):  # an audio-visual model: the videos as files hold them, the audio as drawn
        samples, audio = samples["video"], samples["audio"].float().numpy()
    arrays = sample_arrays(samples, labels)
    name = detect_dataset(arrays["arr_0"], hint=dataset)
    return evaluate_arrays(arrays["arr_0"], arrays.get("arr_1"), name, audio=audio, **fid_options)


__all__ = ["SampleSet", "detect_dataset", "evaluate_arrays", "evaluate_model", "load_sample_files"]
