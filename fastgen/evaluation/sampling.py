"""Draw samples from a trained method - from a checkpoint on disk or a model in memory - and save them.

* ``load_run(path, device)`` and ``select_net(run, "net" | "ema" | "teacher")`` - a run rebuilt from a checkpoint,
  a checkpoints folder or a run directory, and the network to sample (``fastgen.checkpoint.run``; re-exported).
* ``draw_samples(model, n, seed, ...)`` - ``n`` samples in batches through the method's own
  ``generator_fn(net, noise, steps=..., condition=...)``, so each method decides how its network samples
  (Heun for diffusion models, one step for a DMD2 student...).
* ``save_samples(path, samples, labels)`` - the ``.npz`` of the guided-diffusion evaluation suite (``arr_0``:
  uint8 NHWC images, ``arr_1``: int64 labels when conditional; for 2-D toy data ``arr_0`` is float32 ``(N, 2)``)
  plus a PNG (image grid or scatter plot); videos ``(N, C, F, H, W)`` are stored as uint8 ``(N, F, H, W, C)`` with
  a GIF and an MP4 of the video grid (the MP4 needs PyAV, ``fastgen[diffusers]``). ``fastgen_dataset`` (a string
  such as ``digits``, ``moving_digits`` or ``toy:eight_gaussians``) records the data set so ``fastgen eval`` needs
  no ``--dataset``.

Reproducibility: starting noise comes in fixed chunks of 16 samples, chunk ``c`` drawn by its own generator seeded
from ``SeedSequence([seed, c])``, so the same seed gives the same starting noise whatever the batch size, and
deterministic samplers give the same samples (up to floating-point differences between batch shapes). For methods whose sampler draws fresh noise between
steps, the global torch generator is reseeded from ``(seed, first index)`` for each batch (and restored after),
so the same seed and batch size reproduce the same samples.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fastgen.checkpoint.run import LoadedRun, load_model_weights, load_run, select_net
from fastgen.networks.modalities import cat, is_multimodal, per_modality
from fastgen.utils.errors import UsageError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)
_MASK63 = (1 << 63) - 1


def resolve_device(spec: str = "auto") -> torch.device:
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``; a ``UsageError`` for a device
    this machine does not have."""
    from fastgen.distributed import group as dist_utils

    device = dist_utils.select_device(spec, label=f"--device {spec}")
    if device.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"--device {spec}: use auto, cpu, cuda or cuda:N")
    return device


# -------------------------------------------------------------------------------------------------- sampling
NOISE_CHUNK = 16  # samples per noise generator (fixed, so noise does not depend on the batch size)


def _derived_seed(*words: int) -> int:
    """A well-mixed 64-bit seed from ``words`` (NumPy's ``SeedSequence``). torch's CPU generator (MT19937) keeps
    only the low 32 bits of a seed, so ``(seed << 32) + i`` would repeat across seeds; hashing does not."""
    if any(w < 0 for w in words):
        raise ValueError(f"seeds must be non-negative, got {words}")
    low, high = np.random.SeedSequence(list(words)).generate_state(2, np.uint32)
    return (int(high) << 32 | int(low)) & _MASK63


def noise_seed(seed: int, chunk: int) -> int:
    """The seed of the generator that draws the starting noise of samples ``16 chunk ... 16 chunk + 15``."""
    return _derived_seed(seed, chunk)


def _batch_seed(seed: int, start: int) -> int:
    # A stream apart from every noise chunk's, for samplers that draw noise between steps.
    return _derived_seed(seed, start, 1)


def balanced_labels(n: int, num_classes: int, label: int | None = None) -> torch.Tensor | None:
    """``0, 1, ..., C-1, 0, ...`` (sample ``i`` gets ``i % C``) or all ``label``; ``None`` when unconditional."""
    if num_classes <= 0:
        if label is not None:
            raise UsageError("--label: this model is unconditional (model.num_classes = 0)")
        return None
    if label is not None:
        if not 0 <= label < num_classes:
            raise UsageError(f"--label {label}: must be between 0 and {num_classes - 1}")
        return torch.full((n,), int(label), dtype=torch.long)
    return torch.arange(n, dtype=torch.long) % num_classes


def initial_noise(scheduler: Any, shape: tuple[int, ...], seed: int, start: int, count: int) -> torch.Tensor:
    """Starting noise ``x_{t_max}`` of samples ``start ... start + count - 1`` (float32, CPU): the same rows for
    the same ``seed`` whatever ``start``/``count`` split a run into batches."""
    first, last = start // NOISE_CHUNK, (start + count - 1) // NOISE_CHUNK
    chunks = [
        scheduler.prior_sample((NOISE_CHUNK, *shape), device="cpu", dtype=torch.float32,
                               generator=torch.Generator().manual_seed(noise_seed(seed, c)))
        for c in range(first, last + 1)
    ]
    offset = start - first * NOISE_CHUNK
    return torch.cat(chunks)[offset : offset + count]


@torch.no_grad()
def draw_samples(model: Any, n: int, seed: int = 0, batch_size: int = 256, net: nn.Module | None = None,
                 steps: int | None = None, labels: torch.Tensor | None = None, label: int | None = None,
                 progress: Callable[[int], None] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``n`` samples (float32, CPU; images in ``[-1, 1]``) and their labels (``None`` when unconditional).

    ``net`` defaults to ``model.sampling_net()``; ``steps=None`` lets the method's ``generator_fn`` choose.
    Labels default to ``balanced_labels`` (or all ``label``). ``progress(k)`` is called after each batch of k."""
    if n <= 0 or batch_size <= 0:
        raise UsageError(f"the number of samples and the batch size must be positive (got {n}, {batch_size})")
    net = net if net is not None else model.sampling_net()
    device = next(net.parameters()).device
    dtype = getattr(model, "precision", torch.float32)
    scheduler = getattr(net, "noise_scheduler", None) or model.noise_scheduler
    shapes = getattr(model.config, "modality_shapes", None)
    # a multimodal model draws each modality's noise from its own seed (modality k > 0: a seed derived from (seed, k))
    plan = ({name: (tuple(int(d) for d in shape), seed if k == 0 else _derived_seed(seed, k, 2))
             for k, (name, shape) in enumerate(shapes.items())} if shapes else None)
    shape = tuple(int(s) for s in model.config.input_shape)
    if labels is None:
        labels = balanced_labels(n, int(getattr(model, "num_classes", 0)), label)
    outputs = []
    was_training = net.training
    net.eval()
    cuda = [device.index or 0] if device.type == "cuda" else []
    try:
        for start in range(0, n, batch_size):
            count = min(batch_size, n - start)
            if plan is None:
                noise = initial_noise(scheduler, shape, seed, start, count).to(device=device, dtype=dtype)
            else:
                noise = {name: initial_noise(scheduler, dims, s, start, count).to(device=device, dtype=dtype)
                         for name, (dims, s) in plan.items()}
            condition = labels[start : start + count].to(device) if labels is not None else None
            with torch.random.fork_rng(devices=cuda), _inference_autocast(model):
                torch.manual_seed(_batch_seed(seed, start))
                x = model.generator_fn(net, noise, steps=steps, condition=condition)
            outputs.append(per_modality(lambda v: v.float().cpu(), x))
            if progress is not None:
                progress(count)
    finally:
        net.train(was_training)
    return cat(outputs), labels


# ---------------------------------------------------------------------------------------------------- files
def sample_arrays(samples: torch.Tensor, labels: torch.Tensor | None, dataset: str | None = None) -> dict[str, np.ndarray]:
    """The ``.npz`` content: ``arr_0`` uint8 NHWC images, uint8 ``(N, F, H, W, C)`` videos or float32 ``(N, 2)``
    points, ``arr_1`` labels, ``fastgen_dataset`` when known."""
    from fastgen.utils.images import to_uint8

    if samples.dim() == 4:
        arrays = {"arr_0": to_uint8(samples).numpy()}
    elif samples.dim() == 5:  # (N, C, F, H, W) -> frames as images -> (N, F, H, W, C)
        n, c, f, h, w = samples.shape
        frames = to_uint8(samples.transpose(1, 2).reshape(n * f, c, h, w))
        arrays = {"arr_0": frames.reshape(n, f, h, w, c).numpy()}
    elif samples.dim() == 2:
        arrays = {"arr_0": samples.float().cpu().numpy().astype(np.float32)}
    else:
        raise ValueError(f"cannot store samples of shape {tuple(samples.shape)}")
    if labels is not None:
        arrays["arr_1"] = labels.cpu().numpy().astype(np.int64)
    if dataset:
        arrays["fastgen_dataset"] = np.array(dataset)
    return arrays


def save_samples(path: str | os.PathLike[str], samples: torch.Tensor, labels: torch.Tensor | None,
                 dataset: str | None = None, grid_size: int = 100, nrow: int | None = None) -> tuple[Path, list[Path]]:
    """Write ``path`` (``.npz``) and previews with the same stem: a PNG grid of the first ``grid_size`` images
    (``nrow`` per row; default the number of classes, so each column is one class) or a scatter plot of all points;
    for videos a GIF and an MP4 of the grid of the first ``grid_size`` videos playing together (the MP4 when PyAV is
    installed). Every write is atomic. Returns ``(npz, previews)``."""
    from fastgen.utils.images import save_samples_image, save_samples_video, video_grid_frames
    from fastgen.utils.io import atomic_open

    npz = Path(path)
    if npz.suffix == ".png":
        npz = npz.with_suffix(".npz")
    elif npz.suffix != ".npz":
        npz = npz.with_name(npz.name + ".npz")
    if is_multimodal(samples):
        return _save_audio_video(npz, samples, labels, dataset, grid_size, nrow)
    arrays = sample_arrays(samples, labels, dataset)
    with atomic_open(npz, "wb") as handle:
        np.savez(handle, **arrays)
    shown = samples[:grid_size]
    if samples.dim() in (4, 5) and nrow is None and labels is not None:
        nrow = _class_columns(labels[: len(shown)])
    if samples.dim() == 5:
        previews = [save_samples_video(shown, npz.with_suffix(".gif"), nrow=nrow)]
        import importlib.util

        if importlib.util.find_spec("av") is None:
            logger.warning("no MP4 of the samples: PyAV is not installed (pip install 'fastgen[diffusers]'); the GIF "
                           "shows them")
            return npz, previews
        from fastgen.pipelines.media import write_mp4

        upscale = max(1, 64 // samples.shape[-1])
        frames = np.stack([np.asarray(frame.convert("RGB")) for frame in video_grid_frames(shown, nrow, upscale)])
        write_mp4(npz.with_suffix(".mp4"), frames, fps=8)
        return npz, previews + [npz.with_suffix(".mp4")]
    png = npz.with_suffix(".png")
    save_samples_image(shown if samples.dim() == 4 else samples, png, nrow=nrow if samples.dim() == 4 else None)
    return npz, [png]


#: How many audio-visual samples ``save_samples`` also writes as MP4 files with their sound.
AV_FILES = 8


def _save_audio_video(npz: Path, samples: dict[str, torch.Tensor], labels: torch.Tensor | None,
                      dataset: str | None, grid_size: int, nrow: int | None) -> tuple[Path, list[Path]]:
    """An audio-visual model's samples (``{"video", "audio"}``): the ``.npz`` (``arr_0`` the uint8 videos, ``audio``
    the float32 audio samples as the model draws them, ``waveform`` the rendered sound, ``sample_rate``), a GIF
    of the video grid, and the first ``AV_FILES`` samples as MP4 files with their sound (``<stem>_NNNN.mp4``)."""
    from fastgen.pipelines.media import write_mp4
    from fastgen.utils.images import save_samples_video, to_uint8
    from fastgen.utils.io import atomic_open

    if set(samples) != {"video", "audio"}:
        raise UsageError(f"saving multimodal samples needs the modalities video and audio; got {sorted(samples)}")
    video, audio = samples["video"], samples["audio"]
    renderer = audio_renderer(dataset)
    if renderer is None:
        raise UsageError(f"no way to turn the audio samples of {dataset or 'this data set'} into sound")
    render, rate = renderer
    waveforms = render(audio).float()
    arrays = sample_arrays(video, labels, dataset)
    arrays.update(audio=audio.float().numpy(), waveform=waveforms.numpy(), sample_rate=np.array(rate))
    with atomic_open(npz, "wb") as handle:
        np.savez(handle, **arrays)
    shown = video[:grid_size]
    if nrow is None and labels is not None:
        nrow = _class_columns(labels[: len(shown)])
    previews = [save_samples_video(shown, npz.with_suffix(".gif"), nrow=nrow)]
    n, c, f, h, w = video.shape
    upscale = max(1, 64 // w)
    for i in range(min(AV_FILES, n)):
        frames = to_uint8(video[i].transpose(0, 1)).numpy()  # (F, H, W, C)
        frames = frames.repeat(upscale, axis=1).repeat(upscale, axis=2)
        path = npz.with_name(f"{npz.stem}_{i:04d}.mp4")
        write_mp4(path, frames, fps=max(1, round(f / (waveforms.shape[-1] / rate))), audio=waveforms[i].numpy(),
                  sample_rate=rate)
        previews.append(path)
    return npz, previews


def audio_renderer(dataset: str | None) -> tuple[Callable[[torch.Tensor], torch.Tensor], int] | None:
    """``(render, sample_rate)`` turning a data set's audio samples into ``(N, channels, samples)`` waveforms."""
    if dataset == "audio_video_digits":
        from fastgen.datasets.audio_video_digits import SAMPLE_RATE, spectrogram_to_waveform

        return spectrogram_to_waveform, SAMPLE_RATE
    return None


def _class_columns(labels: torch.Tensor) -> int | None:
    """``C`` when ``labels`` are the balanced ``0..C-1, 0..C-1, ...`` (a grid row then holds each class once)."""
    classes = int(labels.max()) + 1
    balanced = bool((labels == torch.arange(len(labels)) % classes).all())
    return classes if balanced and 1 < classes <= 20 else None


#: The built-in data sets whose samples are pixels (a network trained on them - a diffusers one too - draws images).
PIXEL_DATASETS = ("digits", "moving_digits", "audio_video_digits")


def dataset_of_config(config: Any) -> str | None:
    """The data set a run trained on, as ``fastgen eval`` names it: ``digits``, ``moving_digits``, ``toy:<name>``,
    ``cifar10``, ``imagenet`` - or ``None`` when the training data loader does not say."""
    loader = getattr(config, "dataloader_train", None)
    dataset = loader.get("dataset") if loader is not None and hasattr(loader, "get") else None
    target = str(dataset.get("_target_", "")) if dataset is not None and hasattr(dataset, "get") else ""
    if target.endswith("digits.DigitsDataset"):
        return "digits"
    if target.endswith("moving_digits.MovingDigitsDataset"):
        return "moving_digits"
    if target.endswith("audio_video_digits.AudioVideoDigitsDataset"):
        return "audio_video_digits"
    if target.endswith("toy.ToyDataset"):
        return f"toy:{dataset.get('name', 'eight_gaussians')}"
    lowered = target.lower()
    if target.endswith("image_zip.ImageZipDataset"):  # an image zip: its file says which (cifar10-32x32.zip, ...)
        lowered = str(dataset.get("path", "")).rsplit("/", 1)[-1].lower()
    for name in ("cifar10", "imagenet"):
        if name in lowered:
            return name
    return None


__all__ = [
    "PIXEL_DATASETS",
    "LoadedRun",
    "balanced_labels",
    "dataset_of_config",
    "draw_samples",
    "load_model_weights",
    "load_run",
    "resolve_device",
    "initial_noise",
    "noise_seed",
    "sample_arrays",
    "save_samples",
    "select_net",
]


def _inference_autocast(model: Any) -> Any:
    """The method's sampling autocast (``model.precision_amp_infer``), or none for a model without one."""
    import contextlib

    context = getattr(model, "inference_autocast", None)
    return context() if callable(context) else contextlib.nullcontext()
