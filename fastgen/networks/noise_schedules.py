"""Noise schedules: how clean data ``x0`` and noise ``eps`` mix at time ``t``, and how predictions convert.

Every schedule here is a linear interpolant ``x_t = alpha(t) * x0 + sigma(t) * eps`` (Kingma et al. 2021, Eq. 1;
Lipman et al. 2023). From it, any of four prediction types determines the other three given ``x_t``:

* ``x0``   - the clean sample (EDM's denoiser ``D``);
* ``eps``  - the noise;
* ``v``    - ``alpha * eps - sigma * x0`` (Salimans & Ho 2022, Sec. 4);
* ``flow`` - the probability-flow ODE velocity ``dx_t/dt = alpha'(t) x0 + sigma'(t) eps``
  (Karras et al. 2022, Eq. 4 with ``s=1``; Lipman et al. 2023, Eq. 15). For rectified flow ``flow = eps - x0``.

Conversion solves the 2x2 linear system ``[x_t, p] = M [x0, eps]`` (``convert``).

Random draws (``sample_t``, ``prior_sample``) come from ``generator``: a ``torch.Generator``, ``None`` (torch's global
generator) or a ``fastgen.distributed.keyed_rng.NoiseSource`` - a training step passes its batch's keyed stream.
"""

from __future__ import annotations

from typing import Literal

import torch

from fastgen.distributed.keyed_rng import RandomSource, randn

PredType = Literal["x0", "eps", "v", "flow"]
PRED_TYPES: tuple[str, ...] = ("x0", "eps", "v", "flow")


def expand_like(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Reshape a per-sample ``(B,)`` tensor to broadcast against ``x`` of shape ``(B, ...)``; a per-frame ``(B, F)``
    tensor (diffusion forcing's times) against a video ``(B, C, F, H, W)``."""
    if t.dim() == 2 and x.dim() == 5 and t.shape[1] == x.shape[2]:
        return t[:, None, :, None, None].to(x.dtype)
    return t.reshape(t.shape[0], *([1] * (x.dim() - 1))).to(x.dtype)


class NoiseScheduler:
    """Base class. Subclasses define ``alpha``, ``sigma`` and their time derivatives, the training-time
    distribution, the sampling grid and the network preconditioning."""

    native_pred_type: PredType = "x0"
    t_min: float = 0.0
    t_max: float = 1.0

    # ---- the interpolant -------------------------------------------------------------------------------
    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def sigma(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def d_alpha(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def d_sigma(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def add_noise(self, x0: torch.Tensor, eps: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``x_t = alpha(t) x0 + sigma(t) eps``."""
        return expand_like(self.alpha(t), x0) * x0 + expand_like(self.sigma(t), x0) * eps

    # ---- training --------------------------------------------------------------------------------------
    def ddim_coefficients(self, t: float, t_next: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(a, b)`` in float64 with ``x_{t_next} = a x0 + b x_t``: the deterministic DDIM step (Song et al. 2021,
        Eq. 12, eta = 0), ``b = sigma(t') / sigma(t)``, ``a = alpha(t') - b alpha(t)``."""
        tt = torch.tensor([t, t_next], dtype=torch.float64, device="cpu")
        alpha, sigma = self.alpha(tt), self.sigma(tt)
        b = sigma[1] / sigma[0]
        return alpha[1] - b * alpha[0], b

    def sample_t(self, n: int, device: torch.device | str = "cpu", generator: RandomSource = None) -> torch.Tensor:
        raise NotImplementedError

    def loss_weight(self, t: torch.Tensor) -> torch.Tensor:
        """Weight of the squared error on the *native* prediction at time ``t``."""
        return torch.ones_like(t)

    def prior_sample(self, shape: tuple[int, ...], device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, generator: RandomSource = None) -> torch.Tensor:
        """A sample of ``x_{t_max}`` (noise at the start of sampling)."""
        eps = randn(shape, device=device, dtype=dtype, generator=generator)
        return eps * float(self.sigma(torch.tensor(self.t_max)))

    def sampling_times(self, steps: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """``steps + 1`` decreasing times from ``t_max`` to ``0``."""
        raise NotImplementedError

    def precondition(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(c_skip, c_out, c_in, c_noise)``: the network computes ``c_skip x + c_out F(c_in x, c_noise)``."""
        raise NotImplementedError

    # ---- conversions -----------------------------------------------------------------------------------
    def _coefficients(self, pred_type: str, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(a, b)`` with ``prediction = a * x0 + b * eps`` for ``pred_type``."""
        if pred_type == "x0":
            return torch.ones_like(t), torch.zeros_like(t)
        if pred_type == "eps":
            return torch.zeros_like(t), torch.ones_like(t)
        if pred_type == "v":
            return -self.sigma(t), self.alpha(t)
        if pred_type == "flow":
            return self.d_alpha(t), self.d_sigma(t)
        raise ValueError(f"unknown prediction type {pred_type!r}; use one of {', '.join(PRED_TYPES)}")

    def convert(self, pred: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, src: str, dst: str) -> torch.Tensor:
        """Convert a ``src`` prediction at ``(x_t, t)`` to ``dst`` by solving for ``(x0, eps)``."""
        if src == dst:
            return pred
        alpha, sigma = self.alpha(t), self.sigma(t)
        a, b = self._coefficients(src, t)
        # [x_t; pred] = [[alpha, sigma], [a, b]] [x0; eps]
        det = alpha * b - sigma * a
        x0 = (expand_like(b, x_t) * x_t - expand_like(sigma, x_t) * pred) / expand_like(det, x_t)
        eps = (expand_like(alpha, x_t) * pred - expand_like(a, x_t) * x_t) / expand_like(det, x_t)
        c, d = self._coefficients(dst, t)
        return expand_like(c, x_t) * x0 + expand_like(d, x_t) * eps

    def target(self, x0: torch.Tensor, eps: torch.Tensor, t: torch.Tensor, pred_type: str | None = None) -> torch.Tensor:
        """The regression target of ``pred_type`` (default: native) for a noised pair ``(x0, eps)``."""
        a, b = self._coefficients(pred_type or self.native_pred_type, t)
        return expand_like(a, x0) * x0 + expand_like(b, x0) * eps


class EDMNoiseScheduler(NoiseScheduler):
    """EDM (Karras et al. 2022): ``x_t = x0 + sigma * eps`` with ``t = sigma``.

    * training: ``ln(sigma) ~ N(P_mean, P_std^2)`` and weight ``lambda(sigma) = (sigma^2 + sigma_data^2) /
      (sigma * sigma_data)^2`` (Table 1, "Training");
    * preconditioning: ``c_skip = sigma_data^2 / (sigma^2 + sigma_data^2)``, ``c_out = sigma * sigma_data /
      sqrt(sigma^2 + sigma_data^2)``, ``c_in = 1 / sqrt(sigma^2 + sigma_data^2)``, ``c_noise = ln(sigma) / 4``
      (Table 1, "Network and preconditioning");
    * sampling grid: ``sigma_i = (sigma_max^(1/rho) + i/(N-1) (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho``,
      ``sigma_N = 0`` (Eq. 5).
    """

    native_pred_type: PredType = "x0"

    def __init__(self, sigma_min: float = 0.002, sigma_max: float = 80.0, sigma_data: float = 0.5,
                 P_mean: float = -1.2, P_std: float = 1.2, rho: float = 7.0) -> None:  # noqa: N803 - paper names
        self.sigma_min, self.sigma_max, self.sigma_data = float(sigma_min), float(sigma_max), float(sigma_data)
        self.P_mean, self.P_std, self.rho = float(P_mean), float(P_std), float(rho)
        self.t_min, self.t_max = self.sigma_min, self.sigma_max

    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(t)

    def sigma(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def d_alpha(self, t: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(t)

    def d_sigma(self, t: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(t)

    def sample_t(self, n: int, device: torch.device | str = "cpu", generator: RandomSource = None) -> torch.Tensor:
        normal = randn(n, device=device, generator=generator)
        return (normal * self.P_std + self.P_mean).exp()

    def loss_weight(self, t: torch.Tensor) -> torch.Tensor:
        return (t**2 + self.sigma_data**2) / (t * self.sigma_data) ** 2

    def sampling_times(self, steps: int, device: torch.device | str = "cpu") -> torch.Tensor:
        if steps < 1:
            raise ValueError("sampling needs at least one step")
        i = torch.arange(steps, dtype=torch.float64, device=device)
        inv_rho = 1.0 / self.rho
        denom = max(steps - 1, 1)
        sigmas = (self.sigma_max**inv_rho + i / denom * (self.sigma_min**inv_rho - self.sigma_max**inv_rho)) ** self.rho
        return torch.cat([sigmas, torch.zeros(1, dtype=torch.float64, device=device)]).float()

    def precondition(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        sd2 = self.sigma_data**2
        c_skip = sd2 / (t**2 + sd2)
        c_out = t * self.sigma_data / (t**2 + sd2).sqrt()
        c_in = 1.0 / (t**2 + sd2).sqrt()
        c_noise = t.log() / 4.0
        return c_skip, c_out, c_in, c_noise


class EDMFlowScheduler(EDMNoiseScheduler):
    """EDM's variance-exploding time with a rectified-flow network inside: Cosmos Predict2 (NVIDIA 2025).

    The state is EDM's ``x = x0 + sigma eps`` with ``t = sigma`` (Karras et al. 2022), so training times, the
    sampling grid (Eq. 5, ``rho = 7`` from ``sigma_max = 80`` to ``sigma_min = 0.002``) and the prior ``sigma_max
    eps`` are EDM's. The network is a flow-matching model at the equal-SNR rectified-flow time ``u = sigma / (1 +
    sigma)``: it sees ``x / (1 + sigma) = (1 - u) x0 + u eps`` and ``u`` itself and predicts the velocity
    ``eps - x0``, so the denoised estimate is ``(1 - u) x - u F``. That is EDM's Eq. 7 with
    ``c_in = c_skip = 1 - u``, ``c_out = -u``, ``c_noise = u``, computed in the order ``Cosmos2TextToImagePipeline``
    computes them (its ``c_in`` / ``c_skip`` / ``c_out``), so the two agree to the last bit on the same inputs.

    Training draws ``ln sigma ~ N(P_mean, P_std^2)``; with ``P_mean = 0``, ``P_std = 1`` (the defaults) that is a
    logit-normal ``u`` (``logit u = ln sigma``; Esser et al. 2024, Eq. 19), and the x0 error is weighted with EDM's
    ``lambda(sigma)``. ``stops_at_last_time``: the pipeline's sample is the state at the grid's last time
    ``sigma_min``, not the denoised estimate there - its last Euler step has length zero (``final_sigmas_type
    "sigma_min"``); ``fastgen.pipelines.schedulers.plan_of`` reads it.
    """

    stops_at_last_time = True

    def __init__(self, sigma_min: float = 0.002, sigma_max: float = 80.0, sigma_data: float = 1.0,
                 P_mean: float = 0.0, P_std: float = 1.0, rho: float = 7.0) -> None:  # noqa: N803 - paper names
        super().__init__(sigma_min, sigma_max, sigma_data, P_mean, P_std, rho)

    def precondition(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        u = t / (t + 1)
        return 1 - u, -u, 1 - u, u


class RectifiedFlowScheduler(NoiseScheduler):
    """Rectified flow / flow matching (Liu et al. 2023; Lipman et al. 2023): ``x_t = (1 - t) x0 + t eps``.

    The network predicts the velocity ``flow = eps - x0`` directly (Lipman et al. 2023, Eq. 23, conditional OT
    path). Training times are logit-normal, ``t = sigmoid(n)`` with ``n ~ N(logit_mean, logit_std^2)``
    (Esser et al. 2024, Eq. 19); sampling uses a uniform grid from ``t_max`` to 0 with optional time shift
    ``t' = s t / (1 + (s - 1) t)`` (Esser et al. 2024, Eq. 23) and, with ``shift_terminal``, the last nonzero time
    stretched to it, as diffusers' ``FlowMatchEulerDiscreteScheduler(shift_terminal=...)`` does
    (``1 - t'' = (1 - t') (1 - shift_terminal) / (1 - t'_last)``; Qwen-Image's scheduler ends at 0.02).
    """

    native_pred_type: PredType = "flow"

    def __init__(self, logit_mean: float = 0.0, logit_std: float = 1.0, t_max: float = 1.0, shift: float = 1.0,
                 shift_terminal: float | None = None) -> None:
        self.logit_mean, self.logit_std, self.shift = float(logit_mean), float(logit_std), float(shift)
        self.shift_terminal = float(shift_terminal) if shift_terminal else None
        self.t_min, self.t_max = 0.0, float(t_max)

    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 - t

    def sigma(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def d_alpha(self, t: torch.Tensor) -> torch.Tensor:
        return -torch.ones_like(t)

    def d_sigma(self, t: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(t)

    def sample_t(self, n: int, device: torch.device | str = "cpu", generator: RandomSource = None) -> torch.Tensor:
        normal = randn(n, device=device, generator=generator)
        return torch.sigmoid(normal * self.logit_std + self.logit_mean) * self.t_max

    def sampling_times(self, steps: int, device: torch.device | str = "cpu") -> torch.Tensor:
        if steps < 1:
            raise ValueError("sampling needs at least one step")
        t = torch.linspace(self.t_max, 0.0, steps + 1, device=device)
        t = self.shift * t / (1.0 + (self.shift - 1.0) * t)
        if self.shift_terminal is None or steps < 2:  # one step: nothing to stretch (diffusers would divide by 0)
            return t
        inner = 1.0 - t[:-1]
        return torch.cat([1.0 - inner * ((1.0 - self.shift_terminal) / inner[-1]), t[-1:]])

    def precondition(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.zeros_like(t), torch.ones_like(t), torch.ones_like(t), t


class DiscreteVPScheduler(NoiseScheduler):
    """The discrete variance-preserving schedule of DDPM-trained latent models (Stable Diffusion 1.x / 2.x):
    ``x_k = sqrt(abar_k) x0 + sqrt(1 - abar_k) eps`` with ``abar_k = prod_{j <= k} (1 - beta_j)`` over
    ``k = 0..N-1`` (Ho et al. 2020, Eq. 4) and, for ``beta_schedule="scaled_linear"``, ``beta_k = (sqrt(b_0) +
    k / (N - 1) (sqrt(b_1) - sqrt(b_0)))^2`` (the Stable Diffusion schedule; ``"linear"``: DDPM's own).

    Time here is continuous, ``t in [0, 1]``: ``t = (k + 1) / N`` is step ``k`` and ``t = 0`` is clean data;
    ``ln abar`` is linear in ``t`` between those knots, so ``alpha``, ``sigma`` and their derivatives (needed to
    convert to the ODE velocity) are exact for the trained steps and smooth enough between them. The network sees
    ``x_t`` unscaled and the step index ``c_noise = t N - 1`` (what the U-Net was trained on) and predicts
    ``prediction_type`` (``eps`` - Ho et al. 2020, Eq. 14 - or ``v`` for the v-prediction checkpoints; Salimans &
    Ho 2022, Sec. 4).

    * training: ``k`` uniform over the ``N`` steps, weight 1 on the native prediction (DDPM's "simple" loss);
    * sampling grid: ``steps + 1`` uniform times from 1 to 0 - "trailing" spacing, which starts at the last trained
      step (Lin et al. 2024, "Common diffusion noise schedules and sample steps are flawed", Table 2).

    CogVideoX's schedule (``CogVideoXDDIMScheduler`` / ``CogVideoXDPMScheduler``) changes ``abar`` twice after the
    betas, in this order, and both are here so the network trains and samples on the schedule it was trained with:

    * ``snr_shift_scale`` ``s``: ``abar' = abar / (s + (1 - s) abar)``, the signal-to-noise ratio divided by ``s``
      (SD3's resolution shift, Esser et al. 2024, Sec. 5.3.2; 1: none);
    * ``rescale_betas_zero_snr``: ``sqrt(abar)`` shifted and scaled so that the last step is pure noise and the first
      keeps its value (Lin et al. 2024, Algorithm 1). ``abar_N = 0`` has no logarithm, so on the last segment
      ``((N - 1) / N, 1]`` ``alpha`` falls linearly to 0 (``sigma = sqrt(1 - alpha^2)``): exact at both knots, and
      every conversion stays finite (``v`` at ``t = 1`` is ``-x0``).
    """

    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.00085, beta_end: float = 0.012,
                 beta_schedule: str = "scaled_linear", prediction_type: str = "eps", snr_shift_scale: float = 1.0,
                 rescale_betas_zero_snr: bool = False) -> None:
        if beta_schedule == "scaled_linear":
            betas = torch.linspace(beta_start**0.5, beta_end**0.5, num_train_timesteps, dtype=torch.float64, device="cpu") ** 2
        elif beta_schedule == "linear":
            betas = torch.linspace(beta_start, beta_end, num_train_timesteps, dtype=torch.float64, device="cpu")
        else:
            raise ValueError(f"beta_schedule must be 'scaled_linear' or 'linear', got {beta_schedule!r}")
        if prediction_type not in ("eps", "v"):
            raise ValueError(f"prediction_type must be 'eps' or 'v', got {prediction_type!r}")
        if not snr_shift_scale > 0:
            raise ValueError(f"snr_shift_scale must be positive, got {snr_shift_scale!r}")
        self.native_pred_type = prediction_type  # type: ignore[assignment]
        self.num_train_timesteps = int(num_train_timesteps)
        # kept as given: an export writes the same schedule into a diffusers scheduler (fastgen.pipelines)
        self.beta_start, self.beta_end, self.beta_schedule = float(beta_start), float(beta_end), beta_schedule
        self.snr_shift_scale, self.rescale_betas_zero_snr = float(snr_shift_scale), bool(rescale_betas_zero_snr)
        # ln abar at the knots t = 0 (clean), 1/N, ..., 1; on the CPU even inside a meta-device build
        log_abar = torch.cumsum(torch.log1p(-betas), 0)
        if self.snr_shift_scale != 1.0 or self.rescale_betas_zero_snr:
            log_abar = self._modified(log_abar.exp()).log()
        # a zero-terminal-SNR last knot (ln 0) is never interpolated in ln abar (see _alpha_last_segment)
        self.zero_terminal_snr = bool(log_abar[-1] == -torch.inf)
        if self.zero_terminal_snr:
            log_abar[-1] = log_abar[-2]
        self._log_abar = torch.cat([torch.zeros(1, dtype=torch.float64, device="cpu"), log_abar])
        self.t_min, self.t_max = 0.0, 1.0
        self._sigma_max = 1.0 if self.zero_terminal_snr else float((-torch.expm1(self._log_abar[-1])).sqrt())

    def _modified(self, abar: torch.Tensor) -> torch.Tensor:
        """``abar`` after CogVideoX's SNR shift and zero-terminal-SNR rescale, in the order and float64 precision of
        ``CogVideoXDDIMScheduler.__init__``."""
        s = self.snr_shift_scale
        abar = abar / (s + (1 - s) * abar)
        if self.rescale_betas_zero_snr:
            root = abar.sqrt()
            first, last = root[0].clone(), root[-1].clone()
            root = (root - last) * (first / (first - last))
            root[-1] = 0.0  # exactly: (last - last) * scale
            abar = root**2
        return abar

    def alphas_cumprod(self) -> torch.Tensor:
        """``abar_k`` for the trained steps ``k = 0..N-1`` (float64): the diffusers schedulers' ``alphas_cumprod``."""
        abar = self._log_abar[1:].exp()
        if self.zero_terminal_snr:
            abar[-1] = 0.0
        return abar

    def prior_sample(self, shape: tuple[int, ...], device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                     generator: RandomSource = None) -> torch.Tensor:
        # sigma(t_max) as a Python number computed once: no tensor value is read while a step runs (fake tensors)
        return randn(shape, device=device, dtype=dtype, generator=generator) * self._sigma_max

    def _log_abar_and_slope(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.num_train_timesteps
        table = self._log_abar.to(t.device)
        position = (t.double() * n).clamp(0, n)
        left = position.floor().clamp(max=n - 1).long()
        slope = (table[left + 1] - table[left]) * n  # d ln(abar) / dt on this segment
        value = table[left] + (position - left) * (table[left + 1] - table[left])
        return value.to(t.dtype), slope.to(t.dtype)

    def _alpha_last_segment(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """With zero terminal SNR: ``(on the last segment, alpha there, d alpha / dt there)``, ``alpha`` linear
        from ``sqrt(abar_{N-1})`` at ``t = (N - 1) / N`` to 0 at ``t = 1``."""
        n = self.num_train_timesteps
        position = (t.double() * n).clamp(0, n)
        knot = float((0.5 * self._log_abar[n - 1]).exp())
        last = position >= n - 1
        return last, (knot * (n - position)).to(t.dtype), torch.full_like(t, -knot * n)

    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        alpha = (0.5 * self._log_abar_and_slope(t)[0]).exp()
        if self.zero_terminal_snr:
            last, value, _ = self._alpha_last_segment(t)
            alpha = torch.where(last, value, alpha)
        return alpha

    def sigma(self, t: torch.Tensor) -> torch.Tensor:
        sigma = (-torch.expm1(self._log_abar_and_slope(t)[0])).clamp(min=0).sqrt()
        if self.zero_terminal_snr:
            last, value, _ = self._alpha_last_segment(t)
            sigma = torch.where(last, (1 - value**2).clamp(min=0).sqrt(), sigma)
        return sigma

    def d_alpha(self, t: torch.Tensor) -> torch.Tensor:
        log_abar, slope = self._log_abar_and_slope(t)
        d_alpha = 0.5 * slope * (0.5 * log_abar).exp()
        if self.zero_terminal_snr:
            last, _, derivative = self._alpha_last_segment(t)
            d_alpha = torch.where(last, derivative, d_alpha)
        return d_alpha

    def d_sigma(self, t: torch.Tensor) -> torch.Tensor:
        log_abar, slope = self._log_abar_and_slope(t)
        d_sigma = -0.5 * slope * log_abar.exp() / (-torch.expm1(log_abar)).clamp(min=0).sqrt()
        if self.zero_terminal_snr:
            last, value, derivative = self._alpha_last_segment(t)
            d_sigma = torch.where(last, -value * derivative / (1 - value**2).clamp(min=1e-12).sqrt(), d_sigma)
        return d_sigma

    def sample_t(self, n: int, device: torch.device | str = "cpu", generator: RandomSource = None) -> torch.Tensor:
        # a standard normal through its CDF is uniform on (0, 1): the keyed streams provide normals
        uniform = 0.5 * (1.0 + torch.erf(randn(n, device=device, generator=generator) / 2**0.5))
        step = (uniform * self.num_train_timesteps).floor().clamp(max=self.num_train_timesteps - 1)
        return (step + 1.0) / self.num_train_timesteps

    def sampling_times(self, steps: int, device: torch.device | str = "cpu") -> torch.Tensor:
        if steps < 1:
            raise ValueError("sampling needs at least one step")
        return torch.linspace(1.0, 0.0, steps + 1, device=device)

    def precondition(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        step = (t * self.num_train_timesteps - 1.0).clamp(min=0.0)
        return torch.zeros_like(t), torch.ones_like(t), torch.ones_like(t), step


class TrigFlowScheduler(NoiseScheduler):
    """TrigFlow (Lu & Song 2024, "Simplifying, stabilizing and scaling continuous-time consistency models",
    Sec. 2): ``x_t = cos(t) x0 + sin(t) z`` with ``z ~ N(0, sigma_d^2 I)`` and ``t in [0, pi/2]``.

    In this module's convention ``eps = z / sigma_d``, so ``alpha = cos t`` and ``sigma = sigma_d sin t``. The
    network predicts the PF-ODE velocity ``dx_t/dt = cos(t) z - sin(t) x0`` as ``sigma_d F(x_t / sigma_d,
    c_noise(t))`` (the TrigFlow diffusion objective, Eq. 3): ``c_skip = 0``, ``c_out = sigma_d``,
    ``c_in = 1 / sigma_d`` and ``c_noise(t) = t`` (the identity time transform of Sec. 4.1). Its ``x0`` estimate
    ``cos(t) x_t - sin(t) sigma_d F`` is the consistency function sCM trains.

    * training: ``t = arctan(e^n / sigma_d)`` with ``n ~ N(P_mean, P_std^2)`` (the "tan-lognormal" proposal,
      Sec. 4.1), weight ``1 / sigma_d^2`` on the velocity error (the loss on ``F``);
    * time range: the noise-to-signal ratio ``sigma_d tan t`` runs over EDM's ``[sigma_min, sigma_max]``, i.e.
      ``t_max = arctan(sigma_max / sigma_d)``;
    * sampling grid: EDM's ``rho``-spaced ``sigma_i`` (Karras et al. 2022, Eq. 5) mapped to
      ``t_i = arctan(sigma_i / sigma_d)``, ending at 0.

    An EDM-preconditioned network is this parameterisation in disguise: with ``sigma = sigma_d tan t`` and
    ``x_EDM = x_t / cos t``, EDM's ``c_in x_EDM = x_t / sigma_d`` and ``D = cos(t) x_t + sigma_d sin(t) F_EDM``
    (so ``F = -F_EDM``); ``fastgen.methods.cm_utils.map_state`` uses that equivalence to run sCM on any schedule.
    """

    native_pred_type: PredType = "flow"

    def __init__(self, sigma_data: float = 0.5, sigma_min: float = 0.002, sigma_max: float = 80.0,
                 P_mean: float = -1.0, P_std: float = 1.4, rho: float = 7.0) -> None:  # noqa: N803 - paper names
        self.sigma_data, self.sigma_min, self.sigma_max = float(sigma_data), float(sigma_min), float(sigma_max)
        self.P_mean, self.P_std, self.rho = float(P_mean), float(P_std), float(rho)
        self.t_min = 0.0
        ratio = torch.tensor(self.sigma_max / self.sigma_data, dtype=torch.float64, device="cpu")
        self.t_max = float(torch.atan(ratio))

    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        return torch.cos(t)

    def sigma(self, t: torch.Tensor) -> torch.Tensor:
        return self.sigma_data * torch.sin(t)

    def d_alpha(self, t: torch.Tensor) -> torch.Tensor:
        return -torch.sin(t)

    def d_sigma(self, t: torch.Tensor) -> torch.Tensor:
        return self.sigma_data * torch.cos(t)

    def sample_t(self, n: int, device: torch.device | str = "cpu", generator: RandomSource = None) -> torch.Tensor:
        normal = randn(n, device=device, generator=generator)
        return torch.atan((normal * self.P_std + self.P_mean).exp() / self.sigma_data)

    def loss_weight(self, t: torch.Tensor) -> torch.Tensor:
        return torch.full_like(t, 1.0 / self.sigma_data**2)

    def sampling_times(self, steps: int, device: torch.device | str = "cpu") -> torch.Tensor:
        sigmas = EDMNoiseScheduler(self.sigma_min, self.sigma_max, self.sigma_data, rho=self.rho).sampling_times(steps, device)
        return torch.atan(sigmas / self.sigma_data)

    def precondition(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.zeros_like(t), torch.full_like(t, self.sigma_data), torch.full_like(t, 1.0 / self.sigma_data), t
