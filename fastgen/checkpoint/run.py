"""Loading a run: the one way every command gets from a checkpoint source to a model with its weights.

``load_run(source)`` walks straight down: the source (a checkpoint, a checkpoints folder or a run directory, local
or ``s3://``) is resolved to one checkpoint and its run's ``config.yaml`` (``fastgen.checkpoint.source``), the
method is built as training built it (``instantiate(config.model_class, config=config.model)``), the checkpoint is
read through its store and format (``read_resolved``: the safe unpickler, either layout) and every network it holds
is loaded strictly. Frozen networks the checkpoint leaves out (a teacher) are rebuilt from their source only when
asked for (``select_net(run, "teacher")``) and checked against the checkpoint's fingerprint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fastgen.utils.errors import CheckpointError, UsageError

NETS = ("net", "ema", "teacher")


@dataclass
class LoadedRun:
    """A method rebuilt from a run: the model (eval mode, on ``device``), its config, where it came from."""

    model: Any
    config: Any
    checkpoint: str  # a local path or an s3:// URL
    config_path: Path | None
    iteration: int
    loaded: set[str]  # names of the modules whose weights came from the checkpoint
    frozen_fingerprints: dict[str, str] = field(default_factory=dict)  # the checkpoint's record of its teacher

    def rebuild_frozen(self) -> None:
        """Load the frozen networks the checkpoint left out (a teacher) from their source, as training did, and
        check them against the checkpoint's fingerprints. Only on demand (``select_net(..., "teacher")``): the
        source may not be reachable from where the trained network is sampled."""
        from fastgen.distributed.fingerprint import network_fingerprint

        model = self.model
        missing = [name for name in getattr(model, "rebuilt_modules", {}) if name not in self.loaded]
        if not missing:
            return
        from fastgen.checkpoint.manager import rebuild_frozen

        rebuild_frozen(model, self.config.trainer.checkpointer.pretrained_ckpt_path, self.config.credentials_dir)
        device = next(model.net.parameters()).device
        for name in missing:
            model.model_dict[name].to(device)
            saved = self.frozen_fingerprints.get(name)
            if saved is not None and network_fingerprint(model.model_dict[name]) != saved:
                raise CheckpointError(f"the {name} rebuilt from {model.frozen_source(name)} is not the one checkpoint "
                                      f"{self.checkpoint} was trained with (its fingerprint differs)")
            self.loaded.add(name)

    @property
    def run_dir(self) -> Path:
        """Where outputs about the run go by default: its (local) run directory; for a bare S3 checkpoint, the
        working directory."""
        if self.config_path is not None:
            return self.config_path.parent
        return Path.cwd() if self.checkpoint.startswith("s3://") else Path(self.checkpoint).parent


def load_model_weights(model: Any, payload: dict[str, Any], path: str | Path) -> set[str]:
    """Load each module of ``payload["model"]`` into ``model.model_dict`` strictly; return the loaded names."""
    from fastgen.distributed.parallelize import load_full_state_dict

    modules = model.model_dict
    loaded = set()
    for name, state in payload.get("model", {}).items():
        if name not in modules:
            raise CheckpointError(f"checkpoint {path} has weights for {name!r}, which this model does not have")
        try:
            load_full_state_dict(modules[name], state)  # strict; an adapted network takes its adapter
        except RuntimeError as exc:
            first = " ".join(str(exc).strip().splitlines()[:2])[:300]
            raise CheckpointError(f"checkpoint {path}: weights of {name!r} do not fit this model ({first})") from None
        loaded.add(name)
    return loaded


def load_run(path: str | os.PathLike[str], config: Any = None, device: torch.device | str = "cpu",
             credentials_dir: str | None = None) -> LoadedRun:
    """Rebuild the method of a run and load a checkpoint into it.

    ``config``: a ``BaseConfig`` or anything ``load_config`` accepts; default the run's ``config.yaml``.
    ``path``: a checkpoint, checkpoints folder or run directory, local or ``s3://`` (``resolve_checkpoint``)."""
    from fastgen.checkpoint.source import read_resolved, resolve_checkpoint
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.instantiate import instantiate

    resolved = resolve_checkpoint(path, credentials_dir)
    checkpoint, config_yaml = resolved.checkpoint, resolved.config_yaml
    if config is None:
        if config_yaml is None:
            where = ("an S3 prefix holds no config.yaml" if resolved.is_s3
                     else f"looked in {Path(checkpoint).parent} and its parent")
            raise UsageError(f"no config.yaml for {checkpoint} ({where}); pass --config (the run's config.yaml "
                             "or its recipe)")
        config = load_config(config_yaml)
    elif not hasattr(config, "model_class"):
        config = load_config(config)
    config.model.meta_init = False  # real tensors: the checkpoint overwrites them at once
    payload = read_resolved(resolved)
    model = instantiate(config.model_class, config=config.model)
    from fastgen.utils.lora_utils import is_adapted

    if is_adapted(model.net):  # its checkpoints hold the adapter: the base comes from where training took it
        from fastgen.checkpoint.manager import load_pretrained

        model.init_weights()
        load_pretrained(model, config.trainer.checkpointer.pretrained_ckpt_path, config.credentials_dir)
    loaded = load_model_weights(model, payload, checkpoint)
    model.to(device)
    model.eval()
    return LoadedRun(model, config, checkpoint, config_yaml, int(payload.get("iteration", 0)), loaded,
                     dict(payload.get("frozen_fingerprints") or {}))


def select_net(run_or_model: Any, which: str = "net") -> nn.Module:
    """The network to sample: ``net`` (the trained one), ``ema`` (the first EMA copy) or ``teacher``.

    Given a ``LoadedRun``, also checks that the chosen network's weights came from the checkpoint."""
    model = run_or_model.model if isinstance(run_or_model, LoadedRun) else run_or_model
    loaded = run_or_model.loaded if isinstance(run_or_model, LoadedRun) else None
    name = which
    if which == "net":
        net = model.net
    elif which == "ema":
        emas = getattr(model, "ema_nets", {})
        if not len(emas):
            raise UsageError(f"--ema: this {type(model).__name__} has no EMA network (model.use_ema is off)")
        name = next(iter(emas.keys()))
        net = emas[name]
    elif which == "teacher":
        net = getattr(model, "teacher", None)
        if net is None:
            raise UsageError(f"--teacher: {type(model).__name__} has no teacher (only distillation methods have one)")
    else:
        raise UsageError(f"unknown network {which!r}; choose one of {', '.join(NETS)}")
    if loaded is not None and name in getattr(model, "rebuilt_modules", {}) and name not in loaded:
        run_or_model.rebuild_frozen()
    if loaded is not None and name in model.model_dict and name not in loaded:
        raise CheckpointError(f"checkpoint {run_or_model.checkpoint} has no weights for {name!r}")
    return net
