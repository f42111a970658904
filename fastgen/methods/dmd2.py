"""DMD2: distribution matching distillation with a two-time-scale fake score and an optional GAN
(Yin et al. 2024, "Improved Distribution Matching Distillation for Fast Image Synthesis"; DMD: Yin et al. 2024,
"One-step Diffusion with Distribution Matching Distillation").

Three trained networks: the student ``net`` (G), the fake score ``fake_score`` (a diffusion model of the
student's own output distribution) and, with the GAN branch, ``discriminator`` (a head on the fake score's
bottleneck features, or with ``discriminator_features="teacher"`` on the frozen teacher's, as the reference
implementation does). The teacher is frozen. Iterations alternate (two-time-scale update rule, DMD2 Sec. 4.2):

* **student iterations** (``iteration % student_update_freq == 0``; optimizer ``net`` only): draw
  ``x = G(z)`` (multi-step students: backward simulation - run the student's own sampler a random number of
  steps without gradients, then one step with them; DMD2 Sec. 4.5), noise it, ``x_t = alpha_t x + sigma_t eps``,
  and follow the difference of the two scores. With denoised estimates ``D_real`` (teacher, with CFG) and
  ``D_fake`` (fake score), the distribution-matching gradient is (DMD Eq. 7-8)

      grad = w (D_fake(x_t) - D_real(x_t)),   w = 1 / mean_{C,H,W} |x - D_real(x_t)|

  applied through the surrogate ``L_VSD = 1/2 ||x - sg(x - grad)||^2`` whose gradient w.r.t. ``x`` is ``grad``
  (averaged over ``vsd_num_noise`` independent draws of ``(t, eps)`` per sample; DMD uses one). This term is
  ``distribution_matching_loss``; SiD (``fastgen.methods.sid``) replaces it and keeps everything else.
  With the GAN branch, the student also minimises the non-saturating loss ``softplus(-D(features(x_t)))``
  (DMD2 Eq. 4) through the frozen feature network and discriminator. With ``discriminator_minibatch_std = G`` the
  heads also read the feature spread of each group of at most G samples (ProGAN's minibatch standard deviation),
  so the discriminator can tell a too-uniform student from the data, which a per-sample head cannot. A group
  holds samples of one condition, never generated and real ones together, and every noise level the
  discriminator sees is drawn once per group (``fastgen.networks.discriminator.minibatch_groups``): otherwise
  the spread mostly measures how far apart the group's noise levels and classes are.
  With ``regression_loss_weight > 0`` it also regresses onto the teacher's own samples,
  ``L_reg = E ||G(z) - ODE(z)||^2`` over a fixed set of pairs ``(z, ODE(z))`` solved once with the teacher's Heun
  sampler (DMD Eq. 9, with a squared error in place of LPIPS): reverse-KL distribution matching is mode-seeking,
  and the pairs hold the student to all of the teacher's modes.
* **critic iterations** (optimizers ``fake_score`` and ``discriminator``): the fake score learns the student's
  current distribution with the denoising loss of ``fastgen.methods.sft`` on ``sg(G(z))`` (DMD Eq. 6; weighted
  over noise levels by the schedule, or uniformly with ``fake_score_loss_weighting="uniform"``), and the
  discriminator learns ``softplus(D(fake)) + softplus(-D(real))`` on noised real and generated samples, plus
  the R1 penalty ``gamma/2 E ||grad_x D(x_real_t)||^2`` on noised real data (Mescheder et al. 2018, Eq. 9) when
  ``r1_weight > 0``. With ``r1_estimator="finite_difference"`` the penalty is estimated as
  ``gamma/2 E[(D(x_real_t + s eps) - D(x_real_t))^2] / s^2`` (the approximated R1 of Lin et al. 2025, "Diffusion
  Adversarial Post-Training for One-Step Video Generation", divided by ``s^2``): for Gaussian ``eps`` the
  expectation is ``s^2 ||grad_x D||^2`` to first order in ``s``, and it costs one more forward pass of the
  feature network instead of a double backward through it.

Multimodal samples (``model.modality_shapes``, e.g. LTX-2's video and audio) take ``multimodal_student_step`` /
``multimodal_critic_step``: the same two terms per modality, each modality's gradient normalised by its own
denoising gap, the losses weighted by ``model.modality_loss_weights`` and summed (``fastgen.methods.multimodal``).

Only the optimizers of the trained modules step (``get_optimizers``) and only their schedulers advance, so
learning-rate schedules count each module's own updates.

Logged keys (``loss_dict``): ``total_loss``; student iterations: ``vsd_loss``, ``dmd_grad_norm``, with the
GAN ``gan_gen_loss``, with the regression ``regression_loss``; critic iterations: ``fake_score_loss`` and, with
the GAN, ``gan_disc_loss``, ``d_real_logit``, ``d_fake_logit`` (and ``r1_loss``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, overload

import torch
import torch.nn.functional as F
from torch import nn

from fastgen.configs.instantiate import instantiate
from fastgen.methods.distill import DistillationModel
from fastgen.methods.model import conditioning_frame_choices
from fastgen.methods.multimodal import check_modalities, combine_losses, training_times, vsd_times
from fastgen.networks.conditioning_frames import after_given, generated_frames_mean
from fastgen.networks.discriminator import (FeatureDiscriminator, default_feature_indices, head_features,
                                            minibatch_groups, per_group, probe_feature_shapes)
from fastgen.networks.modalities import batch_size, first_tensor, is_multimodal, per_modality
from fastgen.utils.errors import ConfigError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)


@contextlib.contextmanager
def frozen(*modules: nn.Module) -> Iterator[None]:
    """Turn off ``requires_grad`` of every parameter of ``modules`` for the block (gradients still flow
    *through* them to their inputs), then restore each parameter's previous flag."""
    params = [p for m in modules for p in m.parameters()]
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)


def finite_difference_r1(d_real: torch.Tensor, d_moved: torch.Tensor, step: float) -> torch.Tensor:
    """The R1 penalty's ``E||grad_x D(x)||^2`` at real samples (Mescheder et al. 2018, Eq. 9) estimated from the
    logits at ``x`` and at ``x + step * eps``, ``eps ~ N(0, I)``: ``E[(D(x + step eps) - D(x))^2] / step^2`` (the
    approximated R1 of Lin et al. 2025, "Diffusion Adversarial Post-Training for One-Step Video Generation",
    divided by ``step^2``; to first order in ``step`` its expectation is the squared gradient norm). One more
    forward pass instead of a double backward through the network under the heads (a frozen or sharded teacher).
    Computed in float32. Shared by DMD2 and LADD."""
    return (d_moved.float() - d_real.float()).square().mean() / step ** 2


def denoising_gap(x: torch.Tensor, d_real: torch.Tensor) -> torch.Tensor:
    """``mean_{C,H,W} |x - D_real(x_t)|`` per sample, in float32 and at least 1e-6: the normaliser of DMD's gradient
    (DMD Eq. 8), which SiD's loss shares, so the step size does not depend on how far the teacher's estimate is."""
    return (x - d_real).abs().float().flatten(1).mean(dim=1).clamp_min(1e-6)


class DMD2Model(DistillationModel):
    supports_modalities = True  # the distribution-matching loss per modality (fastgen.methods.multimodal)
    # video-to-world (model.conditioning_frames): student, teacher and fake score are given the data's first frames
    supports_conditioning_frames = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        if config.student_update_freq < 1:
            raise ConfigError("model.student_update_freq must be >= 1")
        if config.vsd_num_noise < 1:
            raise ConfigError("model.vsd_num_noise must be >= 1")
        if config.r1_fd_sigma <= 0:
            raise ConfigError("model.r1_fd_sigma must be > 0 (the finite-difference step of the R1 penalty)")
        if config.discriminator_minibatch_std < 0:
            raise ConfigError("model.discriminator_minibatch_std must be >= 0 (0 or 1: off)")
        fake_cfg = config.fake_score if config.fake_score is not None else config.net
        self.fake_score: nn.Module = instantiate(fake_cfg).to(self.precision)
        self.use_gan = config.gan_loss_weight_gen > 0
        self.discriminator: nn.Module | None = None
        self.feature_indices: list[int] = []
        if self.use_gan:
            source = self.feature_network()
            self.feature_indices = list(config.feature_indices or default_feature_indices(source))
            shapes = probe_feature_shapes(source, list(config.input_shape), self.feature_indices, self.num_classes, t=1.0)
            self.discriminator = FeatureDiscriminator(shapes, hidden=config.discriminator_hidden,
                                                      minibatch_std_group=config.discriminator_minibatch_std).to(self.precision)
        if getattr(config, "modality_shapes", None):
            unsupported = [name for name, on in (("gan_loss_weight_gen", self.use_gan),
                                                 ("vsd_num_noise", config.vsd_num_noise > 1),
                                                 ("regression_loss_weight", config.regression_loss_weight > 0)) if on]
            if unsupported:
                raise ConfigError(f"multimodal DMD2 (model.modality_shapes) has the distribution-matching loss only; "
                                  f"unset model.{', model.'.join(unsupported)}")
        if any(conditioning_frame_choices(config)):
            unsupported = [name for name, on in (("gan_loss_weight_gen", self.use_gan),
                                                 ("regression_loss_weight", config.regression_loss_weight > 0)) if on]
            if unsupported:
                raise ConfigError(f"video-to-world DMD2 (model.conditioning_frames) has the distribution-matching "
                                  f"loss only; unset model.{', model.'.join(unsupported)}")
        if config.regression_loss_weight > 0 and config.regression_num_pairs < 1:
            raise ConfigError("model.regression_num_pairs must be >= 1 when model.regression_loss_weight > 0")
        self._pairs: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None = None

    # ---- modules ------------------------------------------------------------------------------------------------
    @property
    def model_dict(self) -> dict[str, nn.Module]:
        modules = {**super().model_dict, "fake_score": self.fake_score}
        if self.discriminator is not None:
            modules["discriminator"] = self.discriminator
        return modules

    @property
    def trainable_modules(self) -> dict[str, nn.Module]:
        modules = {"net": self.net, "fake_score": self.fake_score}
        if self.discriminator is not None:
            modules["discriminator"] = self.discriminator
        return modules

    @torch.no_grad()
    def init_weights(self) -> None:
        """Student and fake score both start as copies of the teacher (DMD Sec. 3.2)."""
        super().init_weights()
        try:
            self.fake_score.load_state_dict(self.teacher.state_dict())
        except RuntimeError:  # a differently shaped fake score keeps its own initialisation
            logger.info("model.fake_score differs from the teacher's architecture: it starts from its own initialisation")

    def fsdp_conflict(self) -> str | None:
        if self.use_gan and self.config.r1_weight > 0 and self.config.r1_estimator == "exact":
            return ("model.r1_estimator=exact differentiates the R1 penalty twice through the sharded teacher and "
                    "heads, which FSDP2 cannot do (it frees the gathered parameters after the first backward); use "
                    "model.r1_estimator=finite_difference with trainer.fsdp, or trainer.ddp")
        return None

    def is_student_iteration(self, iteration: int) -> bool:
        return iteration % self.config.student_update_freq == 0

    def get_optimizers(self, iteration: int) -> list[str]:
        if self.is_student_iteration(iteration):
            return ["net"]
        return [name for name in ("fake_score", "discriminator") if name in self.optimizers]

    # ---- pieces -------------------------------------------------------------------------------------------------
    def generate_for_training(self, noise: torch.Tensor, condition: torch.Tensor | None,
                              real: torch.Tensor | None = None) -> torch.Tensor:
        """``G(z)`` with gradients through the last student evaluation only (backward simulation for k > 1).
        ``real`` is the step's data batch, for methods whose student starts from noised data (CausVid)."""
        times = self.student_times()
        net = self.with_frames(self.net)  # video-to-world: the given frames in every state the student sees
        if len(times) == 1:
            return self.generate(net, noise, condition, times)
        k = int(self.rng.shared.randint(len(times), ()).item())  # one choice per step, the same on every rank
        if k == 0:
            return self.generate(net, noise, condition, times[:1])
        with torch.no_grad():
            x0 = self.generate(net, noise, condition, times[:k], generator=self.rng)
            like = first_tensor(noise)
            t_k = torch.full((batch_size(noise),), times[k], device=like.device, dtype=like.dtype)
            x_t = per_modality(lambda x: self.noise_scheduler.add_noise(x, self.rng.randn_like(x), t_k), x0)
        return net(x_t, t_k, condition=condition, fwd_pred_type="x0")

    def sample_vsd_t(self, batch: int, device: torch.device) -> torch.Tensor:
        """Noise levels for the distribution-matching gradient (``vsd_t_dist``, clamped to ``vsd_t_min/max``)."""
        return self.sample_noise_levels(batch, device, self.config.vsd_t_dist, self.config.vsd_t_min, self.config.vsd_t_max)

    def vsd_weight(self, x: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, d_real: torch.Tensor,
                   d_fake: torch.Tensor, condition: torch.Tensor | None) -> torch.Tensor:
        """Per-sample multiplier of the distribution-matching gradient; DMD2 uses 1 (f-distill overrides)."""
        return torch.ones(x.shape[0], device=x.device, dtype=torch.float32)

    @torch.no_grad()
    def regression_pairs(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``(noise, labels, teacher sample)`` for the regression loss, solved on first use and kept in memory.

        The noise and the balanced labels come from a generator seeded with ``regression_seed`` and the teacher
        samples them deterministically (Heun, ``sample_steps``), so every rank, and a resumed run, holds the same
        pairs without storing them in checkpoints."""
        if self._pairs is None or self._pairs[0].device != device:
            n = self.config.regression_num_pairs
            generator = torch.Generator().manual_seed(self.config.regression_seed)
            noise = self.noise_scheduler.prior_sample((n, *self.config.input_shape), generator=generator)
            noise = noise.to(device=device, dtype=self.precision)
            labels = self.sample_labels(n, device)
            logger.info("solving %d teacher samples for the regression loss (%s Heun steps)", n, self.config.sample_steps)
            chunks = [self.generator_fn(self.teacher, noise[i:i + 1024], None, None if labels is None else labels[i:i + 1024])
                      for i in range(0, n, 1024)]
            self._pairs = (noise, labels, torch.cat(chunks))
        return self._pairs

    def regression_loss(self, batch: int, device: torch.device) -> torch.Tensor:
        """``mean ||G(z) - ODE(z)||^2`` over ``regression_batch_size`` (default ``batch``) random pairs. Pair
        slot ``j`` is drawn by the batch's sample ``j % batch`` (``rng.rows``), so with the default size the pairs
        a step regresses do not depend on how the batch is split over ranks."""
        noise, labels, target = self.regression_pairs(device)
        size = min(self.config.regression_batch_size or batch, noise.shape[0])
        rng = self.rng.rows(size)
        index = rng.randint(noise.shape[0], (size,), device=device)
        x = self.generate(self.net, noise[index], None if labels is None else labels[index], generator=rng)
        return F.mse_loss(x.float(), target[index].float())

    def feature_network(self) -> nn.Module:
        """The network whose features the discriminator head reads (``discriminator_features``)."""
        return self.teacher if self.config.discriminator_features == "teacher" else self.fake_score

    def gan_groups(self, condition: torch.Tensor | None, batch: int, device: torch.device,
                   parts: int = 1) -> torch.Tensor | None:
        """Minibatch-std groups of a batch of ``parts`` equal parts (None when the option is off): never across
        parts or conditions. Noise levels the discriminator sees are drawn once per group (``per_group``)."""
        if not self.use_gan:
            return None
        return minibatch_groups(batch, self.config.discriminator_minibatch_std, condition, parts, device)

    @overload
    @staticmethod
    def repeat(batch: torch.Tensor, times: int) -> torch.Tensor: ...

    @overload
    @staticmethod
    def repeat(batch: None, times: int) -> None: ...

    @staticmethod
    def repeat(batch: torch.Tensor | None, times: int) -> torch.Tensor | None:
        """``times`` copies of ``batch`` stacked along dim 0, copy k of row i at row k * B + i (None stays None):
        samples, conditions and noise levels of a batch judged or noised several times in one pass."""
        return None if batch is None else batch.repeat(times, *([1] * (batch.dim() - 1)))

    def discriminate(self, x_t: torch.Tensor, t: torch.Tensor, condition: torch.Tensor | None,
                     parts: int = 1) -> torch.Tensor:
        """Logits for ``x_t``; ``parts > 1`` says the batch is that many equal, separately judged parts (generated
        then real, or ``vsd_num_noise`` draws), so minibatch-std groups stay inside one part."""
        assert self.discriminator is not None
        features = head_features(self.feature_network(), x_t, t, condition, self.feature_indices)
        return self.discriminator(features, self.gan_groups(condition, x_t.shape[0], x_t.device, parts)).float()

    # ---- the two kinds of iterations ---------------------------------------------------------------------------
    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        real = per_modality(lambda x: x.to(self.precision), data["real"])
        condition = self.condition_of(data)
        noise = self.sample_noise(batch_size(real), real)
        if is_multimodal(real):
            check_modalities(self.config, real)
            if self.is_student_iteration(iteration):
                return self.multimodal_student_step(condition, noise)
            return self.multimodal_critic_step(condition, noise)
        with self.given_frames(real, self.draw_conditioning_frames()):  # video-to-world: the data's first frames
            if self.is_student_iteration(iteration):
                return self.student_step(real, condition, noise)
            return self.critic_step(real, condition, noise)

    def noised_draws(self, x: torch.Tensor, condition: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """``vsd_num_noise`` noisings of ``x`` for the distribution-matching term: ``(x_rep, cond_rep, t, x_t)``,
        draw k of sample i at row k * B + i; gradients flow from ``x_t`` to ``x`` when ``x`` carries them."""
        draws = self.config.vsd_num_noise
        x_rep = self.repeat(x, draws)
        cond_rep = self.repeat(condition, draws)
        t = per_group(lambda n: self.sample_vsd_t(n, x.device), self.gan_groups(cond_rep, x_rep.shape[0], x.device, draws),
                      x_rep.shape[0])  # per group: f-distill's weights read the discriminator at these levels
        x_t = self.noise_scheduler.add_noise(x_rep, self.rng.randn_like(x_rep), t)  # row k B + i: sample i, copy k
        return x_rep, cond_rep, t, x_t

    def distribution_matching_loss(self, x: torch.Tensor, condition: torch.Tensor | None
                                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """DMD's term (DMD Eq. 7-8) through the surrogate ``1/2 ||x - sg(x - grad)||^2``: ``(loss, logged
        values, x_t, t)``. The scores are evaluated without gradients; only ``x`` carries them."""
        x_rep, cond_rep, t, x_t = self.noised_draws(x.detach(), condition)
        with torch.no_grad():
            d_real = self.teacher_x0(x_t, t, cond_rep)
            d_fake = self.with_frames(self.fake_score)(x_t, t, condition=cond_rep, fwd_pred_type="x0")
            # the gap over the generated frames (the given ones are the data in x, D_real and D_fake alike)
            given = self.frames_given_now()
            normaliser = denoising_gap(after_given(x_rep, given), after_given(d_real, given))
            weight = self.vsd_weight(x_rep, x_t, t, d_real, d_fake, cond_rep) / normaliser
            grad = torch.nan_to_num((d_fake - d_real).float() * weight.view(-1, *([1] * (x.dim() - 1))))
            grad = grad.view(self.config.vsd_num_noise, *x.shape).mean(dim=0)
        vsd = 0.5 * F.mse_loss(x.float(), (x.detach().float() - grad), reduction="mean")
        return vsd, {"vsd_loss": vsd.detach(), "dmd_grad_norm": grad.flatten(1).norm(dim=1).mean()}, x_t, t

    def student_step(self, real: torch.Tensor, condition: torch.Tensor | None,
                     noise: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        x = self.generate_for_training(noise, condition, real)
        vsd, loss_dict, x_t, t = self.distribution_matching_loss(x, condition)
        total = self.config.vsd_loss_weight * vsd
        if self.use_gan:
            # The generator's GAN term sees x noised afresh, with gradients through the frozen critic into x.
            t_gan = per_group(lambda n: self.sample_vsd_t(n, x.device), self.gan_groups(condition, x.shape[0], x.device),
                              x.shape[0])
            x_t_gan = self.noise_scheduler.add_noise(x, self.rng.randn_like(x), t_gan)
            with frozen(self.fake_score, self.discriminator):
                gen = F.softplus(-self.discriminate(x_t_gan, t_gan, condition)).mean()
            total = total + self.config.gan_loss_weight_gen * gen
            loss_dict["gan_gen_loss"] = gen.detach()
        if self.config.regression_loss_weight > 0:
            regression = self.regression_loss(x.shape[0], x.device)
            total = total + self.config.regression_loss_weight * regression
            loss_dict["regression_loss"] = regression.detach()
        loss_dict["total_loss"] = total
        return loss_dict, {"generated": x.detach(), "x_t": x_t, "t": t}

    def multimodal_student_step(self, condition: torch.Tensor | None, noise: dict[str, torch.Tensor]
                                ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The student iteration on a dict of modalities: each modality's distribution-matching gradient normalised
        by its own denoising gap (their scales differ; ``fastgen.methods.multimodal``), the losses weighted and
        summed. GAN, several noisings and the regression loss are refused for multimodal models (``__init__``)."""
        x = self.generate_for_training(noise, condition)
        t = vsd_times(self, x)
        x_t = {name: self.noise_scheduler.add_noise(v.detach(), self.rng.randn_like(v), t[name]) for name, v in x.items()}
        with torch.no_grad():
            d_real = self.teacher_x0(x_t, t, condition)
            d_fake = self.fake_score(x_t, t, condition=condition, fwd_pred_type="x0")
        losses, norms = {}, {}
        for name, v in x.items():
            with torch.no_grad():
                weight = 1.0 / denoising_gap(v, d_real[name])
                grad = torch.nan_to_num((d_fake[name] - d_real[name]).float() * weight.view(-1, *([1] * (v.dim() - 1))))
            losses[name] = 0.5 * F.mse_loss(v.float(), v.detach().float() - grad, reduction="mean")
            norms[f"dmd_grad_norm_{name}"] = grad.flatten(1).norm(dim=1).mean()
        vsd, logged = combine_losses(self.config, losses, "vsd_loss")
        total = self.config.vsd_loss_weight * vsd
        return ({"total_loss": total, "vsd_loss": vsd.detach(), **logged, **norms},
                {"generated": {name: v.detach() for name, v in x.items()}, "x_t": x_t, "t": t})

    def multimodal_critic_step(self, condition: torch.Tensor | None, noise: dict[str, torch.Tensor]
                               ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """DMD2's critic iteration on a dict of modalities: the fake score's denoising loss on ``sg(G(z))``."""
        scheduler = self.noise_scheduler
        with torch.no_grad():
            x = self.generate_for_training(noise, condition)
        t = training_times(self, x)
        eps = {name: self.rng.randn_like(v) for name, v in x.items()}
        x_t = {name: scheduler.add_noise(v, eps[name], t[name]) for name, v in x.items()}
        pred = self.fake_score(x_t, t, condition=condition)
        losses = {}
        for name, v in x.items():
            per_sample = (pred[name].float() - scheduler.target(v, eps[name], t[name]).float()).square().flatten(1).mean(1)
            if self.config.fake_score_loss_weighting == "schedule":
                per_sample = scheduler.loss_weight(t[name].float()) * per_sample
            losses[name] = per_sample.mean()
        total, logged = combine_losses(self.config, losses, "fake_score_loss")
        return {"total_loss": total, "fake_score_loss": total.detach(), **logged}, {"generated": x, "x_t": x_t, "t": t}

    def critic_step(self, real: torch.Tensor, condition: torch.Tensor | None,
                    noise: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        with torch.no_grad():
            x = self.generate_for_training(noise, condition, real)
        scheduler = self.noise_scheduler
        groups = self.gan_groups(condition, x.shape[0], x.device)
        t = per_group(lambda n: scheduler.sample_t(n, device=x.device, generator=self.rng), groups,
                      x.shape[0]).to(self.precision)
        eps = self.rng.randn_like(x)
        x_t = scheduler.add_noise(x, eps, t)
        shared = self.use_gan and self.config.discriminator_features == "fake_score"
        if shared:  # one pass gives the denoiser output and the head's features
            pred, features = self.fake_score(x_t, t, condition=condition, feature_indices=self.feature_indices)
        else:
            pred = self.with_frames(self.fake_score)(x_t, t, condition=condition)
        given = self.frames_given_now()
        per_sample = generated_frames_mean((pred.float() - scheduler.target(x, eps, t).float()).square(), given)
        if self.config.fake_score_loss_weighting == "schedule":
            per_sample = scheduler.loss_weight(t.float()) * per_sample
        fake_loss = per_sample.mean()
        total = fake_loss
        loss_dict: dict[str, torch.Tensor] = {"fake_score_loss": fake_loss.detach()}
        if self.use_gan:
            assert self.discriminator is not None
            real_t = scheduler.add_noise(real, self.rng.randn_like(real), t)
            r1_on = self.config.r1_weight > 0 and torch.is_grad_enabled()
            exact_r1 = r1_on and self.config.r1_estimator == "exact"
            fd_r1 = r1_on and not exact_r1
            if exact_r1:
                real_t = real_t.detach().requires_grad_(True)
            judged = [real_t]  # the real samples and, for the finite-difference R1, their perturbed copies
            if fd_r1:
                judged.append(real_t + self.config.r1_fd_sigma * self.rng.randn_like(real_t))
            if shared:
                d_fake = self.discriminator(features, groups).float()
                d_judged = self.discriminate(torch.cat(judged), t.repeat(len(judged)), self.repeat(condition, len(judged)),
                                             parts=len(judged)).chunk(len(judged))
            else:  # the frozen teacher reads fake and real samples in one batched pass
                parts = 1 + len(judged)
                d_fake, *d_judged = self.discriminate(torch.cat([x_t, *judged]), t.repeat(parts),
                                                      self.repeat(condition, parts), parts=parts).chunk(parts)
            d_real = d_judged[0]
            disc = F.softplus(d_fake).mean() + F.softplus(-d_real).mean()
            total = total + self.config.gan_loss_weight_disc * disc
            loss_dict.update(gan_disc_loss=disc.detach(), d_real_logit=d_real.detach().mean(),
                             d_fake_logit=d_fake.detach().mean())
            if r1_on:
                if exact_r1:
                    (grad_real,) = torch.autograd.grad(d_real.sum(), real_t, create_graph=True)
                    r1 = grad_real.float().square().flatten(1).sum(dim=1).mean()
                else:
                    r1 = finite_difference_r1(d_real, d_judged[1], self.config.r1_fd_sigma)
                total = total + 0.5 * self.config.r1_weight * r1
                loss_dict["r1_loss"] = r1.detach()
        loss_dict["total_loss"] = total
        return loss_dict, {"generated": x, "x_t": x_t, "t": t}
