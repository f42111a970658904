"""Which diffusers scheduler, configured how, samples exactly as a fastgen network samples - and the pipeline call
arguments that go with it.

A ``SamplingPlan`` says how a network samples in fastgen's terms: at which times it is evaluated (from ``t_max``
down) and how the sampler moves from one time to the next:

* ``"renoise"`` - the few-step students of DMD2, SiD, f-distill, LADD and consistency models: ``x0 = G(x_t, t)``,
  then ``x_{t'} = alpha(t') x0 + sigma(t') eps`` with fresh noise (Song et al. 2023, Algorithm 1);
* ``"ode"`` - a deterministic DDIM step, ``x_{t'} = alpha(t') x0 + sigma(t') (x_t - alpha(t) x0) / sigma(t)``
  (Song et al. 2021, Eq. 12 with eta = 0): KD students, and a teacher or fine-tuned model sampled over its grid.

The diffusers counterparts (checked against diffusers' own pipelines in the tests):

=========  ==========================================================  ============================================
family     renoise                                                     ode
=========  ==========================================================  ============================================
sd         ``LCMScheduler`` on the same betas, ``timesteps=[t N - 1]``  ``EulerDiscreteScheduler``, same timesteps
           (its boundary scalings pushed to identity)                  (Euler in ``sigma`` is DDIM)
flux       ``FlowMatchEulerDiscreteScheduler(stochastic_sampling)``,   the same without ``stochastic_sampling``
           ``sigmas`` = the times, no shift
wan        as flux; ``WanPipeline`` takes no ``sigmas``: the grid      as renoise
           comes from ``num_inference_steps`` and ``shift_terminal``
qwenimage  as flux (``sigmas``: the times, no dynamic shift)           as renoise; guidance is the pipeline's
                                                                       ``true_cfg_scale`` against ``""``
ltx2       refused (its re-noising per stream is not reproduced)       as flux; guidance per stream (``guidance_scale``
                                                                       video, ``audio_guidance_scale`` audio), its
                                                                       rescale / STG / modality guidance the plan's
cogvideox  ``LCMScheduler`` as sd, its ``trained_betas`` those of      ``CogVideoXDDIMScheduler`` with the model's
           CogVideoX's ``alphas_cumprod`` (SNR shift, zero terminal    own schedule, "trailing": its grid comes
           SNR: LCM has neither)                                       from ``num_inference_steps`` (it steps
                                                                       ``t -> t - N // n``)
cosmos2    one step only: its scheduler cannot re-noise EDM latents    ``FlowMatchEulerDiscreteScheduler`` on Karras
           (``Cosmos2TextToImagePipeline``; the sample is the state    sigmas (its grid from ``num_inference_steps``
           at ``sigma_min`` after that step, ``x0 + 0.002 (x_T - x0)   alone), ending at ``sigma_min``:
           / 80``, not ``x0``)                                         ``SamplingPlan.end``
cosmos25   as wan (the pipeline reads ``scheduler.sigmas[i]`` as the time;   as renoise; guidance ``g = s - 1`` (only
           its released UniPC scheduler is replaced)                   ``g > 1``) against ``""``
=========  ==========================================================  ============================================

The exported schedulers never shift: fastgen's times already are the shifted ones (Qwen-Image's network samples
its pipeline's dynamic shift for its latent size and its ``shift_terminal``, ``qwenimage_transformer``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastgen.utils.errors import UsageError

SAMPLERS = ("renoise", "ode")
# the scale LCM's boundary condition c_skip = s_d^2 / ((10 t s)^2 + s_d^2) is pushed with: c_skip < 1e-12 from t = 1
LCM_TIMESTEP_SCALING = 1.0e6


@dataclass(frozen=True)
class SamplingPlan:
    """How a network samples: ``sampler`` (``SAMPLERS``), its evaluation ``times`` from ``t_max`` down, the
    classifier-free guidance ``guidance`` against the negative prompt (1: none), and where the ODE ends: ``end = 0``
    returns the denoised estimate at the last time, a positive ``end`` the state the last DDIM step reaches there,
    unevaluated (Cosmos Predict2's pipelines stop at ``sigma_min``: ``EDMFlowScheduler.stops_at_last_time``).
    ``modality_guidance``: a multimodal sample's per-modality scales where they differ from ``guidance``
    (``model.modality_guidance_scales``; LTX-2's pipeline guides audio harder than video). ``extra``: the run's
    ``PipelineGuidance`` (LTX-2's guidance rescale, STG, modality isolation; ``fastgen.methods.multimodal``), or
    ``None`` when those are off."""

    sampler: str
    times: tuple[float, ...]
    guidance: float = 1.0
    end: float = 0.0
    modality_guidance: Mapping[str, float] = field(default_factory=dict, hash=False)
    extra: Any = field(default=None, hash=False)

    def scale(self, modality: str | None = None) -> float:
        """The guidance scale of ``modality`` (``None``: a one-modality sample)."""
        return float(self.modality_guidance.get(modality, self.guidance)) if modality is not None else self.guidance

    def guided(self, modalities: Iterable[str] | None = None) -> bool:
        """Whether any of ``modalities`` (default: all the plan names, and the base scale) is guided (scale != 1):
        sampling then evaluates the negative prompt too."""
        names = list(self.modality_guidance) if modalities is None else list(modalities)
        scales = [self.scale(n) for n in names] + ([self.guidance] if modalities is None else [])
        return any(s != 1.0 for s in scales)

    def __post_init__(self) -> None:
        object.__setattr__(self, "modality_guidance", {str(k): float(v) for k, v in self.modality_guidance.items()})
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if not self.times or any(b >= a for a, b in zip(self.times, self.times[1:])):
            raise ValueError(f"times must be decreasing and non-empty, got {list(self.times)}")
        if self.end < 0 or (self.end > 0 and self.end >= self.times[-1]):
            raise ValueError(f"end must be 0 or in (0, the last time {self.times[-1]}), got {self.end}")


def plan_of(model: Any, which: str, steps: int | None = None, guidance: float | None = None,
            modality_guidance: Mapping[str, float] | None = None) -> SamplingPlan:
    """The plan of network ``which`` (net, ema, teacher) of a method: a distillation student's own sampler and
    times; a teacher, or the network of a method without a student sampler (SFT), the DDIM ODE over its schedule's
    ``steps``-step grid (default ``model.sample_steps``; on a discrete schedule, each time moved to its nearest
    trained step) with ``guidance`` (default the run's ``guidance_scale``) and, for a multimodal model, the run's
    ``model.modality_guidance_scales`` updated by ``modality_guidance`` (the modalities that differ from
    ``guidance``) and the run's ``PipelineGuidance`` (``SamplingPlan.extra``: LTX-2's rescale, STG, isolation)."""
    sampler = getattr(model, "student_sampler", None)
    if which != "teacher" and sampler == "pdd":  # fused blocks: an Euler step per block (fastgen.pipelines.pdd_blocks)
        return SamplingPlan("ode", tuple(model.block_times(model.sampling_blocks(steps))))
    if which != "teacher" and sampler is not None:
        if sampler not in SAMPLERS:
            raise UsageError(f"{type(model).__name__} samples with its own rule ({sampler}); no diffusers scheduler "
                             "reproduces it")
        return SamplingPlan(sampler, tuple(float(t) for t in model.student_times()))
    steps = int(steps or model.config.sample_steps)
    schedule = model.noise_scheduler
    grid = schedule.sampling_times(steps).tolist()[:-1]
    trained = getattr(schedule, "num_train_timesteps", None)
    if trained:  # a discrete schedule: on its trained steps t = (k + 1) / N, where diffusers' schedulers evaluate
        grid = sorted({(max(round(t * trained - 1), 0) + 1) / trained for t in grid}, reverse=True)
    end = 0.0
    if getattr(schedule, "stops_at_last_time", False):  # the sample is the state at the grid's last time
        if len(grid) < 2:
            raise UsageError(f"{type(schedule).__name__} samples {steps} step(s) as its pipeline does: the last one "
                             "has length zero, so sampling needs at least 2")
        grid, end = grid[:-1], grid[-1]
    if guidance is None:
        guidance = getattr(model.config, "guidance_scale", None) or 1.0
    per_modality = {**(getattr(model.config, "modality_guidance_scales", None) or {}), **(modality_guidance or {})}
    shapes = getattr(model.config, "modality_shapes", None) or {}
    unknown = sorted(set(per_modality) - set(shapes))
    if unknown:
        raise UsageError(f"guidance for {unknown}: not modalities of this model"
                         + (f" ({sorted(shapes)})" if shapes else " (it samples one modality)"))
    extra = None
    if shapes:
        from fastgen.methods.multimodal import pipeline_guidance

        extra = pipeline_guidance(model.config, list(shapes))
    return SamplingPlan("ode", tuple(float(t) for t in grid), float(guidance), float(end), per_modality, extra)


@dataclass
class DiffusersSampling:
    """What an exported pipeline needs: its ``scheduler`` and the ``call`` arguments (JSON values) that make it
    sample as ``plan``; ``global_seed``: the pipeline draws the re-noising from torch's global generator (seed it
    with ``torch.manual_seed`` before the call to reproduce fastgen's samples)."""

    scheduler: Any
    call: dict[str, Any] = field(default_factory=dict)
    global_seed: bool = False


def _discrete_timesteps(times: tuple[float, ...], n: int) -> list[int]:
    steps = [t * n - 1.0 for t in times]
    rounded = [int(round(s)) for s in steps]
    off = [t for t, s, r in zip(times, steps, rounded) if abs(s - r) > 1e-3]
    if off or min(rounded) < 0:
        raise UsageError(f"the times {list(times)} are not on the {n}-step grid of the discrete schedule "
                         f"(t = (k + 1) / {n}); a diffusers scheduler takes whole timesteps")
    return rounded


def _sd(plan: SamplingPlan, schedule: Any) -> DiffusersSampling:
    from fastgen.networks.noise_schedules import DiscreteVPScheduler

    if not isinstance(schedule, DiscreteVPScheduler):
        raise UsageError(f"an SD pipeline samples the discrete VP schedule; this network has {type(schedule).__name__}")
    if schedule.snr_shift_scale != 1.0 or schedule.rescale_betas_zero_snr:
        raise UsageError("an SD pipeline's schedulers have no SNR shift or zero-terminal-SNR rescale (CogVideoX's); "
                         "this network's schedule has them")
    import diffusers

    n = schedule.num_train_timesteps
    common = {"num_train_timesteps": n, "beta_start": schedule.beta_start, "beta_end": schedule.beta_end,
              "beta_schedule": schedule.beta_schedule,
              "prediction_type": {"eps": "epsilon", "v": "v_prediction"}[schedule.native_pred_type]}
    if plan.sampler == "renoise":
        scheduler = diffusers.LCMScheduler(**common, original_inference_steps=n, clip_sample=False,
                                           set_alpha_to_one=True, timestep_scaling=LCM_TIMESTEP_SCALING)
    else:  # the pipeline's latents are eps * sqrt(sigma_max^2 + 1) with "leading": the model input starts at eps
        scheduler = diffusers.EulerDiscreteScheduler(**common, timestep_spacing="leading", steps_offset=1)
    call: dict[str, Any] = {"timesteps": _discrete_timesteps(plan.times, n), "guidance_scale": plan.guidance}
    return DiffusersSampling(scheduler, call)


def _flow(plan: SamplingPlan, schedule: Any, family: str, backbone: Any) -> DiffusersSampling:
    from fastgen.networks.noise_schedules import RectifiedFlowScheduler

    if not isinstance(schedule, RectifiedFlowScheduler):
        raise UsageError(f"a {family} pipeline samples rectified flow; this network has {type(schedule).__name__}")
    import diffusers

    n = len(plan.times)
    stochastic = plan.sampler == "renoise"
    config: dict[str, Any] = {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False,
                              "stochastic_sampling": stochastic}
    call: dict[str, Any] = {"num_inference_steps": n}
    if family == "flux":
        call["sigmas"] = list(plan.times)
        call["guidance_scale"] = float(getattr(backbone, "guidance", 3.5))  # the embedded guidance it was run with
        if plan.guidance != 1.0:
            call.update(true_cfg_scale=plan.guidance, negative_prompt="")  # Flux guides only given a negative prompt
    elif family == "qwenimage":
        call["sigmas"] = list(plan.times)
        # QwenImagePipeline guides (its norm-rescaled true CFG) only above 1 and given a negative prompt; 1 is
        # passed so that its default of 4 does not warn
        if plan.guidance < 1.0:
            raise UsageError(f"guidance {plan.guidance}: QwenImagePipeline applies true_cfg_scale only above 1")
        call["true_cfg_scale"] = plan.guidance
        if plan.guidance != 1.0:
            call["negative_prompt"] = ""
    elif family == "ltx2":
        # LTX2Pipeline: guidance_scale for video, audio_guidance_scale for audio, and the plan's rescale, STG and
        # modality-isolation terms per stream (off without them); re-noising it draws per stream from the global
        # generator in its packed layouts, which fastgen's multimodal students do not reproduce
        if stochastic:
            raise UsageError("an LTX-2 student's re-noising between steps is not reproduced by LTX2Pipeline's "
                             "scheduler; export the teacher or an ODE-sampled network")
        video, audio = plan.scale("video"), plan.scale("audio")
        # the pipeline guides only when a scale is above 1 (then both streams, with their own scale), and reads an
        # audio scale of 0 as unset (``audio_guidance_scale or guidance_scale``)
        if plan.guided(("video", "audio")) and max(video, audio) <= 1.0:
            raise UsageError(f"guidance {video} (video), {audio} (audio): LTX2Pipeline guides only when a scale is "
                             "above 1")
        if audio == 0.0 and video != 0.0:
            raise UsageError("audio guidance 0: LTX2Pipeline reads audio_guidance_scale=0 as unset (the video's)")
        extra = plan.extra
        terms = {"guidance_rescale": extra.rescale if extra else {}, "stg_scale": extra.stg if extra else {},
                 "modality_scale": extra.isolation if extra else {}}
        call["sigmas"] = list(plan.times)
        call.update(guidance_scale=video, audio_guidance_scale=audio)
        for name, values in terms.items():
            off = 1.0 if name == "modality_scale" else 0.0
            v, a = float(values.get("video", off)), float(values.get("audio", off))
            if a == 0.0 and v != 0.0:  # ``audio_stg_scale or stg_scale``: the pipeline's audio 0 is the video's
                raise UsageError(f"audio {name} 0 with video {v}: LTX2Pipeline reads audio_{name}=0 as unset (the "
                                 "video's)")
            call.update({name: v, f"audio_{name}": a})
        call["spatio_temporal_guidance_blocks"] = list(extra.stg_blocks) if extra and extra.stg_on else None
    elif family == "cosmos25":
        # Cosmos2_5_PredictBasePipeline: v_c + g (v_c - v_u), only for g > 1 - fastgen's s = g + 1; its default
        # negative prompt is a long sentence, fastgen's ""
        if plan.guidance != 1.0 and plan.guidance <= 2.0:
            raise UsageError(f"guidance {plan.guidance}: Cosmos2_5_PredictBasePipeline guides with guidance_scale "
                             "g = s - 1 only above 1, so s must be 1 or above 2")
        config["shift_terminal"] = plan.times[-1] if n > 1 else None
        call["guidance_scale"] = max(plan.guidance - 1.0, 0.0)
        if plan.guidance != 1.0:
            call["negative_prompt"] = ""
    else:
        config["shift_terminal"] = plan.times[-1] if n > 1 else None
        call["guidance_scale"] = plan.guidance
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(**config)
    if family in ("wan", "cosmos3", "cosmos25"):  # Cosmos3OmniPipeline and Cosmos 2.5's, too, take no sigmas
        scheduler.set_timesteps(n)
        got = scheduler.sigmas[:-1].tolist()
        pipeline = {"wan": "WanPipeline", "cosmos3": "Cosmos3OmniPipeline",
                    "cosmos25": "Cosmos2_5_PredictBasePipeline"}[family]
        if any(abs(a - b) > 1e-5 for a, b in zip(got, plan.times)):
            raise UsageError(f"{pipeline} sets its times from num_inference_steps alone; the times {list(plan.times)} "
                             f"are not a uniform grid from 1 that its scheduler can reproduce (it would sample at "
                             f"{[round(t, 5) for t in got]})")
        scheduler = diffusers.FlowMatchEulerDiscreteScheduler(**config)  # fresh: no state from the check
    return DiffusersSampling(scheduler, call, global_seed=stochastic and n > 1)


def _cogvideox(plan: SamplingPlan, schedule: Any) -> DiffusersSampling:
    """``CogVideoXPipeline``: it guides with plain CFG only above 1 (``guidance_scale``, default 6: always passed), and
    hands its generator to the scheduler's ``step`` when it takes one (LCM's re-noising; ``fastgen.pipelines.noise``)."""
    from fastgen.networks.noise_schedules import DiscreteVPScheduler

    if not isinstance(schedule, DiscreteVPScheduler):
        raise UsageError(f"a CogVideoX pipeline samples the discrete VP schedule; this network has "
                         f"{type(schedule).__name__}")
    if plan.guidance < 1.0:
        raise UsageError(f"guidance {plan.guidance}: CogVideoXPipeline applies guidance_scale only above 1")
    import diffusers
    import torch

    n = schedule.num_train_timesteps
    prediction = {"eps": "epsilon", "v": "v_prediction"}[schedule.native_pred_type]
    timesteps = _discrete_timesteps(plan.times, n)
    call: dict[str, Any] = {"guidance_scale": plan.guidance}
    if plan.sampler == "renoise":
        abar = schedule.alphas_cumprod()
        betas = (1.0 - abar / torch.cat([abar.new_ones(1), abar[:-1]])).tolist()  # abar_k = prod_{j <= k} (1 - beta_j)
        scheduler = diffusers.LCMScheduler(num_train_timesteps=n, trained_betas=betas, prediction_type=prediction,
                                           original_inference_steps=n, clip_sample=False, set_alpha_to_one=True,
                                           timestep_scaling=LCM_TIMESTEP_SCALING)
        call["timesteps"] = timesteps
        return DiffusersSampling(scheduler, call)
    config = {"num_train_timesteps": n, "beta_start": schedule.beta_start, "beta_end": schedule.beta_end,
              "beta_schedule": schedule.beta_schedule, "prediction_type": prediction,
              "snr_shift_scale": schedule.snr_shift_scale, "rescale_betas_zero_snr": schedule.rescale_betas_zero_snr,
              "timestep_spacing": "trailing", "set_alpha_to_one": True, "clip_sample": False, "steps_offset": 0}
    scheduler = diffusers.CogVideoXDDIMScheduler(**config)
    steps = len(timesteps)
    scheduler.set_timesteps(steps)
    grid = scheduler.timesteps.tolist()
    reached = [t - n // steps for t in grid]  # CogVideoXDDIMScheduler.step's prev_timestep
    if grid != timesteps or reached[:-1] != grid[1:] or reached[-1] >= 0:
        raise UsageError(f"CogVideoXDDIMScheduler sets its timesteps from num_inference_steps alone and steps from t "
                         f"to t - {n} // {steps}: the timesteps {timesteps} are not that chain (it would evaluate "
                         f"{grid}); choose a step count that divides {n}")
    call["num_inference_steps"] = steps
    return DiffusersSampling(diffusers.CogVideoXDDIMScheduler(**config), call)


def _cosmos2(plan: SamplingPlan, schedule: Any) -> DiffusersSampling:
    """``Cosmos2TextToImagePipeline`` and ``Cosmos2VideoToWorldPipeline`` (a video-to-world network; the call then
    takes the conditioning ``image`` or ``video``, ``fastgen.pipelines.world``): ``FlowMatchEulerDiscreteScheduler`` with ``use_karras_sigmas`` over EDM's
    ``sigma`` (the pipeline registers ``sigma_min`` 0.002, ``sigma_max`` 80 and ``final_sigmas_type="sigma_min"``
    itself), stepped on the pipeline's epsilon ``(x - x0) / sigma``: Euler in ``sigma`` is the DDIM step. Its
    ``n`` steps evaluate Karras' first ``n - 1`` sigmas and end at the last, ``sigma_min`` (the last step has length
    zero). It guides ``x_c + g (x_c - x_u)`` only for ``g > 1``: fastgen's scale ``s`` is ``g + 1``."""
    import diffusers
    import torch

    from fastgen.networks.noise_schedules import EDMFlowScheduler

    if not isinstance(schedule, EDMFlowScheduler):
        raise UsageError(f"a Cosmos Predict2 pipeline samples EDMFlowScheduler; this network has "
                         f"{type(schedule).__name__}")
    fixed = {"sigma_min": 0.002, "sigma_max": 80.0, "sigma_data": 1.0}
    if any(abs(getattr(schedule, k) - v) > 1e-9 for k, v in fixed.items()) or schedule.rho != 7.0:
        raise UsageError(f"the Cosmos Predict2 pipelines fix {fixed} and rho 7; this network's schedule has other "
                         "values")
    if plan.sampler == "renoise" and len(plan.times) > 1:
        raise UsageError("a multi-step student re-noises x0 + sigma eps between steps, which the Cosmos Predict2 "
                         "pipeline's scheduler does not do; export a one-step student, an ODE-sampled network or "
                         "the teacher")
    if plan.guidance != 1.0 and plan.guidance <= 2.0:
        raise UsageError(f"guidance {plan.guidance}: the Cosmos Predict2 pipelines guide with guidance_scale g = s - "
                         "1 only above 1, so s must be 1 or above 2")
    steps = len(plan.times) + 1

    def scheduler() -> Any:  # the released folders' scheduler, with what the pipeline registers into it
        made = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, use_karras_sigmas=True)
        made.register_to_config(**fixed, final_sigmas_type="sigma_min")
        return made

    probe = scheduler()
    probe.set_timesteps(sigmas=torch.linspace(0, 1, steps, dtype=torch.float64).tolist())
    grid = probe.sigmas[:-1].tolist()
    want = [*plan.times, plan.end if plan.sampler == "ode" else grid[-1]]
    if any(abs(a - b) > 1e-5 * max(1.0, b) for a, b in zip(want, grid)):
        raise UsageError(f"the Cosmos Predict2 pipelines set their sigmas from num_inference_steps alone (Karras, rho "
                         f"7, 80 -> 0.002); the times {list(plan.times)} ending at {plan.end} are not that grid (it "
                         f"would evaluate {[round(t, 5) for t in grid[:-1]]} and end at {grid[-1]:.5g})")
    call: dict[str, Any] = {"num_inference_steps": steps, "guidance_scale": max(plan.guidance - 1.0, 0.0)}
    if plan.guidance != 1.0:
        call["negative_prompt"] = ""  # fastgen's default negative prompt (the pipeline's own is a long sentence)
    return DiffusersSampling(scheduler(), call)


def diffusers_sampling(family: str, plan: SamplingPlan, net: Any) -> DiffusersSampling:
    """The scheduler and call arguments with which the ``family``'s pipeline samples ``net`` (a ``DiffusionNet``)
    as ``plan`` says."""
    schedule, backbone = net.noise_scheduler, net.backbone
    if family != "ltx2" and any(plan.scale(m) != plan.guidance for m in plan.modality_guidance):
        raise UsageError(f"the {family} pipeline guides every modality with one scale; this plan guides "
                         f"{dict(plan.modality_guidance)} apart from {plan.guidance}")
    if plan.times[0] < float(schedule.t_max) - 1e-6:
        raise UsageError(f"the first time {plan.times[0]} is below t_max {schedule.t_max}: a diffusers pipeline starts "
                         "from unit noise at any first step, fastgen from pure noise at that time's level")
    if family in ("sd", "sdxl"):
        return _sd(plan, schedule)
    if family in ("flux", "wan", "qwenimage", "ltx2", "cosmos3", "cosmos25"):
        return _flow(plan, schedule, family, backbone)
    if family == "cogvideox":
        return _cogvideox(plan, schedule)
    if family == "cosmos2":
        return _cosmos2(plan, schedule)
    raise UsageError(f"no diffusers export for the family {family!r}")


__all__ = ["DiffusersSampling", "SAMPLERS", "SamplingPlan", "diffusers_sampling", "plan_of"]
