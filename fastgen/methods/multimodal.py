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
* ``PipelineGuidance`` / ``pipeline_guided_x0``: the rest of ``LTX2Pipeline.__call__``'s default guidance - its
  guidance rescale (``model.guidance_rescale``), spatio-temporal guidance (STG, ``model.stg_scale`` at
  ``model.stg_blocks``) and modality-isolation guidance (``model.modality_isolation_scale``) - combined with the
  classifier-free guidance exactly as the pipeline combines them: on the denoised estimates, as deltas from the
  conditional one, then rescaled per stream. Sampling (``ode_sample``, Heun's ``flow_fn``), DMD2's teacher
  (``teacher_x0``) and the diffusers export use the same terms, so a student learns the guidance the pipeline renders.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
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


#: each term's value when off: ``PipelineGuidance``'s rescale, STG and modality-isolation scales
OFF = {"guidance_rescale": 0.0, "stg_scale": 0.0, "modality_isolation_scale": 1.0}


@dataclass(frozen=True)
class PipelineGuidance:
    """``LTX2Pipeline``'s guidance beyond classifier-free guidance, one value per modality (``model.guidance_rescale``,
    ``model.stg_scale`` / ``model.stg_blocks``, ``model.modality_isolation_scale``). With ``x_c`` the conditional
    denoised estimate, ``x_u`` the negative prompt's, ``x_s`` the conditional one with the self-attention of
    ``stg_blocks`` skipped (STG: Hyung et al. 2024, "Spatiotemporal Skip Guidance for Enhanced Video Diffusion
    Sampling", arXiv 2411.18664) and ``x_i`` the conditional one without the audio-video cross-attention, a stream's
    guided estimate is ``g = x_c + (s - 1)(x_c - x_u) + stg (x_c - x_s) + (iso - 1)(x_c - x_i)``, then with rescale
    ``r > 0`` ``r g std(x_c) / std(g) + (1 - r) g`` (Lin et al. 2024, "Common Diffusion Noise Schedules and Sample
    Steps are Flawed", Eq. 15-16; std over each sample) - the pipeline's ``__call__``, in the denoised estimate (the
    rescale is not linear, so the space matters). As the pipeline, the STG pass runs when any stream's STG scale is
    above 0 and the isolation pass when any isolation scale is above 1 (each stream then with its own scale)."""

    rescale: Mapping[str, float] = dataclass_field(default_factory=dict)
    stg: Mapping[str, float] = dataclass_field(default_factory=dict)
    isolation: Mapping[str, float] = dataclass_field(default_factory=dict)
    stg_blocks: tuple[int, ...] = ()

    @property
    def stg_on(self) -> bool:
        return any(v > 0.0 for v in self.stg.values())

    @property
    def isolation_on(self) -> bool:
        return any(v > 1.0 for v in self.isolation.values())

    @property
    def rescale_on(self) -> bool:
        return any(v > 0.0 for v in self.rescale.values())


def _per_modality(config: Any, key: str, names: list[str]) -> dict[str, float]:
    """``model.<key>`` for each of ``names``: one float for all, or a dict (a missing modality: off)."""
    value = getattr(config, key, OFF[key])
    if isinstance(value, Mapping):
        unknown = set(map(str, value)) - set(names)
        if unknown:
            raise ConfigError(f"model.{key} names {sorted(unknown)}, not modalities of the samples ({sorted(names)})")
        return {name: float(value.get(name, OFF[key])) for name in names}
    return {name: float(OFF[key] if value is None else value) for name in names}


def pipeline_guidance(config: Any, names: Iterable[str]) -> PipelineGuidance | None:
    """The run's ``PipelineGuidance`` for the modalities ``names``, or ``None`` when every term is off; a value
    out of range, STG without blocks or blocks without STG is a one-line ``ConfigError``."""
    names = list(names)
    rescale = _per_modality(config, "guidance_rescale", names)
    stg = _per_modality(config, "stg_scale", names)
    isolation = _per_modality(config, "modality_isolation_scale", names)
    blocks = tuple(int(b) for b in (getattr(config, "stg_blocks", None) or ()))
    if any(not 0.0 <= r <= 1.0 for r in rescale.values()):
        raise ConfigError(f"model.guidance_rescale {rescale}: each in [0, 1] (0: off)")
    if any(v < 0.0 for v in stg.values()):
        raise ConfigError(f"model.stg_scale {stg}: each at least 0 (0: off)")
    if any(v < 1.0 for v in isolation.values()):
        raise ConfigError(f"model.modality_isolation_scale {isolation}: each at least 1 (1: off)")
    terms = PipelineGuidance(rescale, stg, isolation, blocks)
    if terms.stg_on and not blocks:
        raise ConfigError("model.stg_scale needs model.stg_blocks, the blocks whose self-attention STG skips "
                          "(LTX2Pipeline's default: [28] for LTX-2.3)")
    if blocks and not terms.stg_on:
        raise ConfigError("model.stg_blocks: no model.stg_scale above 0, so no block is skipped")
    if not (terms.stg_on or terms.isolation_on or terms.rescale_on):
        return None
    return terms


def check_pipeline_guidance(config: Any, net: Any) -> None:
    """At build: ``model.guidance_rescale`` / ``stg_scale`` / ``stg_blocks`` / ``modality_isolation_scale`` set
    (not off) on a network without guidance passes (only LTX-2 has them), on one-modality samples, or STG a network
    ignores, is a one-line ``ConfigError``."""
    given = [key for key, off in (*OFF.items(), ("stg_blocks", [])) if getattr(config, key, off) not in (None, off)]
    if not given:
        return
    shapes = getattr(config, "modality_shapes", None)
    backbone = getattr(net, "backbone", None)
    if not shapes or not callable(getattr(backbone, "perturbed", None)):
        raise ConfigError(f"model.{given[0]}: LTX2Pipeline's guidance passes need a network that has them (LTX-2, "
                          f"multimodal); {type(backbone).__name__} does not")
    terms = pipeline_guidance(config, list(shapes))
    if terms is not None and terms.stg_on:
        why = backbone.check_stg_blocks(terms.stg_blocks)
        if why:
            raise ConfigError(f"model.stg_scale: {why}")


def _rescale(guided: torch.Tensor, cond: torch.Tensor, r: float) -> torch.Tensor:
    """``rescale_noise_cfg`` (Lin et al. 2024, Eq. 15-16): ``r g std(x_c) / std(g) + (1 - r) g``, std per sample."""
    dims = list(range(1, cond.dim()))
    g = guided.float()
    std_c = cond.float().std(dim=dims, keepdim=True)
    std_g = g.std(dim=dims, keepdim=True)
    return (r * (g * (std_c / std_g)) + (1.0 - r) * g).to(guided.dtype)


def pipeline_guided_x0(net: Any, x: dict[str, torch.Tensor], t: Any, condition: torch.Tensor | None,
                       uncondition: torch.Tensor | None, scales: Mapping[str, float] | None,
                       terms: PipelineGuidance | None, batched: bool = True) -> dict[str, torch.Tensor]:
    """A multimodal ``net``'s guided denoised estimate as ``LTX2Pipeline.__call__`` makes it (``PipelineGuidance``):
    the conditional and (with ``uncondition`` and ``scales``) negative passes - one batched pass, or two with
    ``batched=False`` -, then the STG and isolation passes on the conditional prompt through the backbone's
    ``perturbed`` when ``terms`` asks for them, the deltas added to the conditional estimate, and the rescale."""
    from fastgen.networks import modalities

    cfg = uncondition is not None and scales is not None
    if cfg and batched:
        both = net(modalities.cat([x, x]), modalities.cat([t, t]), condition=torch.cat([condition, uncondition]),
                   fwd_pred_type="x0")
        c, u = modalities.chunk(both, 2)
    else:
        c = net(x, t, condition=condition, fwd_pred_type="x0")
        u = net(x, t, condition=uncondition, fwd_pred_type="x0") if cfg else None
    guided = {m: c[m] + (float(scales[m]) - 1.0) * (c[m] - u[m]) for m in c} if cfg else dict(c)
    if terms is None:
        return guided
    backbone = getattr(net, "backbone", None)
    if (terms.stg_on or terms.isolation_on) and not callable(getattr(backbone, "perturbed", None)):
        raise ValueError(f"{type(backbone).__name__} has no guidance passes (STG, modality isolation): LTX-2's")
    if terms.stg_on:
        with backbone.perturbed(stg_blocks=terms.stg_blocks):
            skipped = net(x, t, condition=condition, fwd_pred_type="x0")
        guided = {m: guided[m] + terms.stg[m] * (c[m] - skipped[m]) for m in guided}
    if terms.isolation_on:
        with backbone.perturbed(isolate_modalities=True):
            isolated = net(x, t, condition=condition, fwd_pred_type="x0")
        guided = {m: guided[m] + (terms.isolation[m] - 1.0) * (c[m] - isolated[m]) for m in guided}
    return {m: _rescale(g, c[m], terms.rescale[m]) if terms.rescale[m] > 0.0 else g for m, g in guided.items()}


__all__ = ["OFF", "PipelineGuidance", "check_modalities", "check_pipeline_guidance", "pipeline_guidance",
           "pipeline_guided_x0", "combine_losses", "guidance_scales", "guide", "training_times", "vsd_times"]
