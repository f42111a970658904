"""Video-to-world conditioning: the first ``k`` latent frames of a video are given clean, the rest generated.

Cosmos Predict2's video-to-world models (``Cosmos2VideoToWorldPipeline``) continue a video from its first frames:
the conditioning image or clip is encoded, and on its ``k`` latent frames the network

* reads the clean latents themselves (not the noisy state scaled by ``c_in``),
* at a fixed small conditioning time (the pipeline's ``sigma_conditioning = 1e-4``: the backbone's
  ``conditioning_time``, in the schedule's own time), one per frame, the generated frames at the sampler's time,
* with a condition-mask channel that is 1 on them (the backbone builds it from ``conditioning_frames``),

and its denoised estimate there is replaced by the clean latents. fastgen keeps the given frames *in band*: the
first ``k`` frames of ``x_t`` **are** the clean latents (training puts the data's frames there, ``with_given_frames``;
sampling starts from noise with the conditioning frames put there), so conditions, guidance and batching stay
tensors as for every other network. Because the denoised estimate on those frames equals the state, every ODE step
of EDM's and rectified flow's samplers (``x' = x0 + (sigma' / sigma) (x - x0)``) leaves them where they are, while
the pipeline's state there drifts from ``sigma_max`` noise to the clean latents and ends ``sigma_min`` away from
them (``x0 + sigma_min (x_T - x0) / sigma_max``). The generated frames are the pipeline's to the last bit; the
conditioning frames of the two samples differ by that last ``sigma_min`` step (``test_cosmos_predict2``).

SFT's loss is taken over the generated frames only (``generated_frames_mean``): the given ones carry no target.
DMD2 (``model.conditioning_frames``) gives its student, teacher and fake score the data's first frames through
``WithConditioningFrames(net, k, clean)``, which puts them back into every state it is called with (a sample
noised for the critics, a multi-step student's re-noised state), so that every network sees what the pipeline's
would; the distribution-matching gradient is zero on the given frames (both scores return them), its normaliser
and the fake score's loss are taken over the generated frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fastgen.networks.noise_schedules import NoiseScheduler
from fastgen.utils.errors import UsageError


def temporal_factor(vae: Any) -> int:
    """How many pixel frames one latent frame holds after the first (``2 ** sum(temperal_downsample)``, as the
    Cosmos and Wan pipelines compute it)."""
    return 2 ** sum(bool(d) for d in getattr(vae.config, "temperal_downsample", ()) or ())


def after_given(x: torch.Tensor, frames: int) -> torch.Tensor:
    """The frames of a ``(B, C, F, H, W)`` video after its first ``frames`` (the generated ones); ``x`` itself when
    none are given."""
    return x[:, :, frames:] if frames > 0 else x


def frame_mask(x: torch.Tensor, frames: int) -> torch.Tensor:
    """``(1, 1, F, 1, 1)``: True on the first ``frames`` frames of a ``(B, C, F, H, W)`` video."""
    return (torch.arange(x.shape[2], device=x.device) < frames).view(1, 1, -1, 1, 1)


def check_conditioning_frames(backbone: Any, x_t: torch.Tensor, frames: int, has_r: bool) -> torch.Tensor:
    """The given-frame mask of ``x_t`` after checking that ``backbone`` reads a condition mask and that ``x_t`` is a
    video with frames left to generate (one-line ``ValueError`` otherwise)."""
    if not getattr(backbone, "takes_conditioning_frames", False):
        raise ValueError(f"conditioning_frames: {type(backbone).__name__} reads no condition mask (video-to-world "
                         "models such as Cosmos Predict2's Video2World read one)")
    if has_r:
        raise ValueError("conditioning_frames: a network with a second time input (MeanFlow) is given no clean frames")
    if x_t.dim() != 5 or not 0 < frames < x_t.shape[2]:
        raise ValueError(f"conditioning_frames={frames} needs a video (B, C, F, H, W) with more than {frames} latent "
                         f"frames; got {tuple(x_t.shape)}")
    return frame_mask(x_t, frames)


def per_frame_noise(schedule: NoiseScheduler, conditioning_time: float, c_noise: torch.Tensor,
                    given: torch.Tensor) -> torch.Tensor:
    """``(B, F)`` network time inputs: ``c_noise(conditioning_time)`` on the given frames, the sample's ``(B,)``
    ``c_noise`` on the others."""
    c_given = schedule.precondition(torch.full_like(c_noise, float(conditioning_time)))[3]
    mask = given.view(1, -1)
    return torch.where(mask, c_given[:, None], c_noise[:, None])


def keep_given_frames(schedule: NoiseScheduler, pred: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                      given: torch.Tensor) -> torch.Tensor:
    """The native prediction ``pred`` whose denoised estimate on the given frames is those frames (the state's
    first frames), as the pipeline replaces its output there; converted through ``x0`` when the native prediction
    is not the denoised estimate."""
    native = schedule.native_pred_type
    x0 = pred if native == "x0" else schedule.convert(pred, x_t, t, native, "x0")
    x0 = torch.where(given, x_t, x0)
    return x0 if native == "x0" else schedule.convert(x0, x_t, t, "x0", native)


def with_given_frames(x_t: torch.Tensor, clean: torch.Tensor, frames: int) -> torch.Tensor:
    """``x_t`` with its first ``frames`` frames replaced by ``clean``'s (the in-band form of the condition)."""
    if frames <= 0:
        return x_t
    return torch.where(frame_mask(x_t, frames), clean.to(x_t.dtype), x_t)


def generated_frames_mean(per_element: torch.Tensor, frames: int) -> torch.Tensor:
    """``(B,)`` means of a ``(B, C, F, H, W)`` per-element loss over the frames after the first ``frames``."""
    return after_given(per_element, frames).flatten(1).mean(dim=1)


class WithConditioningFrames:
    """``net`` called with ``conditioning_frames = frames`` by code that calls ``net(x, t, condition=...)`` (the
    samplers ``fastgen.pipelines.prompts.ode_sample`` and ``fastgen.networks.sampling``, a distilled student's
    ``generate``, DMD2's critics). With ``clean`` (``(B, C, F, H, W)`` latents) the first ``frames`` frames of every
    ``x`` are set to ``clean``'s first: a state that was noised or re-noised (DMD2's critics, a multi-step student)
    gets its given frames back. A batch of ``n B`` rows (several noisings, guidance's conditional and unconditional
    halves) takes ``clean`` ``n`` times, copy ``k`` at rows ``k B .. k B + B - 1``. Every other attribute is
    ``net``'s."""

    def __init__(self, net: Any, frames: int, clean: torch.Tensor | None = None) -> None:
        self.net = net
        self.frames = int(frames)
        self.clean = clean

    def __getattr__(self, name: str) -> Any:
        return getattr(self.net, name)

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.clean is not None:
            copies, rest = divmod(x.shape[0], self.clean.shape[0])
            if rest:
                raise ValueError(f"a batch of {x.shape[0]} rows is not copies of the {self.clean.shape[0]} given clips")
            x = with_given_frames(x, self.clean.repeat(copies, *([1] * (x.dim() - 1))), self.frames)
        return self.net(x, *args, conditioning_frames=self.frames, **kwargs)


def encode_given_clips(codec: Any, padded: Sequence[tuple[torch.Tensor, int]],
                       generators: Sequence[torch.Generator] | None = None) -> tuple[torch.Tensor, int]:
    """``(B, C, F, H, W)`` normalised latents of the conditioning clips, padded as their family's pipeline pads
    them (``padded``: one ``((1, C, num_frames, H, W)`` pixels, given latent frames)`` per sample), each encoded
    with its sample's generator (a posterior sample, drawn before the sample's noise) or without (the mode), and
    the number of given latent frames (one line when the clips differ in it or leave no frame to generate)."""
    if generators is not None and len(generators) != len(padded):
        raise ValueError("one conditioning clip per sample")
    given = {frames for _, frames in padded}
    if len(given) != 1:
        raise UsageError("the conditioning clips of one call must have the same number of frames")
    latents = [codec.encode_images(clip, generator=None if generators is None else generators[i])
               for i, (clip, _) in enumerate(padded)]
    frames, out = given.pop(), torch.cat(latents)
    if frames >= out.shape[2]:
        raise UsageError(f"the conditioning clip gives all {out.shape[2]} latent frames of the sample: no frame is "
                         "left to generate; give a shorter clip")
    return out, frames


__all__ = ["WithConditioningFrames", "after_given", "check_conditioning_frames", "encode_given_clips", "frame_mask",
           "generated_frames_mean", "keep_given_frames", "per_frame_noise", "temporal_factor", "with_given_frames"]
