"""The network contract: a backbone wrapped with its noise schedule's preconditioning.

``DiffusionNet.forward(x_t, t, condition=None, r=None, feature_indices=None, return_logvar=False,
fwd_pred_type=None)`` returns the schedule's native prediction (``x0`` for EDM, ``flow`` for rectified flow), or
the one named by ``fwd_pred_type``. The backbone sees ``F(c_in * x_t, c_noise, condition, r)`` and the output is
``c_skip * x_t + c_out * F`` (Karras et al. 2022, Eq. 7). ``r`` is a second time input for methods that need it
(MeanFlow's interval start); ``feature_indices`` asks the backbone for intermediate features (discriminator
heads); ``features_only=True`` returns just that list of features, and a backbone whose ``forward`` accepts
``features_only`` stops computing once it has them (a discriminator head on a U-Net's bottleneck never needs the
decoder); ``return_logvar`` returns the EDM2 per-time uncertainty ``u(sigma)`` (Karras et al. 2024, Eq. 21) when
the backbone provides one. A backbone whose output projection was widened into ``k`` heads (PDD,
``fastgen.networks.heads``) returns ``k`` times the channels; the forward then returns ``k`` predictions,
``(B, k, C, ...)``, each preconditioned as the single one would be.

``conditioning_frames = k`` (video-to-world: ``fastgen.networks.conditioning_frames``) says that the first ``k`` latent
frames of a video ``x_t`` are not noisy but given clean: the backbone sees them as they are, at the backbone's
``conditioning_time`` and flagged in its condition mask, and the prediction's denoised estimate there is the given
frames themselves (as ``Cosmos2VideoToWorldPipeline`` replaces the model's output on them).

A multimodal backbone (``fastgen.networks.modalities``: LTX-2's video and audio streams) takes and returns a dict
of modalities; ``x_t`` is then that dict and ``t`` one ``(B,)`` tensor shared by the modalities or a dict of them.
Each modality is preconditioned with its own time, the backbone sees the dicts of inputs and ``c_noise`` values
and returns one prediction per modality, and the forward returns the dict of (converted) predictions. A modality
whose output projection was widened into ``k`` heads (PDD, ``head_projections()``) returns ``k`` times its
channels and its prediction is ``(B, k, C, ...)``, each head preconditioned as the single one would be.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from fastgen.networks.conditioning_frames import check_conditioning_frames, keep_given_frames, per_frame_noise
from fastgen.networks.layers import contract_output
from fastgen.networks.modalities import is_multimodal, per_modality
from fastgen.networks.noise_schedules import NoiseScheduler, expand_like


class DiffusionNet(nn.Module):
    def __init__(self, backbone: nn.Module, noise_scheduler: NoiseScheduler) -> None:
        super().__init__()
        self.backbone = backbone
        self.noise_scheduler = noise_scheduler
        self._backbone_exits_early = "features_only" in inspect.signature(backbone.forward).parameters

    def shard_units(self) -> list[nn.Module]:
        """The blocks FSDP shards one by one (``fastgen.distributed.parallelize``): the backbone's, if it lists any."""
        units = getattr(self.backbone, "shard_units", None)
        return list(units()) if callable(units) else []

    def optional_parameters(self) -> list[nn.Parameter]:
        """Parameters a forward uses only when asked (the backbone's, e.g. a log-variance head read with
        ``return_logvar``): DDP must look for unused parameters in a network that has any."""
        optional = getattr(self.backbone, "optional_parameters", None)
        return list(optional()) if callable(optional) else []

    @property
    def native_pred_type(self) -> str:
        return self.noise_scheduler.native_pred_type

    def forward(
        self,
        x_t: torch.Tensor,
        t: torch.Tensor,
        condition: torch.Tensor | None = None,
        r: torch.Tensor | None = None,
        feature_indices: list[int] | None = None,
        return_logvar: bool = False,
        fwd_pred_type: str | None = None,
        features_only: bool = False,
        conditioning_frames: int = 0,
    ) -> Any:
        if features_only and (feature_indices is None or return_logvar):
            raise ValueError("features_only needs feature_indices and excludes return_logvar")
        if is_multimodal(x_t):
            if r is not None or return_logvar or features_only:
                raise ValueError("a multimodal network takes one time input per modality and predicts no log-variance")
            if conditioning_frames:
                raise ValueError("conditioning_frames: a multimodal network is given no clean frames")
            return self._forward_modalities(x_t, t, condition, feature_indices, fwd_pred_type)
        if t.dim() == 0:
            t = t.expand(x_t.shape[0])
        t = t.to(x_t.dtype)
        c_skip, c_out, c_in, c_noise = self.noise_scheduler.precondition(t)
        c_noise_r = None if r is None else self.noise_scheduler.precondition(r.to(x_t.dtype))[3]
        early = {"features_only": True} if features_only and self._backbone_exits_early else {}
        x_in = (expand_like(c_in, x_t) * x_t).to(x_t.dtype)  # float32 coefficients must not promote a bf16 input
        if conditioning_frames:
            given = check_conditioning_frames(self.backbone, x_t, conditioning_frames, r is not None)
            x_in = torch.where(given, x_t, x_in)  # the given frames as they are, not scaled by c_in
            c_noise = per_frame_noise(self.noise_scheduler, self.backbone.conditioning_time, c_noise, given)
            early["conditioning_frames"] = conditioning_frames
        out = self.backbone(
            x_in,
            c_noise,
            condition=condition,
            r_noise=c_noise_r,
            feature_indices=feature_indices,
            return_logvar=return_logvar,
            **early,
        )
        if features_only and self._backbone_exits_early:
            return out
        if features_only:
            return out[1]
        features = logvar = None
        if isinstance(out, tuple):
            out, extras = out[0], out[1:]
            if feature_indices is not None:
                features, extras = extras[0], extras[1:]
            if return_logvar:
                logvar = extras[0]
        elif return_logvar:
            raise ValueError(f"{type(self.backbone).__name__} does not predict a log-variance")
        heads = _head_count(out, x_t)
        if heads > 1 and conditioning_frames:
            raise ValueError("conditioning_frames: a network with widened output heads (PDD) is given no clean frames")
        if heads > 1:  # a widened output projection (fastgen.networks.heads): one prediction per head
            out = out.unflatten(1, (heads, x_t.shape[1])).flatten(0, 1)
            x_t, t = x_t.repeat_interleave(heads, 0), t.repeat_interleave(heads, 0)
            c_skip, c_out = c_skip.repeat_interleave(heads, 0), c_out.repeat_interleave(heads, 0)
        pred = expand_like(c_skip, x_t) * x_t + expand_like(c_out, x_t) * out.to(x_t.dtype)
        if conditioning_frames:
            pred = keep_given_frames(self.noise_scheduler, pred, x_t, t, given)
        if fwd_pred_type is not None and fwd_pred_type != self.native_pred_type:
            pred = self.noise_scheduler.convert(pred, x_t, t, self.native_pred_type, fwd_pred_type)
        if heads > 1:
            pred = pred.unflatten(0, (-1, heads))
        return contract_output(pred, features, logvar)


    def _forward_modalities(self, x_t: dict[str, torch.Tensor], t: Any, condition: torch.Tensor | None,
                            feature_indices: list[int] | None, fwd_pred_type: str | None) -> Any:
        """The forward of a multimodal backbone (module docstring): Karras et al. 2022, Eq. 7, per modality."""
        times = per_modality(lambda x, tm: (tm.expand(x.shape[0]) if tm.dim() == 0 else tm).to(x.dtype), x_t, t)
        coefficients = per_modality(self.noise_scheduler.precondition, times)
        inputs = {name: (expand_like(coefficients[name][2], x) * x).to(x.dtype) for name, x in x_t.items()}
        c_noise = {name: c[3] for name, c in coefficients.items()}
        out = self.backbone(inputs, c_noise, condition=condition, feature_indices=feature_indices)
        features = None
        if isinstance(out, tuple):
            out, features = out[0], (out[1] if feature_indices is not None else None)
        if not is_multimodal(out) or set(out) != set(x_t):
            raise ValueError(f"{type(self.backbone).__name__} must return one prediction per modality {sorted(x_t)}")
        pred = {}
        for name, x in x_t.items():
            c_skip, c_out = coefficients[name][0], coefficients[name][1]
            raw, time = out[name], times[name]
            heads = _head_count(raw, x)
            if heads > 1:  # this stream's widened projection (PDD, fastgen.networks.heads): one prediction per head
                raw = raw.unflatten(1, (heads, x.shape[1])).flatten(0, 1)
                x, time = x.repeat_interleave(heads, 0), time.repeat_interleave(heads, 0)
                c_skip, c_out = c_skip.repeat_interleave(heads, 0), c_out.repeat_interleave(heads, 0)
            pred[name] = expand_like(c_skip, x) * x + expand_like(c_out, x) * raw.to(x.dtype)
            if fwd_pred_type is not None and fwd_pred_type != self.native_pred_type:
                pred[name] = self.noise_scheduler.convert(pred[name], x, time, self.native_pred_type, fwd_pred_type)
            if heads > 1:
                pred[name] = pred[name].unflatten(0, (-1, heads))
        return contract_output(pred, features)


def _head_count(out: torch.Tensor, x_t: torch.Tensor) -> int:
    """How many predictions a backbone output holds: 1, or ``k`` when it has ``k`` times the input's channels
    (a widened output projection, ``fastgen.networks.heads``; then ``forward`` returns ``(B, k, C, ...)``)."""
    if out.dim() != x_t.dim() or out.shape[1] == x_t.shape[1] or out.shape[1] % x_t.shape[1]:
        return 1
    return out.shape[1] // x_t.shape[1]
