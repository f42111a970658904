"""The method base class shared by every training / distillation method.

A method is an ``nn.Module`` built from ``config.model``. It owns the trained network ``net``, its EMA copies
(``model.use_ema``; updated by ``EMACallback``), and - in subclasses - teachers, fake-score networks and
discriminators. The trainer only relies on this contract:

* ``model_dict`` - every module, by name (``net``, ``ema``, ``teacher``...); ``saved_modules`` - those a
  checkpoint stores: all but ``frozen_modules`` (a teacher), which ``init_frozen_weights()`` rebuilds from their
  source on every start, fresh or resumed;
* ``init_optimizers()``, ``optimizer_dict`` and ``scheduler_dict`` - keyed by the module they train
  (``trainable_modules``; module ``name`` takes ``config.<name>_optimizer`` / ``config.<name>_scheduler``);
* ``init_weights()`` - called once on a fresh run (not on resume): load teachers, copy weights;
  ``init_frozen_weights()`` - its part that loads the frozen networks (also called on resume);
* ``get_optimizers(iteration)`` - the names stepped this iteration (GAN-style methods alternate);
* ``single_train_step(data, iteration) -> (loss_dict, outputs)`` with ``loss_dict["total_loss"]``;
* ``validation_step(data, iteration) -> loss_dict`` (networks are in eval mode, gradients off);
* ``bind_batch(data, iteration, seed, stream)`` - a context the trainer runs each of those two calls in: inside
  it ``self.rng`` is the batch's keyed noise stream (``fastgen.distributed.keyed_rng``), so every random number a step
  draws is a function of the samples' global ids and not of the world size;
* ``generator_fn(net, noise, steps, condition)`` and ``sample(...)`` - how samples are drawn.

Optional: ``carry_state`` / ``propose_carry`` / ``take_carry_proposal`` - state carried from one iteration to
the next, committed only after a completed step by ``CarryCallback`` (see ``fastgen.callbacks.carry``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from fastgen.configs.instantiate import instantiate
from fastgen.distributed.keyed_rng import GLOBAL_NOISE, KeyedNoise, NoiseSource
from fastgen.networks.diffusion_net import DiffusionNet
from fastgen.methods.multimodal import guidance_scales, guide, pipeline_guidance, pipeline_guided_x0
from fastgen.networks.layers import as_one_hot
from fastgen.networks.modalities import is_multimodal, per_modality
from fastgen.networks.noise_schedules import NoiseScheduler
from fastgen.networks.sampling import heun_sample
from fastgen.utils.dtypes import FLOAT_DTYPES
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)



def conditioning_frame_choices(config: Any) -> list[int]:
    """``model.conditioning_frames`` as a list of counts (an int is a list of one; unset: ``[0]``)."""
    value = getattr(config, "conditioning_frames", 0) or 0
    if isinstance(value, int):
        return [int(value)]
    choices = [int(v) for v in value]
    if not choices:
        from fastgen.utils.errors import ConfigError

        raise ConfigError("model.conditioning_frames: an empty list; give counts to draw from, e.g. [1, 2]")
    return choices


class FastGenModel(nn.Module):
    #: whether the method trains multimodal samples (``model.modality_shapes``; ``fastgen.networks.modalities``);
    #: each class declares it for itself (a subclass does not inherit it)
    supports_modalities: bool = False

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.precision = FLOAT_DTYPES[config.precision]
        path = getattr(config, "pretrained_model_path", None)
        if path:  # a diffusers weights folder decides the architecture of the networks it initialises
            from fastgen.networks.diffusers_nets import adopt_folder_architecture

            for name in ("net", "teacher", "fake_score"):
                if adopt_folder_architecture(getattr(config, name, None), str(path)):
                    logger.info("model.%s: the architecture of %s", name, path)
        self.net: DiffusionNet = instantiate(config.net)
        self.net.to(self.precision)
        adapter = getattr(config, "net_adapter", None)
        if adapter is not None:  # LoRA (fastgen.utils.lora_utils): before the EMA copies, which share its layout
            instantiate(adapter).apply(self.net)
        self.adapt_net(self.net)
        self.ema_nets = nn.ModuleDict()
        for name in config.ema_names:
            if name in ("net",):
                raise ValueError("an EMA network cannot be named 'net'")
            ema = copy.deepcopy(self.net).requires_grad_(False).eval()
            self.ema_nets[name] = ema
        self.num_classes = int(config.num_classes)
        # declared by each class itself, not inherited: a subclass that changes the loss (SiD, f-distill) has not
        # been made multimodal by its parent's being so
        if getattr(config, "modality_shapes", None) and not type(self).__dict__.get("supports_modalities", False):
            from fastgen.utils.errors import ConfigError

            raise ConfigError(f"model.modality_shapes: {type(self).__name__} trains samples of one modality; the "
                              "multimodal methods are SFT, DMD2 and PDD")
        if getattr(config, "modality_guidance_scales", None) and not getattr(config, "modality_shapes", None):
            from fastgen.utils.errors import ConfigError

            raise ConfigError("model.modality_guidance_scales: the model samples one modality (no "
                              "model.modality_shapes); its guidance is model.guidance_scale")
        from fastgen.methods.multimodal import check_pipeline_guidance

        check_pipeline_guidance(config, self.net)  # LTX2Pipeline's rescale / STG / isolation: LTX-2 networks only
        self._check_conditioning_frames(config)
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.schedulers: dict[str, Any] = {}

    #: whether the method trains video-to-world (``model.conditioning_frames``); declared by each class itself
    supports_conditioning_frames: bool = False

    def _check_conditioning_frames(self, config: Any) -> None:
        """``model.conditioning_frames`` in one line when the method, the network or the sample shape cannot
        take it (``fastgen.networks.conditioning_frames``)."""
        choices = conditioning_frame_choices(config)
        if not any(choices):
            return
        from fastgen.utils.errors import ConfigError

        if not type(self).__dict__.get("supports_conditioning_frames", False):
            raise ConfigError(f"model.conditioning_frames: {type(self).__name__} generates every frame; "
                              "video-to-world training is SFT's and DMD2's")
        if getattr(config, "modality_shapes", None):
            raise ConfigError("model.conditioning_frames: a multimodal sample (model.modality_shapes) is given no "
                              "clean frames; condition the video of a model without sound")
        shape = list(config.input_shape)
        if min(choices) < 0 or len(shape) != 4 or max(choices) >= shape[1]:
            raise ConfigError(f"model.conditioning_frames={getattr(config, 'conditioning_frames')} needs a video "
                              f"input_shape [C, F, H, W] with more than {max(choices)} latent frames; got {shape}")
        if not getattr(getattr(self.net, "backbone", None), "takes_conditioning_frames", False):
            raise ConfigError("model.conditioning_frames: the network reads no condition mask (a video-to-world "
                              "model such as Cosmos Predict2's Video2World, in_channels = out_channels + 1, does)")

    def draw_conditioning_frames(self) -> int:
        """This step's count of given latent frames: ``model.conditioning_frames``, or one of its list drawn from
        the step's shared stream (every rank the same, so sharded networks run the same computation)."""
        choices = conditioning_frame_choices(self.config)
        if len(choices) == 1:
            return choices[0]
        return choices[int(self.rng.shared.randint(len(choices), ()).item())]

    def adapt_net(self, net: nn.Module) -> None:
        """A method's change to the trained network's architecture (PDD widens its output projection), made in
        place before the EMA copies are taken so that they share it. Default: none."""

    # ---- what the trainer checkpoints and steps ------------------------------------------------------------
    @property
    def noise_scheduler(self) -> NoiseScheduler:
        return self.net.noise_scheduler

    # Networks that never train (a distillation's teacher): not written into checkpoints - a 12B teacher would add
    # 24 GB to every save - but rebuilt from their source by ``init_frozen_weights`` on every start.
    frozen_modules: tuple[str, ...] = ()

    @property
    def model_dict(self) -> dict[str, nn.Module]:
        return {"net": self.net, **dict(self.ema_nets.items())}

    @property
    def saved_modules(self) -> dict[str, nn.Module]:
        """The networks a checkpoint holds: what trains and its EMA copies; ``model_dict`` minus the frozen ones."""
        return {name: module for name, module in self.model_dict.items() if name not in self.frozen_modules}

    @property
    def rebuilt_modules(self) -> dict[str, nn.Module]:
        """The frozen networks this method has (``model_dict`` minus ``saved_modules``)."""
        return {name: module for name, module in self.model_dict.items() if name in self.frozen_modules}

    @property
    def trainable_modules(self) -> dict[str, nn.Module]:
        """Modules with an optimizer, by the optimizer's name."""
        return {"net": self.net}

    def init_optimizers(self) -> None:
        """Build ``optimizer_dict`` / ``scheduler_dict`` (after the model is on its device): one optimizer per
        ``trainable_modules`` entry, from ``config.<name>_optimizer`` and optional ``config.<name>_scheduler``."""
        for name, module in self.trainable_modules.items():
            optimizer_cfg = getattr(self.config, f"{name}_optimizer")
            self.optimizers[name] = instantiate(optimizer_cfg, params=[p for p in module.parameters() if p.requires_grad])
            scheduler_cfg = getattr(self.config, f"{name}_scheduler", None)
            if scheduler_cfg is not None:
                self.schedulers[name] = instantiate(scheduler_cfg, optimizer=self.optimizers[name])

    def init_weights(self) -> None:
        """Called once when a run starts from scratch (never on resume, which restores every saved module).
        Methods that distill load their teacher here (``init_frozen_weights``) and copy it into the student; EMA
        networks start equal to ``net``."""
        self.init_frozen_weights()
        self.load_pretrained_model(self.net)
        self.sync_ema_to_net()

    def frozen_source(self, name: str) -> str:
        """Where frozen network ``name`` comes from, in the config's words (for messages)."""
        return f"model.{name}"

    def init_frozen_weights(self) -> None:
        """Load the frozen networks (``frozen_modules``) from where the config says they come from. Called on
        every start - by ``init_weights`` on a fresh run, on its own on a resume - and must load nothing else."""

    def prepare_training_data(self) -> None:
        """Called by the trainer on every rank once the networks are built, loaded and placed (fresh and resumed
        runs), before the data loaders: data a method makes with its own networks (KD's teacher pairs). May
        use collectives."""

    def load_pretrained_model(self, net: nn.Module) -> None:
        """``model.pretrained_model_path`` (a diffusers weights folder, ``fastgen.networks.diffusers_nets``) into
        ``net``'s backbone: the trained network here, the teacher in a distillation. A backbone that cannot read
        such a folder is a one-line error naming the field and the other ways to start from weights."""
        path = getattr(self.config, "pretrained_model_path", None)
        if not path:
            return
        backbone = getattr(net, "backbone", net)
        loader = getattr(backbone, "load_pretrained", None)
        if loader is None:
            from fastgen.utils.errors import ConfigError

            raise ConfigError(f"model.pretrained_model_path is read by diffusers-backed networks only; "
                              f"{type(backbone).__name__} starts from trainer.checkpointer.pretrained_ckpt_path or a "
                              "distillation method's model.teacher_ckpt")
        loader(str(path))
        logger.info("loaded the pretrained weights in %s", path)

    @torch.no_grad()
    def sync_ema_to_net(self) -> None:
        for ema in self.ema_nets.values():
            ema.load_state_dict(self.net.state_dict())

    @property
    def optimizer_dict(self) -> dict[str, torch.optim.Optimizer]:
        return self.optimizers

    @property
    def scheduler_dict(self) -> dict[str, Any]:
        return self.schedulers

    def get_optimizers(self, iteration: int) -> list[str]:
        """Names of the optimizers stepped at ``iteration`` (all of them by default)."""
        return list(self.optimizers)

    def fsdp_conflict(self) -> str | None:
        """A setting of this method that FSDP2 cannot run, as a one-line reason naming the config key (``None``:
        none). ``fastgen.distributed.parallelize`` refuses to shard the method then."""
        return None

    # ---- carried state (fastgen.callbacks.carry.CarryCallback) ---------------------------------------------------
    #: The committed state a method carries across iterations, read (never modified) in ``single_train_step``.
    #: ``None``: the method carries nothing. A method that carries state sets a dict in ``__init__``; from then on
    #: only ``CarryCallback`` replaces it (after a completed step, or on resume).
    carry_state: dict[str, torch.Tensor] | None = None

    def propose_carry(self, state: Mapping[str, torch.Tensor]) -> None:
        """Offer ``state`` - the complete next state, all keys - to replace ``carry_state`` once this step completes.
        A later proposal in the same iteration replaces an earlier one."""
        for key, value in state.items():
            if not isinstance(key, str) or not isinstance(value, torch.Tensor):
                raise TypeError(f"propose_carry: entry {key!r} is a {type(value).__name__}; carried state maps str "
                                "keys to tensors")
        self._carry_proposal = dict(state)

    def take_carry_proposal(self) -> dict[str, torch.Tensor] | None:
        """The pending proposal (``None`` if there is none), cleared."""
        return self.__dict__.pop("_carry_proposal", None)

    # ---- the step's random numbers ----------------------------------------------------------------------------
    _bound_noise: NoiseSource | None = None
    _warned_unkeyed = False  # set on the class: one warning per process

    @property
    def rng(self) -> NoiseSource:
        """Where a training or validation step draws every random number (``randn_like``, ``rand``, ``randint``,
        ``rows(n)``, ``shared``): the bound batch's ``KeyedNoise``, or torch's global generator outside
        ``bind_batch`` (unit tests that call ``single_train_step`` directly)."""
        return self._bound_noise if self._bound_noise is not None else GLOBAL_NOISE

    @contextlib.contextmanager
    def bind_batch(self, data: Mapping[str, Any], iteration: int, seed: int, stream: str = "train"
                   ) -> Iterator[NoiseSource]:
        """Within the context, ``self.rng`` is ``KeyedNoise(seed, data["sample_ids"], iteration, stream)``: a draw
        for sample ``i`` depends on ``(seed, stream, iteration, sample id, draw index)`` only. The stream (``train``
        / ``val``) keeps validation noise apart from training noise; gradient-accumulation rounds are not part of
        the key (their samples differ, and a per-step choice stays one choice per optimizer step). A batch without
        ``sample_ids`` (a loader that gives none) falls back to torch's generator, with one warning."""
        ids = data.get("sample_ids") if isinstance(data, Mapping) else None
        if ids is None:
            if not FastGenModel._warned_unkeyed:
                FastGenModel._warned_unkeyed = True
                logger.warning("the data loader gives no sample_ids: training noise comes from torch's generator, so "
                               "the run depends on the world size (fastgen.datasets.loader.ResumableLoader adds them)")
            noise: NoiseSource = GLOBAL_NOISE
        else:
            noise = KeyedNoise(seed, ids, iteration, stream)
        previous, self._bound_noise = self._bound_noise, noise
        try:
            yield noise
        finally:
            self._bound_noise = previous

    # ---- training ------------------------------------------------------------------------------------------
    def single_train_step(self, data: dict[str, Any], iteration: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        raise NotImplementedError

    def validation_step(self, data: dict[str, Any], iteration: int) -> dict[str, torch.Tensor]:
        loss_dict, _ = self.single_train_step(data, iteration)
        return loss_dict

    # ---- encoding batches on the fly (model.encode_batches) --------------------------------------------------
    def encode_batch(self, data: dict[str, Any]) -> dict[str, Any]:
        """``model.encode_batches``: a batch's pixels (``real`` with 3 channels where the network takes latents) and
        caption strings (``condition``) become the codec's normalised latents and the network's text condition,
        without gradients, as ``fastgen encode-data`` would have written them; the captions stay in ``caption``
        for the callbacks. Any other batch, or with the field off, is returned as it is. The trainer calls this
        on every training and validation batch."""
        if not getattr(self.config, "encode_batches", False):
            return data
        codec = self._batch_codec()
        out = dict(data)
        with torch.no_grad():
            real = data.get("real")
            if isinstance(real, torch.Tensor) and real.dim() in (4, 5) and real.shape[1] == 3:
                if list(real.shape[1:]) != list(self.config.input_shape):
                    out["real"] = codec.encode_images(real.to(codec.dtype)).to(real.device)
            captions = data.get("condition")
            if isinstance(captions, (list, tuple)) and captions and all(isinstance(c, str) for c in captions):
                out["condition"] = codec.condition(codec.encode_prompts(list(captions)))
                out.setdefault("caption", list(captions))
        return out

    def _batch_codec(self) -> Any:
        """The codec of ``model.pretrained_model_path``, built at the first batch on the networks' device (frozen,
        at the model's precision). It is not a registered module: checkpoints and optimizers leave it alone; with
        DDP every rank holds it whole, under FSDP its VAE and each text encoder are sharded like a teacher (each
        rank encodes its own batch in every step, so the gathers line up)."""
        codec = self.__dict__.get("_codec")
        if codec is None:
            from fastgen.networks.codecs import codec_options, load_codec

            path = getattr(self.config, "pretrained_model_path", None)
            if not path:
                from fastgen.utils.errors import ConfigError

                raise ConfigError("model.encode_batches needs model.pretrained_model_path: the diffusers pipeline "
                                  "folder whose VAE and text encoders encode the batches")
            device = next(self.net.parameters()).device
            codec = load_codec(path, dtype=self.precision, **codec_options(self.net)).to(device)
            shard = self.__dict__.get("_shard_frozen")  # set by fastgen.distributed.parallelize under FSDP
            if shard is not None:
                for encoder in codec.encoders.values():
                    shard(encoder)
                shard(codec.vae, methods=("encode", "decode"))
                logger.info("model.encode_batches: the codec's VAE and text encoders are sharded with FSDP2")
            self.__dict__["_codec"] = codec
        return codec

    def condition_of(self, data: dict[str, Any]) -> torch.Tensor | None:
        if self.num_classes <= 0:
            return None
        return data.get("condition")

    # ---- sampling ------------------------------------------------------------------------------------------
    def sampling_net(self) -> nn.Module:
        """The network samples come from: the first EMA network when ``use_ema`` is set, else ``net``."""
        if len(self.ema_nets):
            return next(iter(self.ema_nets.values()))
        return self.net

    def flow_fn(self, net: nn.Module, condition: torch.Tensor | None, guidance_scale: float | None = None):
        """``(x, t) -> dx/dt``, with classifier-free guidance ``u + s (c - u)`` (Ho & Salimans 2022, Eq. 6)
        when ``guidance_scale`` is set and the model is conditional; a multimodal sample's modalities each with
        their own scale (``model.modality_guidance_scales``, else ``guidance_scale``: ``methods.multimodal``) and,
        with the run's ``PipelineGuidance`` terms (LTX-2's rescale, STG, modality isolation), combined as
        ``LTX2Pipeline`` does on the denoised estimates (``pipeline_guided_x0``), then converted to the flow."""

        def flow(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            if is_multimodal(x):
                terms = pipeline_guidance(self.config, list(x))
                if terms is not None:
                    cond = None if condition is None else as_one_hot(condition, self.num_classes)
                    scales = None if cond is None else guidance_scales(self.config, x, guidance_scale)
                    uncond = None if scales is None else torch.zeros_like(cond)
                    x0 = pipeline_guided_x0(net, x, t, cond, uncond, scales, terms, batched=False)
                    schedule = net.noise_scheduler
                    return {m: schedule.convert(x0[m], x[m], t[m] if is_multimodal(t) else t, "x0", "flow")
                            for m in x0}
            if is_multimodal(x) and condition is not None:
                scales = guidance_scales(self.config, x, guidance_scale)
                if scales is not None:
                    cond = as_one_hot(condition, self.num_classes)
                    c = net(x, t, condition=cond, fwd_pred_type="flow")
                    u = net(x, t, condition=torch.zeros_like(cond), fwd_pred_type="flow")
                    return guide(c, u, scales)
            if guidance_scale is None or condition is None or is_multimodal(x):
                return net(x, t, condition=condition, fwd_pred_type="flow")
            cond = as_one_hot(condition, self.num_classes)
            both = net(torch.cat([x, x]), torch.cat([t, t]), condition=torch.cat([cond, torch.zeros_like(cond)]), fwd_pred_type="flow")
            c, u = both.chunk(2)
            return u + guidance_scale * (c - u)

        return flow

    def generator_fn(self, net: nn.Module, noise: torch.Tensor, steps: int | None = None,
                     condition: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Deterministic Heun sampling of the probability-flow ODE from ``noise`` (= ``x_{t_max}``).

        ``generator`` is for samplers that draw fresh noise on the way (multi-step students): they must draw it
        from ``generator`` so that samples are reproducible and never disturb the training random stream."""
        steps = steps or self.config.sample_steps
        flow = self.flow_fn(net, condition, self.config.guidance_scale)
        return heun_sample(flow, noise, self.noise_scheduler, steps)

    def inference_autocast(self) -> Any:
        """``model.precision_amp_infer``: the autocast of sampling (a no-op context when it is None)."""
        from fastgen.utils.amp import autocast

        return autocast(next(self.net.parameters()).device.type, getattr(self.config, "precision_amp_infer", None))

    def sample_labels(self, n: int, device: torch.device) -> torch.Tensor | None:
        """Balanced labels ``0, 1, ..., C-1, 0, ...`` for conditional sample grids."""
        if self.num_classes <= 0:
            return None
        return torch.arange(n, device=device) % self.num_classes

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None, net: nn.Module | None = None,
               steps: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``n`` samples (and their labels) from ``net`` (default: ``sampling_net()``), using ``generator`` only,
        so drawing samples for a log never disturbs the training random stream."""
        net = net or self.sampling_net()
        device = next(self.net.parameters()).device
        noise = self.prior_noise(n, device, generator)
        labels = self.sample_labels(n, device)
        was_training = net.training
        net.eval()
        try:
            with self.inference_autocast():
                samples = self.generator_fn(net, noise, steps, labels, generator=generator)
        finally:
            net.train(was_training)
        return per_modality(lambda x: x.float(), samples), labels

    def prior_noise(self, n: int, device: torch.device, generator: torch.Generator | None = None) -> Any:
        """``n`` starting states ``x_{t_max}`` of ``model.input_shape`` - or, for a multimodal model, a dict of one
        per ``model.modality_shapes`` entry, drawn in that order - on the CPU from ``generator`` (so they do not
        depend on the device), then moved to ``device`` at the model's precision."""
        shapes = getattr(self.config, "modality_shapes", None)
        if not shapes:
            noise = self.noise_scheduler.prior_sample((n, *self.config.input_shape), device="cpu", dtype=torch.float32,
                                                      generator=generator)
            return noise.to(device=device, dtype=self.precision)
        return {name: self.noise_scheduler.prior_sample((n, *shape), device="cpu", dtype=torch.float32,
                                                        generator=generator).to(device=device, dtype=self.precision)
                for name, shape in shapes.items()}
