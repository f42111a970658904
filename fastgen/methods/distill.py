"""The base class of every distillation method: a frozen teacher, a student that starts as its copy, and
few-step student sampling.

What it adds to ``FastGenModel``:

* ``teacher`` - a frozen ``DiffusionNet`` (``config.teacher``, default the architecture of ``net``) loaded from
  ``config.teacher_ckpt`` (or ``model.pretrained_model_path``) by ``init_frozen_weights()`` on every start. It is
  not written into checkpoints (they hold what trains); a checkpoint records the teacher's fingerprint instead,
  and a resume, ``fastgen sample --teacher`` or an export rebuilds it from its source and refuses one that differs;
  the student starts as the teacher's copy, or from ``config.student_ckpt`` (another run's network, e.g. a KD
  student for DMD2 to refine);
  methods that can also learn from data alone return False from ``uses_teacher()`` in that mode (consistency
  training, MeanFlow): then ``teacher`` is None and ``teacher_ckpt`` only initialises the student;
* ``teacher_x0(x_t, t, condition)`` - the teacher's denoised estimate with classifier-free guidance
  ``D_u + s (D_c - D_u)`` (Ho & Salimans 2022, Eq. 6) when ``config.guidance_scale`` is set (a backbone with its
  own, non-linear rule - Qwen-Image's norm rescale - guides its native prediction with ``backbone.guide``);
* ``generate(net, noise, condition)`` - the student's few-step sampler over ``config.t_list`` (default: one step
  from ``t_max``): ``x0 = G(x_{t_i}, t_i)``, then ``x_{t_{i+1}} = alpha(t_{i+1}) x0 + sigma(t_{i+1}) eps`` with
  fresh noise (Song et al. 2023, Algorithm 1, multistep consistency sampling; DMD2's backward simulation,
  Yin et al. 2024, Sec. 4.5);
* ``generator_fn`` - the teacher samples with the deterministic Heun solver, any other network with
  ``generate``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from fastgen.checkpoint.weights import load_network_state, load_weights
from fastgen.configs.instantiate import instantiate
from fastgen.distributed.keyed_rng import RandomSource, as_noise_source
from fastgen.methods.model import FastGenModel
from fastgen.networks.layers import as_one_hot
from fastgen.networks.modalities import batch_size, first_tensor, is_multimodal, per_modality
from fastgen.utils.errors import CheckpointError, UsageError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)


class DistillationModel(FastGenModel):
    """A method with a frozen teacher; subclasses implement ``single_train_step``."""

    frozen_modules: tuple[str, ...] = ("teacher",)
    # How ``generate`` moves between the student's times, for exports to other samplers (``fastgen.pipelines``):
    # "renoise" (x0, then fresh noise at the next time), "ode" (a deterministic DDIM step), or a method's own
    # ("meanflow", "truncated") that no diffusers scheduler reproduces.
    student_sampler: str = "renoise"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._noise_grid: torch.Tensor | None = None
        self.teacher: nn.Module | None = None
        if self.uses_teacher():
            teacher_cfg = config.teacher if config.teacher is not None else config.net
            self.teacher = instantiate(teacher_cfg).to(self.precision).requires_grad_(False).eval()

    def uses_teacher(self) -> bool:
        """Whether the method needs the teacher network during training. Methods that can also learn from data
        alone (consistency *training*, MeanFlow) return False in that mode: no teacher is built or checkpointed,
        and ``config.teacher_ckpt``, when set, only initialises the student (``init_weights``)."""
        return True

    @property
    def model_dict(self) -> dict[str, nn.Module]:
        if self.teacher is None:
            return super().model_dict
        return {**super().model_dict, "teacher": self.teacher}

    def train(self, mode: bool = True) -> DistillationModel:
        """Frozen networks and EMA copies stay in eval mode whatever the trainer asks of the method."""
        super().train(mode)
        for name in self.frozen_modules:
            module = getattr(self, name, None)
            if module is not None:
                module.eval()
        for ema in self.ema_nets.values():
            ema.eval()
        return self

    def frozen_source(self, name: str) -> str:
        if name != "teacher":
            return super().frozen_source(name)
        if self.config.teacher_ckpt:
            return f"model.teacher_ckpt={self.config.teacher_ckpt}"
        if getattr(self.config, "pretrained_model_path", None):
            return f"model.pretrained_model_path={self.config.pretrained_model_path}"
        return "a random initialisation (model.teacher_ckpt is not set)"

    @torch.no_grad()
    def init_frozen_weights(self) -> None:
        """The teacher from ``model.teacher_ckpt``, else ``model.pretrained_model_path``, else its random
        initialisation (built with the run's seed, so a resume rebuilds the same one)."""
        super().init_frozen_weights()
        if self.teacher is None:
            return
        path = self.config.teacher_ckpt
        if path:
            load_weights(self.teacher, load_network_state(path, self.config.teacher_ckpt_key), path, "model.teacher",
                         what="teacher weights")
            logger.info("loaded the teacher from %s", path)
        elif getattr(self.config, "pretrained_model_path", None):
            self.load_pretrained_model(self.teacher)
        else:
            logger.warning("model.teacher_ckpt is not set: distilling a randomly initialised teacher")

    @torch.no_grad()
    def init_weights(self) -> None:
        path = self.config.teacher_ckpt
        self.init_frozen_weights()
        if self.teacher is None:  # no teacher in this mode: its checkpoint, if any, only initialises the student
            if self.config.student_init_from_teacher:
                self.load_pretrained_model(self.net)
            if path and self.config.student_init_from_teacher:
                load_weights(self.net, load_network_state(path, self.config.teacher_ckpt_key), path, "model.net")
                logger.info("initialised the student from %s", path)
            self.load_student_ckpt()
            self.sync_ema_to_net()
            return
        if self.config.student_init_from_teacher:
            from fastgen.distributed.parallelize import load_full_state_dict

            try:  # a LoRA student (model.net_adapter) takes the teacher as its base
                load_full_state_dict(self.net, self.student_state(self.teacher.state_dict()))
            except RuntimeError:
                raise CheckpointError("model.student_init_from_teacher needs the student and the teacher to have "
                                      "the same architecture; set it to false or make model.teacher match model.net") from None
        self.load_student_ckpt()
        self.sync_ema_to_net()

    def load_student_ckpt(self) -> None:
        """Overwrite the student with ``config.student_ckpt`` when set: a checkpoint file, a checkpoints folder or a
        run directory (newest checkpoint), module ``config.student_ckpt_key``. Starting a distillation from a
        student that already follows the teacher's ODE map (KD) keeps DMD's mode-seeking gradient from having to
        build that map itself."""
        source = getattr(self.config, "student_ckpt", None)
        if not source:
            return
        from fastgen.checkpoint.source import resolve_checkpoint

        try:
            path = resolve_checkpoint(source).checkpoint
        except UsageError as exc:
            raise UsageError(f"model.student_ckpt: {exc} (train the run it names first, or point it at another "
                             "checkpoint, checkpoints folder or run directory)") from None
        load_weights(self.net, self.student_state(load_network_state(str(path), self.config.student_ckpt_key)), path,
                     "model.net")
        logger.info("initialised the student from %s", path)

    def student_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A state dict of the teacher's architecture as the student's (``adapt_net`` may have changed it: PDD
        repeats the output projection into every head). Default: unchanged."""
        return state

    # ---- the teacher ------------------------------------------------------------------------------------------
    def teacher_x0(self, x_t: torch.Tensor, t: torch.Tensor, condition: torch.Tensor | None,
                   guidance_scale: float | None = None) -> torch.Tensor:
        """The teacher's ``x0`` estimate, with classifier-free guidance when ``guidance_scale`` is set (a
        multimodal sample: each modality with its own scale, ``model.modality_guidance_scales``, and with the run's
        ``PipelineGuidance`` terms - LTX-2's rescale, STG and modality isolation - as ``LTX2Pipeline`` combines them,
        so that the student learns the guidance the pipeline renders: ``multimodal.pipeline_guided_x0``)."""
        scale = self.config.guidance_scale if guidance_scale is None else guidance_scale
        teacher = self.with_frames(self.teacher)
        if is_multimodal(x_t):  # each modality guided linearly with its scale, in two passes
            from fastgen.methods.multimodal import guidance_scales, guide, pipeline_guidance, pipeline_guided_x0

            scales = guidance_scales(self.config, x_t, scale)
            terms = pipeline_guidance(self.config, list(x_t))
            if terms is not None:
                guided = scales is not None and condition is not None and self.num_classes > 0
                cond = as_one_hot(condition, self.num_classes).to(first_tensor(x_t).dtype) if guided else condition
                return pipeline_guided_x0(teacher, x_t, t, cond, torch.zeros_like(cond) if guided else None,
                                          scales if guided else None, terms, batched=False)
            if scales is None or condition is None or self.num_classes <= 0:
                return teacher(x_t, t, condition=condition, fwd_pred_type="x0")
            cond = as_one_hot(condition, self.num_classes).to(first_tensor(x_t).dtype)
            c = teacher(x_t, t, condition=cond, fwd_pred_type="x0")
            u = teacher(x_t, t, condition=torch.zeros_like(cond), fwd_pred_type="x0")
            return guide(c, u, scales)
        if scale is None or condition is None or self.num_classes <= 0:
            return teacher(x_t, t, condition=condition, fwd_pred_type="x0")
        cond = as_one_hot(condition, self.num_classes).to(x_t.dtype)
        # a backbone whose guidance is not linear in the prediction (Qwen-Image's norm-rescaled true CFG) guides its
        # native prediction by its own rule, as its pipeline does; linear guidance is the same on any prediction
        backbone = getattr(teacher, "backbone", None)
        native = not getattr(backbone, "linear_guidance", True)
        kind = teacher.native_pred_type if native else "x0"
        both = teacher(torch.cat([x_t, x_t]), torch.cat([t, t]),
                            condition=torch.cat([cond, torch.zeros_like(cond)]), fwd_pred_type=kind)
        c, u = both.chunk(2)
        if native:
            return teacher.noise_scheduler.convert(backbone.guide(c, u, scale), x_t, t, kind, "x0")
        return u + scale * (c - u)

    def with_frames(self, net: Any) -> Any:
        """``net`` given the step's video-to-world frames (``given_frames``: DMD2 with ``model.conditioning_frames``,
        ``fastgen.networks.conditioning_frames.WithConditioningFrames``), or ``net`` itself outside such a step."""
        given = self.__dict__.get("_given_frames")
        if given is None:
            return net
        from fastgen.networks.conditioning_frames import WithConditioningFrames

        return WithConditioningFrames(net, given[1], clean=given[0])

    def frames_given_now(self) -> int:
        """How many leading latent frames the current step gives its networks (0 outside ``given_frames``)."""
        given = self.__dict__.get("_given_frames")
        return 0 if given is None else given[1]

    @contextlib.contextmanager
    def given_frames(self, clean: torch.Tensor | None, frames: int) -> Iterator[None]:
        """Within it, ``with_frames`` gives networks the first ``frames`` latent frames of ``clean`` (the step's
        data) clean; ``frames = 0``: nothing changes."""
        if not frames or clean is None:
            yield
            return
        self.__dict__["_given_frames"] = (clean, int(frames))
        try:
            yield
        finally:
            self.__dict__.pop("_given_frames", None)

    # ---- noise levels -----------------------------------------------------------------------------------------
    def sample_noise_levels(self, batch: int, device: torch.device | str, dist: str = "sampling",
                            t_min: float | None = None, t_max: float | None = None) -> torch.Tensor:
        """Times at which generated samples are re-noised for a critic (DMD2's score difference, LADD's
        discriminator). ``dist="sampling"``: uniform over a 1000-step sampling grid of the schedule - DMD2 draws
        uniform timesteps (Yin et al. 2024, Sec. 3), which for EDM's Karras grid covers high noise well;
        ``"train"``: the schedule's training distribution (EDM's log-normal, mostly low noise). Clamped to
        ``[t_min, t_max]`` (default: the schedule's range, above 1e-4)."""
        scheduler = self.noise_scheduler
        if dist == "sampling":
            grid = self._noise_grid
            if grid is None or grid.device != torch.device(device):
                grid = self._noise_grid = scheduler.sampling_times(1000, device=device)[:-1]
            t = grid[self.rng.randint(grid.numel(), (batch,), device=device)]
        elif dist == "train":
            t = scheduler.sample_t(batch, device=device, generator=self.rng)
        else:
            raise ValueError(f"unknown noise-level distribution {dist!r} (use 'sampling' or 'train')")
        low = t_min if t_min is not None else max(scheduler.t_min, 1e-4)
        high = t_max if t_max is not None else scheduler.t_max
        return t.clamp(low, high).to(self.precision)

    # ---- the student ------------------------------------------------------------------------------------------
    def student_times(self) -> list[float]:
        """Times the student is evaluated at, from ``t_max`` down (``config.t_list`` or ``[t_max]``)."""
        times = self.config.t_list
        if not times:
            return [float(self.noise_scheduler.t_max)]
        return [float(t) for t in times]

    def sample_noise(self, batch: int, like: Any) -> Any:
        """``batch`` prior samples ``x_{t_max}`` in the model's dtype, on ``like``'s device (the step's stream); for
        a multimodal model a dict of them, one per ``model.modality_shapes`` entry."""
        device = first_tensor(like).device
        shapes = getattr(self.config, "modality_shapes", None) or {None: self.config.input_shape}
        noise = {name: self.noise_scheduler.prior_sample((batch, *shape), device=device, dtype=self.precision,
                                                         generator=self.rng) for name, shape in shapes.items()}
        return noise[None] if None in noise else noise

    def generate(self, net: nn.Module, noise: torch.Tensor, condition: torch.Tensor | None,
                 times: list[float] | None = None, generator: RandomSource = None) -> torch.Tensor:
        """Few-step sampling from ``noise`` (= ``x_{t_max}``); gradients flow when called with grad enabled. The
        fresh noise of multistep sampling comes from ``generator``: a ``torch.Generator`` (drawn on the CPU, so
        samples do not depend on the device), None (torch's global generator) or a training step's keyed stream
        (``self.rng``; training callers pass it)."""
        times = times or self.student_times()
        scheduler = self.noise_scheduler
        batch, like = batch_size(noise), first_tensor(noise)
        x = self.start_state(noise, times[0])
        x0 = x
        for i, t in enumerate(times):
            t_vec = torch.full((batch,), t, device=like.device, dtype=like.dtype)
            x0 = net(x, t_vec, condition=condition, fwd_pred_type="x0")
            if i + 1 < len(times):
                t_next = torch.full((batch,), times[i + 1], device=like.device, dtype=like.dtype)
                x = per_modality(lambda e: scheduler.add_noise(e, self.fresh_noise(e, generator), t_next), x0)
        return x0

    @staticmethod
    def fresh_noise(like: torch.Tensor, generator: RandomSource) -> torch.Tensor:
        """Noise shaped as ``like``: from a ``torch.Generator`` on the CPU (samples independent of the device),
        torch's global generator (None), or a keyed stream."""
        if isinstance(generator, torch.Generator):
            return torch.randn(like.shape, generator=generator, device="cpu", dtype=like.dtype).to(like.device)
        return as_noise_source(generator).randn_like(like)

    def start_state(self, noise: torch.Tensor, t0: float) -> torch.Tensor:
        """The student's input at its first time ``t0``: the prior noise itself at ``t_max``, else rescaled."""
        return noise if t0 >= self.noise_scheduler.t_max else per_modality(lambda n: self._noise_to(n, t0), noise)

    def _noise_to(self, noise: torch.Tensor, t: float) -> torch.Tensor:
        """Rescale prior noise at ``t_max`` to pure noise at time ``t`` (``sigma(t) eps``; the data part is 0)."""
        scheduler = self.noise_scheduler
        t_max = torch.tensor(scheduler.t_max, dtype=noise.dtype)
        eps = noise / scheduler.sigma(t_max).to(noise.device)
        return scheduler.sigma(torch.tensor(t, dtype=noise.dtype)).to(noise.device) * eps

    def generator_fn(self, net: nn.Module, noise: torch.Tensor, steps: int | None = None,
                     condition: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """The teacher samples with Heun (``steps`` or ``config.sample_steps``); students with ``generate``."""
        if net is self.teacher:
            return super().generator_fn(net, noise, steps, condition, generator=generator)
        with torch.no_grad():
            return self.generate(net, noise, condition, generator=generator)
