"""Parallelize a method's networks by role, and move full (unsharded) state in and out of them.

``parallelize(model, trainer_config, mesh)`` runs once, after the networks are built and (on a fresh run) their
initial weights are loaded, and before the optimizers exist:

* ``trainer.ddp``: every *trained* module (``model.trainable_modules``: the student, a fake score, a
  discriminator ...) is replicated with torch's composable ``replicate`` (DDP's reducer behind forward hooks). The
  module keeps its class and its state-dict keys - no ``module.`` prefix - so checkpoints, callbacks and sampling
  do not know it is replicated. Frozen modules (a teacher) and EMA copies stay plain: they are identical on every
  rank by construction.
* ``trainer.fsdp``: every module - trained, frozen teacher, EMA copies - is sharded with FSDP2 ``fully_shard``:
  first each shard unit the network declares (``shard_units()``, e.g. a U-Net's residual blocks), then the module
  itself (Zhao et al. 2023, "PyTorch FSDP", Sec. 3.1: one flat unit per block bounds the peak of unsharded
  parameters by the largest block). An EMA network has the same structure as ``net`` and is sharded the same way,
  so its local shards are laid out exactly like the network's and the EMA update stays a local ``lerp``. The
  fields ``trainer.fsdp_param_dtype`` / ``fsdp_reduce_dtype`` (mixed precision), ``fsdp_reshard_after_forward``,
  ``fsdp_cpu_offload`` and ``fsdp_shard_size`` (hybrid sharding on a 2-D ``replicate x shard`` mesh) are passed
  to ``fully_shard``.

Gradient synchronisation is decided per iteration by ``set_gradient_sync``: a module's gradients are reduced only
in the last accumulation round of an iteration in which its optimizer steps. GAN-style methods alternate which
modules train; a module that is not stepped never enters the reducer, so DDP never waits for gradients that are
not coming and FSDP2 never reduce-scatters them.

Full state: ``full_state_dict`` / ``load_full_state_dict`` (and the optimizer twins) go through
``torch.distributed.checkpoint.state_dict``, so one code path serves plain, replicated and sharded modules: a
monolithic checkpoint holds full tensors keyed by parameter name whatever the layout that wrote it, and loads into
any layout.
"""

from __future__ import annotations

import functools

from typing import Any

import torch
from torch import nn

from fastgen.utils.dtypes import FLOAT_DTYPES
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)



def distributed_mode(trainer_config: Any) -> str | None:
    """``"fsdp"``, ``"ddp"`` or ``None`` for the config's trainer section."""
    if trainer_config.fsdp:
        return "fsdp"
    if trainer_config.ddp:
        return "ddp"
    return None


def shard_units(module: nn.Module) -> list[nn.Module]:
    """The blocks a network asks FSDP to shard one by one (``module.shard_units()``), or none."""
    declared = getattr(module, "shard_units", None)
    return list(declared()) if callable(declared) else []


def named_networks(model: nn.Module) -> dict[str, nn.Module]:
    """Every network of a method by name: ``model_dict`` (what checkpoints hold) and any other child module with
    parameters (e.g. TCM's frozen stage-1 network)."""
    networks = dict(model.model_dict)
    held = {id(m) for m in networks.values()}
    for name, child in model.named_children():
        if name == "ema_nets" or id(child) in held:
            continue
        if any(True for _ in child.parameters()):
            networks[name] = child
    return networks


def apply_activation_checkpointing(model: nn.Module) -> int:
    """``model.activation_checkpointing``: every shard unit of every *trained* network keeps only its input during
    forward and recomputes its activations in backward (Chen et al. 2016, "Training Deep Nets with Sublinear
    Memory Cost", Sec. 3: memory for the stored activations drops from the sum over blocks to the block inputs
    plus one block's activations, for about one extra forward pass of compute). Discriminator heads are not
    checkpointed.

    torch's composable ``checkpoint`` (non-reentrant, random state preserved, so a recomputed dropout draws what
    the forward drew) hooks the module in place: parameter names and state-dict keys do not change, so
    checkpoints are the same with or without it, and ``fully_shard`` / ``replicate`` compose on top (applied
    first, as torchtitan does). Frozen networks (a teacher, EMA copies) run without gradients and store nothing,
    so they are left alone. Idempotent; returns the number of blocks checkpointed now."""
    config = getattr(model, "config", None)
    if not getattr(config, "activation_checkpointing", False):
        return 0
    from torch.distributed._composable import checkpoint

    count = 0
    for name, network in getattr(model, "trainable_modules", {}).items():
        if not hasattr(network, "backbone"):
            # a discriminator: its heads are one small conv each, nothing worth recomputing - and a head called on
            # generated and on real features before one backward recomputed the wrong call's shapes (DMD2 + GAN)
            continue
        units = shard_units(network)
        if not units:
            from fastgen.utils.errors import ConfigError

            raise ConfigError(f"model.activation_checkpointing=True: the trained network {name!r} "
                              f"({type(network).__name__}) lists no blocks (shard_units) to checkpoint")
        for unit in units:
            if not getattr(unit, "_fastgen_checkpointed", False):
                checkpoint(unit)
                unit._fastgen_checkpointed = True
                count += 1
    if count:
        logger.debug("activation checkpointing on %d blocks", count)
    return count


def apply_compile(model: nn.Module) -> int:
    """``model.torch_compile_mode``: compile every trained network with ``torch.compile`` in that mode, block by
    block (its ``shard_units()``; the whole network when it lists none), as torchtitan does: a block's graph is
    compiled once and reused by every block of the same shape, and the parameters, names and checkpoints do not
    change (``nn.Module.compile`` compiles the module's call in place, no ``_orig_mod.`` prefix). Shapes are
    static (``dynamic=False``): a batch size compiles once, a new one (validation, sampling) compiles again rather
    than into a symbolic-shape graph, which inductor fails on for some of our blocks on CPU. Frozen networks
    (teachers, EMA copies) run eagerly. Compilation happens at the first call; a failure there is reported by the
    trainer in one line naming the field. Returns the number of modules compiled."""
    config = getattr(model, "config", None)
    mode = getattr(config, "torch_compile_mode", None)
    if mode is None:
        return 0
    count = 0
    for network in getattr(model, "trainable_modules", {}).values():
        for module in shard_units(network) or [network]:
            module.compile(mode=mode, dynamic=False)  # shapes are fixed by the batch: no symbolic-shape graphs
            count += 1
    logger.debug("torch.compile (mode %s) on %d modules", mode, count)
    return count


def parallelize(model: nn.Module, trainer_config: Any, mesh: Any) -> None:
    """Apply activation checkpointing if the method's config asks for it, then replicate or shard ``model``'s
    networks in place (see the module docstring)."""
    apply_activation_checkpointing(model)
    mode = distributed_mode(trainer_config)
    if mode is None or mesh is None:
        return
    if mode == "fsdp":
        conflict = model.fsdp_conflict() if callable(getattr(model, "fsdp_conflict", None)) else None
        if conflict:
            from fastgen.utils.errors import ConfigError

            raise ConfigError(conflict)
    if mode == "fsdp":  # frozen helpers a method builds later (model.encode_batches' codec) are sharded the same way
        model.__dict__["_shard_frozen"] = functools.partial(shard_frozen, trainer_config=trainer_config, mesh=mesh)
    trained = {id(m) for m in model.trainable_modules.values()}
    for name, module in named_networks(model).items():
        if mode == "fsdp":
            _shard(module, trainer_config, mesh)
            logger.debug("sharded %s with FSDP2 (%d shard units)", name, len(shard_units(module)))
        elif id(module) in trained:
            _replicate(module, mesh)
            logger.debug("replicated %s (DDP)", name)


def _optional_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters ``module`` declares it uses only on request (``optional_parameters()``, e.g. a log-variance head)."""
    declared = getattr(module, "optional_parameters", None)
    return list(declared()) if callable(declared) else []


def _quiet_size_one_stride_warning() -> None:
    """DDP's reducer warns "Grad strides do not match bucket view strides" at every backward for a 1x1
    convolution's weight (shape ``(C, C, 1, 1)``): its gradient comes back with strides ``(C, 1, C, C)``, the bucket
    view has ``(C, 1, 1, 1)``. Strides of size-1 dimensions never address memory, so both lay the same bytes out
    the same way and the copy into the bucket costs what it always costs; the warning is noise in every DDP run of
    the U-Nets. Only that message is filtered; any other stride mismatch still warns."""
    import warnings

    warnings.filterwarnings("ignore", message=r"Grad strides do not match bucket view strides[\s\S]*"
                            r"grad\.sizes\(\) = \[\d+, \d+, 1, 1\]")


def _replicate(module: nn.Module, mesh: Any) -> None:
    from torch.distributed._composable.replicate import replicate

    device = next(module.parameters()).device
    # Buffers are not broadcast every forward: fastgen's networks have no running statistics, and every rank
    # builds and loads identical buffers (RankConsistencyCallback / `fastgen check-ranks` verify it).
    kwargs: dict[str, Any] = {"forward_sync_buffers": False}
    if any(p.requires_grad for p in _optional_parameters(module)):
        # a head the method may not read this step (a log-variance): DDP's reducer would wait for its gradients
        # forever; searching the graph for unused parameters costs one traversal per backward, only here
        kwargs["find_unused_parameters"] = True
    if device.type == "cuda":
        kwargs["device_id"] = device
    replicate(module, **kwargs)
    _quiet_size_one_stride_warning()
    # Build the DDP reducer now, while every parameter still requires a gradient: replicate() would build it
    # lazily at the first forward, and a method may run that forward with the module frozen (a GAN's critic read
    # during the generator's step). Every rank builds it here in the same order, and it broadcasts rank 0's weights.
    replicate.state(module).lazy_init()


def fsdp_kwargs(trainer_config: Any, mesh: Any) -> dict[str, Any]:
    """``fully_shard`` keyword arguments from the ``trainer.fsdp_*`` fields."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": bool(trainer_config.fsdp_reshard_after_forward)}
    param_dtype = FLOAT_DTYPES.get(trainer_config.fsdp_param_dtype) if trainer_config.fsdp_param_dtype else None
    reduce_dtype = FLOAT_DTYPES.get(trainer_config.fsdp_reduce_dtype) if trainer_config.fsdp_reduce_dtype else None
    if param_dtype is not None or reduce_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    if trainer_config.fsdp_cpu_offload:
        if mesh.device_type != "cuda":
            from fastgen.utils.errors import ConfigError

            raise ConfigError("trainer.fsdp_cpu_offload keeps the shards in host memory while a GPU computes; this "
                              f"run computes on {mesh.device_type}, where the shards are in host memory already: "
                              "leave it false")
        kwargs["offload_policy"] = CPUOffloadPolicy()
    return kwargs


def _shard(module: nn.Module, trainer_config: Any, mesh: Any) -> None:
    from torch.distributed.fsdp import fully_shard

    kwargs = fsdp_kwargs(trainer_config, mesh)
    for unit in shard_units(module):
        fully_shard(unit, **kwargs)
    fully_shard(module, **kwargs)


def shard_frozen(module: nn.Module, trainer_config: Any, mesh: Any, methods: tuple[str, ...] = ()) -> None:
    """A frozen helper module (a codec's VAE or text encoder) sharded like a teacher, as one unit; ``methods``
    besides ``forward`` that run it (``vae.encode``) are registered so FSDP gathers its parameters for them too."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    fully_shard(module, **fsdp_kwargs(trainer_config, mesh))
    for name in methods:
        register_fsdp_forward_method(module, name)


def set_gradient_sync(model: nn.Module, stepping: list[str], final_round: bool) -> None:
    """Reduce the gradients of exactly the modules whose optimizers step, and only in the last accumulation round.

    A no-op for modules that are neither replicated nor sharded."""
    for name, module in model.trainable_modules.items():
        setter = getattr(module, "set_requires_gradient_sync", None)
        if setter is not None:
            setter(final_round and name in stepping)


def is_distributed_module(module: nn.Module) -> bool:
    """True for a module that ``replicate`` or ``fully_shard`` manages."""
    return callable(getattr(module, "set_requires_gradient_sync", None))


def has_sharded_parameters(module: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def broadcast_full_weights(model: nn.Module, source: nn.Module | None) -> None:
    """Fill ``model`` - allocated with ``to_empty`` after a meta-device build, plain, replicated-to-be or sharded -
    with the weights of rank 0's real build ``source`` (``None`` on the other ranks): parameters and persistent
    buffers through ``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)``, which sends each
    tensor once and keeps only this rank's shard; buffers outside the state dict (e.g. precomputed frequencies)
    one ``broadcast`` each. Single process: a plain copy."""
    import torch.distributed as dist

    from fastgen.distributed import group as dist_utils

    rank0 = dist_utils.get_rank() == 0
    if rank0 and source is None:
        raise ValueError("rank 0 needs the real build to broadcast from")
    if not dist_utils.is_initialized():
        model.load_state_dict(source.state_dict())
        _copy_extra_buffers(model, source)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    full = source.state_dict() if rank0 else {}
    set_model_state_dict(model, full, options=_options(broadcast_from_rank0=True))
    device = dist_utils.collective_device()
    names = set(model.state_dict())
    for name, buffer in model.named_buffers():
        if name in names:
            continue
        value = dict(source.named_buffers())[name].to(device) if rank0 else torch.empty_like(buffer, device=device)
        dist.broadcast(value, src=0)
        with torch.no_grad():
            buffer.copy_(value)


def _copy_extra_buffers(model: nn.Module, source: nn.Module) -> None:
    names = set(model.state_dict())
    theirs = dict(source.named_buffers())
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name not in names:
                buffer.copy_(theirs[name])


# ---- full state ------------------------------------------------------------------------------------------------------
def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_state_dict(module: nn.Module, copy: bool = False) -> dict[str, torch.Tensor]:
    """The module's full state on CPU (gathered from its shards when sharded: a collective - every rank calls it;
    ranks other than 0 get an empty dict when sharded). A LoRA-adapted network's state is its adapter's only
    (``fastgen.utils.lora_utils``: the frozen base is rebuilt from its source, not saved again). ``copy``: tensors
    that training cannot change afterwards (an asynchronous save) - one host copy, never two."""
    if not has_sharded_parameters(module):
        state = {k: v.detach().to("cpu", copy=copy) for k, v in module.state_dict().items()}
    else:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(module, options=_options(cpu_offload=True))
    return _saved_part(module, state)


def _saved_part(module: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    from fastgen.utils.lora_utils import adapter_state, is_adapted

    return adapter_state(state) if is_adapted(module) else state


def load_full_state_dict(module: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Load full tensors into a plain, replicated or sharded module (each rank keeps its shard). An adapted
    network takes its adapter or its base (``lora_utils.check_loadable``), never a mix."""
    from fastgen.utils.lora_utils import check_loadable, is_adapted

    if is_adapted(module):
        check_loadable(module, state, "the checkpoint")
        strict = False
    if not has_sharded_parameters(module):
        module.load_state_dict(state, strict=strict)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(module, state, options=_options(strict=strict))


def full_optimizer_state_dict(module: nn.Module, optimizer: torch.optim.Optimizer, copy: bool = False) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name (``{"state": {name: ...}, "param_groups": [{"params":
    [name, ...], ...}]}``, torch's distributed format), full tensors on CPU (a collective when sharded);
    ``copy`` as in ``full_state_dict``."""
    if has_sharded_parameters(module):
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(module, optimizer, options=_options(cpu_offload=True))
    names = _parameter_names(module, optimizer)
    plain = optimizer.state_dict()
    state = {names[index]: {k: v.detach().to("cpu", copy=copy) if isinstance(v, torch.Tensor) else v
                            for k, v in value.items()}
             for index, value in plain["state"].items()}
    groups = [{**group, "params": [names[i] for i in group["params"]]} for group in plain["param_groups"]]
    return {"state": state, "param_groups": groups}


def load_full_optimizer_state_dict(module: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a ``full_optimizer_state_dict`` into the optimizer of ``module`` (any layout).

    The parameter names of its groups must be the optimizer's; a parameter may lack state (Adam creates it at the
    first gradient, so a parameter that never had one - e.g. an unused head - has none, as in a plain
    ``optimizer.state_dict()``). Raises ``ValueError`` when the names differ. Into a plain or replicated module the
    state goes through ``optimizer.load_state_dict`` unchanged (no placeholder state is created, so a resumed run
    stays bit-identical)."""
    names = _parameter_names(module, optimizer)
    expected = [[names[i] for i in group["params"]] for group in optimizer.state_dict()["param_groups"]]
    saved = [list(group.get("params", [])) for group in state.get("param_groups", [])]
    if [sorted(g) for g in saved] != [sorted(g) for g in expected]:
        missing = sorted(set().union(*map(set, expected)) - set().union(*map(set, saved)))[:3]
        extra = sorted(set().union(*map(set, saved)) - set().union(*map(set, expected)))[:3]
        raise ValueError(f"the optimizer state is for other parameters (missing {missing or 'none'}, unexpected "
                         f"{extra or 'none'})")
    if has_sharded_parameters(module):
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(module, optimizer, state, options=_options(strict=False))
        return
    index = {name: i for i, name in names.items()}
    optimizer.load_state_dict({
        "state": {index[name]: value for name, value in state["state"].items()},
        "param_groups": [{**group, "params": [index[n] for n in group_names]}
                         for group, group_names in zip(state["param_groups"], expected)],
    })


def _parameter_names(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """``{index in optimizer.state_dict(): parameter name in module}``."""
    by_id = {id(p): name for name, p in module.named_parameters()}
    flat = [p for group in optimizer.param_groups for p in group["params"]]
    missing = [i for i, p in enumerate(flat) if id(p) not in by_id]
    if missing:
        raise ValueError(f"the optimizer holds {len(missing)} parameter(s) that are not in its module")
    return {i: by_id[id(p)] for i, p in enumerate(flat)}
