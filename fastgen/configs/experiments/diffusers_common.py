"""What the recipes for real diffusers-backed models share (``Flux/``, ``Wan/``, ``SD/``, ``QwenImage/``): DMD2
distillation of a pretrained text-to-image / text-to-video model into a few-step student, sharded with FSDP2 on a
meta-device build, in bfloat16 autocast with activation checkpointing.

* **Weights**: ``model.pretrained_model_path`` - the model's diffusers folder (the pipeline folder with its
  ``transformer/`` or ``unet/``, or that subfolder), by default ``$DATA_ROOT_DIR/weights/<name>``. The teacher is
  read from it; student and fake score start as copies (DMD Sec. 3.2). A missing folder is a one-line error
  naming the field when training starts (``fastgen dryrun`` needs no weights).
* **Data**: WebDataset shards of precomputed latents and text embeddings, ``$DATA_ROOT_DIR/<name>_latents``,
  each sample a ``latent.npy`` (the model's VAE latent) and a ``text.npy`` (the text encoder's token embeddings;
  for Flux, ``pack_flux_condition`` layout; for Qwen-Image, zero past each prompt's tokens). Override with
  ``- dataloader_train.datatags=[WDS:/path]``.
* **Prompts for labels**: ``num_classes`` prompts pre-encoded into ``$DATA_ROOT_DIR/<name>_prompts.safetensors``,
  one ``(num_classes, tokens, width)`` tensor (``fastgen.networks.diffusers_nets``: a label picks a prompt), for
  ``fastgen sample`` and the null condition of guidance. The W&B callback logs 8 samples decoded by the folder's
  VAE; ``fastgen sample RUN --prompt "..."`` samples from prompts and ``fastgen convert-ckpt RUN OUT --to
  diffusers`` exports the student as a diffusers pipeline.

No GPU was available to this project when these recipes were written: their memory figures are ``fastgen
dryrun`` estimates, not measurements.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig

from fastgen.configs.callbacks import GradClip_CALLBACK, WANDB_CALLBACK
from fastgen.configs.config import BaseConfig
from fastgen.configs.data import data_root, webdataset_loader
from fastgen.configs.methods.config_dmd2 import create_config as dmd2_config


def prompts_path(name: str) -> str:
    return os.path.join(data_root(), f"{name}_prompts.safetensors")


def large_model_setting(config: BaseConfig, name: str, net: DictConfig, input_shape: list[int], num_prompts: int,
                        batch_size: int = 1) -> BaseConfig:
    """What every recipe of a pretrained diffusers model sets, whatever its method: the network, its weights folder
    and prompt labels, FSDP2 on a meta-device build, bfloat16 autocast with activation checkpointing, the shards of
    ``$DATA_ROOT_DIR/<name>_latents``, W&B with 8 decoded samples."""
    config.model.net = net
    config.model.input_shape = list(input_shape)
    config.model.num_classes = num_prompts
    config.model.pretrained_model_path = os.path.join(data_root(), "weights", name)
    config.model.meta_init = True
    config.model.activation_checkpointing = True
    config.model.precision_amp = "bfloat16"
    config.model.precision_amp_infer = "bfloat16"
    config.trainer.fsdp = True
    config.trainer.logging_iter = 10
    config.trainer.save_ckpt_iter = 500
    config.trainer.max_iter = 10000
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **WANDB_CALLBACK})
    config.trainer.callbacks.wandb.num_samples = 8  # decoded by the weights folder's VAE
    config.dataloader_train = webdataset_loader([f"WDS:{os.path.join(data_root(), name + '_latents')}"],
                                                batch_size=batch_size, fields={"real": "latent.npy", "condition": "text.npy"})
    config.log_config.group = name
    return config


def diffusers_dmd2_setting(name: str, net: DictConfig, input_shape: list[int], num_prompts: int,
                           batch_size: int = 1) -> BaseConfig:
    """A DMD2 config for the pretrained diffusers model ``name`` with network ``net`` (its teacher, student and
    fake score). Settings from DMD2's text-to-image recipe (Yin et al. 2024, Sec. 5.3 / App. C): Adam at lr 5e-7
    (student) and the same for the fake score, five fake-score updates per student update, no GAN branch (it
    needs real images' latents through the discriminator - turn it on with ``model.gan_loss_weight_gen``),
    guidance baked into the teacher's score (``model.guidance_scale``)."""
    config = large_model_setting(dmd2_config(), name, net, input_shape, num_prompts, batch_size)
    config.model.guidance_scale = 3.5
    config.model.student_update_freq = 5
    config.model.net_optimizer.lr = 5e-7
    config.model.fake_score_optimizer.lr = 5e-7
    return config
