"""Scoring text-to-image samples (``fastgen sample --prompt``'s folder: PNGs and ``samples.json``).

* **FID** (Heusel et al. 2017, Eq. 6) of the images against a reference image folder (or ``.npz`` of images or of
  statistics), in the features of FID's InceptionV3 read from a local weights file (``fastgen.evaluation.fid``).
* **CLIP score** (Hessel et al. 2021, Eq. 1, with ``w = 100`` as torchmetrics reports it):
  ``100 * mean_i max(cos(E_I(image_i), E_T(prompt_i)), 0)`` with a local CLIP model - a transformers folder
  holding a ``CLIPModel``, its tokenizer and its image processor (``save_pretrained`` of the three). Prompts longer
  than the text encoder's window are truncated, as CLIP itself would.

Nothing is downloaded: both models come from files the user names.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastgen.utils.errors import UsageError

SAMPLES_FILE = "samples.json"


def is_prompt_samples(path: str | Path) -> bool:
    return (Path(path).expanduser() / SAMPLES_FILE).is_file()


def read_prompt_samples(folder: str | Path) -> tuple[np.ndarray, list[str]]:
    """The images (uint8 ``(N, H, W, 3)``) and prompts of a ``sample --prompt`` folder, in ``samples.json``'s order."""
    from PIL import Image

    folder = Path(folder).expanduser()
    try:
        records = json.loads((folder / SAMPLES_FILE).read_text())
        pairs = [(str(r["file"]), str(r["prompt"])) for r in records]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{folder / SAMPLES_FILE}: not a list of {{file, prompt}} records ({exc})") from None
    images, prompts = [], []
    for name, prompt in pairs:
        file = folder / name
        if Path(name).name != name or file.suffix.lower() != ".png":
            raise UsageError(f"{folder / SAMPLES_FILE}: {name!r} is not a PNG in the folder (videos are not scored)")
        try:
            with Image.open(file) as image:
                images.append(np.asarray(image.convert("RGB"), dtype=np.uint8))
        except OSError as exc:
            raise UsageError(f"{file}: cannot read the image ({exc})") from None
        prompts.append(prompt)
    if not images:
        raise UsageError(f"{folder / SAMPLES_FILE} lists no samples")
    if len({a.shape for a in images}) > 1:
        raise UsageError(f"the images in {folder} have different sizes")
    return np.stack(images), prompts


def load_clip(folder: str | Path, device: torch.device | str = "cpu") -> tuple[Any, Any, Any]:
    """``(model, tokenizer, image_processor)`` of a local transformers CLIP folder (safetensors only)."""
    from fastgen.networks.diffusers_nets import import_extra

    transformers = import_extra("transformers", "CLIP scores")
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file():
        raise UsageError(f"--clip-model {folder}: not a transformers model folder (no config.json)")
    try:
        model = transformers.CLIPModel.from_pretrained(path, use_safetensors=True).eval().to(device)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        # the Pillow image processor: the default one wants torchvision (and warns when it falls back)
        processor_class = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
        processor = processor_class.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--clip-model {folder}: {str(exc).splitlines()[0]}") from None
    return model, tokenizer, processor


@torch.no_grad()
def clip_score(images: np.ndarray, prompts: list[str], clip: tuple[Any, Any, Any], batch_size: int = 32,
               device: torch.device | str = "cpu", progress: Callable[[int], None] | None = None) -> float:
    """The mean CLIP score of ``images`` (uint8 NHWC) against their ``prompts`` (module docstring)."""
    model, tokenizer, processor = clip
    scores = []
    max_length = int(model.config.text_config.max_position_embeddings)
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size]
        pixels = processor(images=list(batch), return_tensors="pt")["pixel_values"].to(device)
        tokens = tokenizer(prompts[start:start + batch_size], padding=True, truncation=True, max_length=max_length,
                           return_tensors="pt").to(device)
        image_features = model.get_image_features(pixel_values=pixels)
        text_features = model.get_text_features(**tokens)
        image_features = getattr(image_features, "pooler_output", image_features)
        text_features = getattr(text_features, "pooler_output", text_features)
        cosine = torch.nn.functional.cosine_similarity(image_features.float(), text_features.float(), dim=-1)
        scores.append(100.0 * cosine.clamp(min=0))
        if progress is not None:
            progress(len(batch))
    return float(torch.cat(scores).mean())


def evaluate_prompt_samples(folder: str | Path, ref_stats: str | None = None, inception_weights: str | None = None,
                            clip_model: str | None = None, batch_size: int = 64, device: torch.device | str = "cpu",
                            progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """``{"num_samples", "fid"?, "clip_score"?}`` of a ``sample --prompt`` folder: FID with ``ref_stats``, CLIP score
    with ``clip_model``; at least one is required."""
    if ref_stats is None and clip_model is None:
        raise UsageError("text-to-image samples are scored against --ref-stats (FID, with --inception-weights) and / or "
                         "--clip-model (CLIP score); give at least one")
    images, prompts = read_prompt_samples(folder)
    metrics: dict[str, Any] = {"dataset": "text-to-image", "num_samples": len(images)}
    if ref_stats is not None:
        from fastgen.evaluation.evaluate import check_fd_sample_count
        from fastgen.evaluation.fid import fid_from_images, load_reference_statistics
        from fastgen.evaluation.inception import load_inception

        inception = None

        def model() -> torch.nn.Module:
            nonlocal inception
            if inception is None:
                inception = load_inception(inception_weights, device=device)
            return inception

        reference = load_reference_statistics(ref_stats, model, batch_size=batch_size, device=device)
        check_fd_sample_count(len(images), "inception")
        metrics["fid"] = fid_from_images(images, reference, model(), batch_size=batch_size, device=device,
                                         progress=progress)["fid"]
    if clip_model is not None:
        metrics["clip_score"] = clip_score(images, prompts, load_clip(clip_model, device), batch_size=batch_size,
                                           device=device, progress=progress)
    return metrics


__all__ = ["SAMPLES_FILE", "clip_score", "evaluate_prompt_samples", "is_prompt_samples", "load_clip",
           "read_prompt_samples"]
