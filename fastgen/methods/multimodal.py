"""What the multimodal methods share (SFT, DMD2 on ``model.modality_shapes``; ``fastgen.networks.modalities``): how
each modality's training time is drawn and how the per-modality losses become one.

* ``training_times``: ``model.modality_times = "shared"`` draws one time per sample from the schedule's training
  distribution and gives it to every modality (the modalities of a sample are equally noisy, as at sampling);
  ``"independent"`` draws one per modality, so the network also learns to denoise one modality given another at a
  different noise level (what joint audio-video models such as LTX-2 use for conditioning one stream on the other).
* ``combine_losses``: the sum over modalities of ``model.modality_loss_weights[m]`` (default 1) times modality
  ``m``'s loss, with each modality's unweighted loss logged as ``<key>_<modality>``.
* ``vsd_times``: the noise levels of DMD2's multimodal iterations (``DMD2Model.multimodal_student_step`` /
  ``multimodal_critic_step``). The student's sample ``x = G(z)`` is a dict; it is noised at per-modality times (``vsd_t_dist``, shared
  or independent as above), the teacher (with guidance) and the fake score give ``D_real`` and ``D_fake`` for every
  modality in one pass each, and each modality's distribution-matching gradient is normalised by its own
  ``mean |x_m - D_real,m|`` (DMD Eq. 7-8): the modalities' scales differ, and one normaliser would let the larger
  one set the other's step. The fake score learns every modality of the student's samples with the denoising loss.
* ``guidance_scales`` / ``guide``: classifier-free guidance ``u_m + s_m (c_m - u_m)`` (Ho & Salimans 2022, Eq. 6)
  per modality, ``s_m`` from ``model.modality_guidance_scales[m]`` or else ``model.guidance_scale``: joint models
  guide their streams differently (``LTX2Pipeline`` guides video with 3 and audio with 7 by default), and a teacher
  guided with one scale would bake the wrong audio guidance into a student.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from fastgen.utils.errors import ConfigError


def check_modalities(config: Any, sample: dict[str, torch.Tensor]) -> None:
    """A ``ConfigError`` when a batch's modalities are not ``model.modality_shapes``'s, or a loss weight names a
    modality the model does not have."""
    shapes = getattr(config, "modality_shapes", None) or {}
    if set(sample) != set(shapes):
        raise ConfigError(f"the batch holds the modalities {sorted(sample)}, model.modality_shapes names "
                          f"{sorted(shapes)}")
    for name, x in sample.items():
        if list(x.shape[1:]) != list(shapes[name]):
            raise ConfigError(f"modality {name!r} has samples of shape {list(x.shape[1:])}, model.modality_shapes "
                              f"says {list(shapes[name])}")
    for field in ("modality_loss_weights", "modality_guidance_scales"):
        unknown = set(getattr(config, field, None) or {}) - set(shapes)
        if unknown:
            raise ConfigError(f"model.{field} names {sorted(unknown)}, not modalities of model.modality_shapes "
                              f"({sorted(shapes)})")


def training_times(model: Any, sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each modality's ``(B,)`` training times (module docstring), from the step's keyed stream."""
    scheduler = model.noise_scheduler
    batch = next(iter(sample.values())).shape[0]
    device = next(iter(sample.values())).device
    if model.config.modality_times == "shared":
        t = scheduler.sample_t(batch, device=device, generator=model.rng)
        return {name: t.to(x.dtype) for name, x in sample.items()}
    return {name: scheduler.sample_t(batch, device=device, generator=model.rng).to(x.dtype)
            for name, x in sample.items()}


def combine_losses(config: Any, losses: dict[str, torch.Tensor], key: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(sum_m w_m loss_m, {key_m: loss_m})`` (module docstring)."""
    weights = getattr(config, "modality_loss_weights", None) or {}
    total = sum(float(weights.get(name, 1.0)) * loss for name, loss in losses.items())
    return total, {f"{key}_{name}": loss.detach() for name, loss in losses.items()}


def vsd_times(model: Any, sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each modality's ``(B,)`` noise levels for the distribution-matching gradient (``sample_vsd_t``), shared or
    independent as ``model.modality_times`` says."""
    batch = next(iter(sample.values())).shape[0]
    device = next(iter(sample.values())).device
    if model.config.modality_times == "shared":
        t = model.sample_vsd_t(batch, device)
        return {name: t for name in sample}
    return {name: model.sample_vsd_t(batch, device) for name in sample}


def guidance_scales(config: Any, names: Iterable[str], base: float | None) -> dict[str, float] | None:
    """Each of the modalities ``names``' guidance scale: ``model.modality_guidance_scales[m]``, else ``base`` (the
    run's ``guidance_scale`` or a caller's override; ``None``: unguided, scale 1). ``None`` when nothing is guided
    (no base and no per-modality scale), so callers keep their single unguided pass. A per-modality scale that names
    no modality of the sample is a ``ConfigError``: it would silently guide nothing."""
    names = list(names)
    own = {str(k): float(v) for k, v in (getattr(config, "modality_guidance_scales", None) or {}).items()}
    unknown = set(own) - set(names)
    if unknown:
        raise ConfigError(f"model.modality_guidance_scales names {sorted(unknown)}, not modalities of the samples "
                          f"({sorted(names)})")
    if base is None and not own:
        return None
    fallback = 1.0 if base is None else float(base)
    return {name: own.get(name, fallback) for name in names}


def guide(c: dict[str, torch.Tensor], u: dict[str, torch.Tensor], scales: Mapping[str, float]) -> dict[str, torch.Tensor]:
    """``u_m + s_m (c_m - u_m)`` per modality (Ho & Salimans 2022, Eq. 6), linear in the prediction - so the same on
    the denoised estimate, the noise or the velocity (what the pipelines guide)."""
    return {name: u[name] + float(scales[name]) * (c[name] - u[name]) for name in c}


__all__ = ["check_modalities", "combine_losses", "guidance_scales", "guide", "training_times", "vsd_times"]
