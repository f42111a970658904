"""Base config classes: ``BaseConfig`` and its parts (model, trainer, checkpointer, logging).

Every class is strict (see ``fastgen.configs.schema``): a misspelled field is an ``AttributeError`` with the
closest names, and every mutable default comes from a factory. Defaults name their targets as import-path
strings, so this module imports no model, network or callback class.

Method configs (``fastgen/configs/methods/``) subclass ``BaseModelConfig``; experiment configs
(``fastgen/configs/experiments/``) are Python files whose ``create_config()`` returns a ``BaseConfig``.

Fields that matter for scaling:

* ``trainer.batch_size_global`` - samples per optimizer step over all ranks. With per-rank batch ``B`` from
  ``dataloader_train.batch_size`` and ``W`` ranks, the trainer runs ``batch_size_global / (B * W)`` gradient
  accumulation rounds per step (it must divide exactly). ``None`` means one round.
* ``trainer.ddp`` / ``trainer.fsdp`` - torchrun distributes training only when one of them is set (a multi-rank
  launch of a config with neither is refused, since every rank would train its own copy). Launch with
  ``fastgen train --nproc-per-node N [--nnodes M --node-rank R --rdzv-endpoint HOST:PORT]``, ``torchrun -m fastgen
  train ...`` or ``torchrun train.py ...``; a single process ignores both.

  - ``ddp=True``: every trained network (student, fake score, discriminator) is replicated with torch's
    composable ``replicate`` (DDP); gradients are all-reduced once per optimizer step, in the last accumulation
    round, and only for the networks that step in that iteration (GAN-style methods alternate). Frozen teachers
    and EMA copies are not wrapped: they are identical on every rank.
  - ``fsdp=True``: every network - trained, the frozen teacher, EMA copies - is sharded with FSDP2
    (``fully_shard`` on each block a network lists in ``shard_units()``, then the network). Each rank holds
    ``1/N`` of the parameters, gradients and optimizer state; EMA copies are sharded exactly like ``net``, so the
    EMA update is local. The ``fsdp_*`` fields below tune it.
* ``trainer.dist_timeout_s`` - how long a collective may wait for the other ranks before the run fails
  (the process group's timeout).
* ``trainer.fsdp_param_dtype`` / ``trainer.fsdp_reduce_dtype`` - FSDP2's mixed-precision policy: the dtype the
  sharded parameters are all-gathered to for forward and backward, and the dtype gradients are reduce-scattered
  in (``None``: the parameters' own dtype). The sharded master weights and the optimizer keep ``model.precision``.
* ``trainer.fsdp_reshard_after_forward`` - free the gathered parameters after forward and gather again for
  backward (``True``: least memory; ``False``: one all-gather less per block, ZeRO-2 style).
* ``trainer.fsdp_cpu_offload`` - keep the sharded parameters, gradients and optimizer state in host memory and
  step the optimizer there (needs CUDA for compute).
* ``trainer.fsdp_shard_size`` - hybrid sharding (HSDP): shard within groups of this many ranks and replicate across
  groups (a 2-D ``replicate x shard`` mesh, e.g. 8 = one node of 8 GPUs); ``None`` shards over all ranks.
* ``model.precision`` - dtype of the networks' weights (``float32``, ``bfloat16``, ``float16``).
* ``model.precision_amp`` - mixed precision: training and validation steps run under ``torch.autocast`` in this
  dtype (``bfloat16``, ``float16``; ``None``: off) while the weights, gradients and optimizer stay in
  ``model.precision`` (which must then be ``float32``). ``float16`` adds dynamic loss scaling
  (``fastgen.callbacks.loss_scale``): overflowing steps are skipped and the scale adapts. ``bfloat16`` needs no
  scaling and works on CPU too. With FSDP, ``trainer.fsdp_param_dtype`` is the other way to compute in low precision.
* ``model.precision_amp_infer`` - the autocast dtype of sampling (W&B grids, ``fastgen sample`` / ``eval``).
* ``model.meta_init`` - every rank builds the networks on the meta device (no memory), shards them (FSDP) and
  allocates only its shards; rank 0 alone builds the method for real on the host (initial weights: teacher,
  student init, ``pretrained_ckpt_path``) and broadcasts the weights into every rank's shards. A multi-rank run
  then holds one full copy of the weights on the host instead of one per rank (large models).
* ``model.activation_checkpointing`` - every block (``shard_units()``) of the trained networks stores only its input
  in forward and recomputes its activations in backward: activation memory drops to the block inputs plus one
  block's, for about one more forward pass per step. Checkpoint keys are unchanged; composes with DDP and FSDP2
  (``fastgen.distributed.parallelize.apply_activation_checkpointing``).
* ``model.net_adapter`` - LoRA: a LazyCall of ``fastgen.utils.lora_utils.LoRAAdapter`` (rank, alpha, dropout,
  target-module patterns). Only the adapter trains and is checkpointed; the frozen base is rebuilt from the
  teacher or ``trainer.checkpointer.pretrained_ckpt_path`` on every start; ``convert-ckpt --merge-lora`` exports
  merged weights. ``fastgen/utils/lora_utils.py`` documents it.
* ``model.torch_compile_mode`` - ``torch.compile`` mode (``default``, ``reduce-overhead``, ``max-autotune``,
  ``max-autotune-no-cudagraphs``) for the trained networks, block by block (``fastgen.distributed.parallelize.
  apply_compile``); ``None`` (the default): eager. Compilation happens at the first step (minutes for a large
  network); a failure there stops the run with one line naming this field. Composes with ``trainer.ddp`` /
  ``trainer.fsdp``: blocks are compiled in place after ``replicate`` / ``fully_shard`` (2-rank compiled runs
  match eager ones: ``tests/networks/test_compile.py``).
* ``model.pretrained_model_path`` - the diffusers weights folder a diffusers-backed network
  (``fastgen.configs.net_diffusers``) starts from: the trained network of SFT, the teacher of a distillation
  (which the student copies). Refused for other networks and together with ``model.teacher_ckpt``.
"""

from __future__ import annotations

import os
from typing import Literal, Optional, Union

import attrs
from omegaconf import DictConfig, OmegaConf

from fastgen.configs.instantiate import LazyCall
from fastgen.configs.schema import StrictConfig, config_class

WandbMode = Literal["auto", "online", "offline", "disabled"]


def _empty_dict() -> DictConfig:
    return OmegaConf.create({})


@config_class
class LogConfig(StrictConfig):
    """Where a run writes and how it is named. ``save_path`` is ``$FASTGEN_OUTPUT_ROOT/{project}/{group}/{name}``."""

    project: str = "fastgen"
    group: str = "default"
    # None: the config file's name (set by the loader), e.g. "config_sft_digits".
    name: Optional[str] = None
    # auto: online when a W&B API key is available, otherwise offline (with a hint to `wandb sync`).
    wandb_mode: WandbMode = "auto"
    wandb_entity: Optional[str] = None

    @property
    def save_path(self) -> str:
        root = os.environ.get("FASTGEN_OUTPUT_ROOT", "./FASTGEN_OUTPUT")
        return os.path.join(root, self.project, self.group, self.name or "unnamed")


@config_class
class CheckpointerConfig(StrictConfig):
    """Checkpoint storage. A relative ``save_dir`` lives in the run directory (or in ``s3_container``)."""

    save_dir: str = "checkpoints"
    # Keep checkpoints in S3 under s3://<s3_container>/<project>/<group>/<name>/<save_dir> (s3_container is
    # "bucket/prefix"; credentials from credentials_dir/s3.json or AWS_* variables). An s3:// save_dir is used as
    # it is. See fastgen/checkpoint/stores.py.
    use_s3: bool = False
    s3_container: Optional[str] = None
    # Weights to start a *new* run from (e.g. a teacher, or a monolithic checkpoint for an FSDP run): a local
    # .pth or an s3:// one (credentials as for use_s3), monolithic or a sharded checkpoint's marker.
    pretrained_ckpt_path: Optional[str] = None
    # Keep only the newest N checkpoints (None keeps all); a sharded checkpoint's folder goes with its marker.
    keep_last_n: Optional[int] = None
    # Write checkpoints in the background while training continues (at most one save in flight; the run waits
    # for the last one before it exits). See fastgen/checkpoint/manager.py.
    async_save: bool = False


@config_class
class BaseTrainerConfig(StrictConfig):
    """The training loop: length, logging, checkpoints, validation, callbacks, distribution."""

    max_iter: int = 1000  # optimizer steps in total, restored iterations included
    logging_iter: int = 100
    save_ckpt_iter: int = 500
    validation_iter: Optional[int] = None  # None: no validation during training
    max_val_iter: int = 4  # validation batches per validation
    batch_size_global: Optional[int] = None
    seed: int = 0
    resume: bool = True
    device: str = "auto"  # auto: CUDA when available, else CPU
    # Distribution (module docstring): torchrun distributes training only when ddp or fsdp is set.
    ddp: bool = False
    fsdp: bool = False
    dist_timeout_s: int = 600  # collective timeout of the process group
    fsdp_param_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None  # all-gather dtype; None: as stored
    fsdp_reduce_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None  # gradient reduce dtype
    fsdp_reshard_after_forward: bool = True  # free gathered parameters after forward (False: ZeRO-2 style)
    fsdp_cpu_offload: bool = False  # parameters, gradients, optimizer state in host memory (CUDA compute)
    fsdp_shard_size: Optional[int] = None  # HSDP: shard within groups of this size, replicate across them
    callbacks: DictConfig = attrs.field(factory=_empty_dict)
    checkpointer: CheckpointerConfig = attrs.field(factory=CheckpointerConfig)


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


def default_optimizer() -> DictConfig:
    return LazyCall("torch.optim.Adam")(lr=1e-3, betas=[0.9, 0.999], eps=1e-8)


@config_class
class BaseModelConfig(StrictConfig):
    """What a method builds: networks, optimizers, EMA, precision, sampling defaults."""

    net: Optional[DictConfig] = None  # LazyCall of the network (backbone + noise schedule)
    net_optimizer: DictConfig = attrs.field(factory=default_optimizer)
    net_scheduler: Optional[DictConfig] = None  # LazyCall of an LR scheduler taking `optimizer`
    input_shape: list[int] = attrs.field(factory=lambda: [1, 8, 8])
    num_classes: int = 0  # 0: unconditional
    # True (one EMA network named "ema") or the EMA networks' names; W&B samples come from the first one.
    use_ema: Union[bool, list[str]] = False
    precision: Literal["float32", "bfloat16", "float16"] = "float32"
    precision_amp: Optional[Literal["bfloat16", "float16"]] = None  # autocast dtype of training / validation steps
    precision_amp_infer: Optional[Literal["bfloat16", "float16"]] = None  # autocast dtype of sampling
    sample_steps: int = 18  # deterministic Heun steps for sampling (2*steps-1 network evaluations)
    guidance_scale: Optional[float] = None
    meta_init: bool = False
    activation_checkpointing: bool = False  # recompute each trained block's activations in backward
    torch_compile_mode: Optional[str] = None
    pretrained_model_path: Optional[str] = None
    net_adapter: Optional[DictConfig] = None  # LoRA: LazyCall of fastgen.utils.lora_utils.LoRAAdapter
    # Latent models: batches hold pixels ("real", 3 channels in [-1, 1]) and / or caption strings ("condition"),
    # encoded each step by the pretrained_model_path folder's VAE and text encoders (fastgen.networks.codecs)
    encode_batches: bool = False
    # Multimodal models (fastgen.networks.modalities; SFT and DMD2): each modality's sample shape, e.g.
    # {"video": [1, 8, 8, 16], "audio": [1, 8, 32]}; batches then hold a dict of modalities in "real" and samples
    # are dicts (input_shape is not used)
    modality_shapes: Optional[dict[str, list[int]]] = None
    # the training times of a multimodal model: one draw shared by the modalities, or one per modality
    modality_times: Literal["shared", "independent"] = "shared"
    # each modality's weight in the summed loss (a missing modality weighs 1)
    modality_loss_weights: Optional[dict[str, float]] = None
    # each modality's classifier-free guidance scale where it differs from guidance_scale (a missing modality takes
    # guidance_scale), wherever a multimodal model is guided: the teacher's score (DMD2), sampling (Heun, `sample
    # --prompt`) and the diffusers export - e.g. LTX-2's pipeline guides video with 3, audio with {"audio": 7.0}
    modality_guidance_scales: Optional[dict[str, float]] = None
    # LTX2Pipeline's guidance beyond classifier-free guidance, wherever a multimodal model is guided as above
    # (fastgen.methods.multimodal.PipelineGuidance; only a network with guidance passes, LTX-2, takes them). Each is a
    # float for every modality or a {modality: value} dict (a missing modality: off). guidance_rescale: the guided x0
    # mixed with itself rescaled to the conditional x0's std (Lin et al. 2024, Eq. 16; 0: off, at most 1);
    # stg_scale: spatio-temporal guidance, + s (x0_cond - x0 with the self-attention of stg_blocks skipped)
    # (arXiv 2411.18664; 0: off); modality_isolation_scale: + (s - 1) (x0_cond - x0 without the audio-video
    # cross-attention) (1: off). LTX2Pipeline's defaults: 0.7, 1 at blocks [28] (LTX-2.3), 3
    guidance_rescale: Union[float, dict[str, float]] = 0.0
    stg_scale: Union[float, dict[str, float]] = 0.0
    stg_blocks: list[int] = attrs.field(factory=list)
    modality_isolation_scale: Union[float, dict[str, float]] = 1.0
    # Video-to-world (fastgen.networks.conditioning_frames; SFT, DMD2): the first latent frames of every training video
    # given clean to the network, which generates the rest (needs a network with a condition mask, e.g. Cosmos
    # Predict2's Video2World); 0: every frame generated; a list: each step draws one of its counts (the same on every
    # rank), e.g. [1, 2] for continuing an image and a 5-frame clip
    conditioning_frames: Union[int, list[int]] = 0

    @property
    def ema_names(self) -> list[str]:
        if self.use_ema is True:
            return ["ema"]
        if not self.use_ema:
            return []
        return list(self.use_ema)


def _default_model_class() -> DictConfig:
    return LazyCall("fastgen.methods.sft.SFTModel")()


@config_class
class BaseConfig(StrictConfig):
    """A whole run. ``model_class`` is a LazyCall: ``instantiate(config.model_class, config=config.model)``."""

    model: BaseModelConfig = attrs.field(factory=BaseModelConfig)
    model_class: DictConfig = attrs.field(factory=_default_model_class)
    trainer: BaseTrainerConfig = attrs.field(factory=BaseTrainerConfig)
    dataloader_train: Optional[DictConfig] = None
    dataloader_val: Optional[DictConfig] = None
    log_config: LogConfig = attrs.field(factory=LogConfig)
    credentials_dir: str = "./credentials/"
    # Folders put at the front of sys.path before the config's LazyCall targets are imported. Loading a config file
    # from outside the fastgen package records its folder (and the working directory it was loaded from), so a
    # run's config.yaml imports the custom modules it names (an `init --callback` callback, a network of your own)
    # wherever it is loaded from.
    import_paths: list[str] = attrs.field(factory=list)


__all__ = [
    "BaseConfig",
    "BaseModelConfig",
    "BaseTrainerConfig",
    "CheckpointerConfig",
    "LogConfig",
]
