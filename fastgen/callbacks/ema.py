"""EMACallback: exponential moving averages of the trained network.

After every optimizer step, ``ema <- beta * ema + (1 - beta) * net`` for every parameter (buffers are copied),
written as ``lerp(ema, net, 1 - beta)`` (the same update). ``beta`` follows one of three schedules:

* ``constant`` - ``beta`` as given.
* ``power`` - EDM2's power-function EMA: ``beta_t = (1 - 1/t)^(gamma + 1)`` at update ``t`` (Karras et al. 2024,
  "Analyzing and Improving the Training Dynamics of Diffusion Models", Eq. 3). Its averaging profile has the
  relative standard deviation ``sigma_rel = (gamma + 1)^(1/2) / ((gamma + 2) (gamma + 3)^(1/2))`` (ibid., Sec. 3.1;
  appendix Eq. 123): ``gamma = 6.94`` gives ``sigma_rel ~ 0.10``, ``gamma = 16.97`` gives ``0.05``. The
  width can be given either way: ``sigma_rel`` (what EDM2 reports) is converted to ``gamma`` by
  :func:`gamma_from_sigma_rel`.
* ``halflife`` - EDM's schedule: ``beta = 0.5^(B / max(h, 1e-8))`` with ``B`` the *global* batch size and half-life
  ``h = halflife_kimg * 1000`` images, ramped up as ``h = min(h, n_img * rampup_ratio)`` where ``n_img`` is
  the number of images seen (Karras et al. 2022, training loop; Appendix F.1).

Before ``start_iter`` the EMA copies the network (``beta = 0``). Several EMAs can run at once, each a
callback with its own ``ema_name`` matching a name in ``model.use_ema``. Logged keys: ``ema/<name>_beta``.

The EMA moves only when the network does: iterations in which the ``net`` optimizer did not step (a GAN-style
method training its critic, or a step skipped for a non-finite gradient) leave it alone, and the schedules'
``t`` counts the network's updates, so a DMD2 student updated every fifth iteration gets the same averaging
profile per update as a network updated every iteration.

**Flat layout** (``flat=True``, the default). The update reads two copies of the weights and writes one, so its
floor is memory bandwidth; what it costs beyond that is per-tensor overhead (a U-Net has hundreds of parameter
tensors, and ``torch._foreach_lerp_`` on CPU is a loop over them). So at ``on_model_init_end`` - before the
optimizers exist - the parameters of the online network and of the EMA network are moved into one contiguous
buffer per (dtype, device): each ``nn.Parameter`` stays the same object, only its ``.data`` becomes a view into
the buffer (segments start 512 bytes apart, so each view is as aligned as a separately allocated tensor: kernels,
and so training numerics, do not change). The update is then one ``lerp_`` per buffer. Views survive
``load_state_dict`` (it copies in place) and several EMA callbacks share the online network's buffer. Whatever
cannot be laid out flat - DTensor/FSDP shards, non-contiguous (e.g. channels-last) or sparse tensors, a group
whose EMA copies differ in dtype or device - is updated with the fused ``torch._foreach_lerp_`` as before. Both
paths run the same elementwise lerp arithmetic, so they give bit-identical results
(``tests/callbacks/test_ema_flat.py``: float32, float64, bfloat16 on CPU, and whole training runs).

Before each update the callback checks (~0.2 us per parameter) that every parameter registered in the two networks
still has its data in the buffer; after ``.to()``, ``load_state_dict(assign=True)`` or ``p.data = ...`` it lays
the buffers out again (logged), and after repeated re-layouts it falls back to ``_foreach_lerp_`` for good.
Set ``flat=False`` to leave the networks' storage alone (always ``_foreach_lerp_``).

On CPU a float32/float64 buffer is updated with the weight as a 0-dim tensor: ATen's tensor-weight lerp kernel is
measurably faster there than its scalar-weight kernel (``benchmarks/ema.py``) and bit-identical to it.

Checkpoints: the online and EMA networks' ``state_dict`` tensors are views into one storage per buffer;
``torch.save`` writes that storage once. A writer that refuses shared storage (safetensors) must ``clone()``.
"""

from __future__ import annotations

import operator
from typing import Any, Literal, NamedTuple

import torch
from torch import nn

from fastgen.callbacks.callback import Callback
from fastgen.utils.errors import ConfigError
from fastgen.utils.logging import get_logger
from fastgen.utils.posthoc_ema import gamma_from_sigma_rel

logger = get_logger(__name__)

# Segment alignment inside a flat buffer: the CUDA caching allocator's block rounding (a multiple of the CPU
# allocator's 64 bytes), so a parameter view is aligned as a separately allocated tensor would be.
_ALIGN_BYTES = 512
# Re-layouts tolerated before the flat path is given up (something keeps replacing parameter storage).
_MAX_RELAYOUTS = 3
DEFAULT_GAMMA = 6.94  # the power EMA's default exponent: sigma_rel ~ 0.10 (EDM2's wider profile)




def ema_beta(kind: str, iteration: int, *, beta: float = 0.999, gamma: float = DEFAULT_GAMMA,
             halflife_kimg: float = 500.0, rampup_ratio: float | None = 0.05, batch_size: int = 1) -> float:
    """The decay ``beta`` after ``iteration`` completed optimizer steps (see the module docstring)."""
    if kind == "constant":
        return float(beta)
    if kind == "power":
        t = max(iteration, 1)
        return (1.0 - 1.0 / t) ** (gamma + 1.0)
    if kind == "halflife":
        halflife_nimg = halflife_kimg * 1000.0
        if rampup_ratio is not None:
            halflife_nimg = min(halflife_nimg, iteration * batch_size * rampup_ratio)
        return 0.5 ** (batch_size / max(halflife_nimg, 1e-8))
    raise ValueError(f"unknown EMA type {kind!r}; use 'constant', 'power' or 'halflife'")


# ---- flat buffers -----------------------------------------------------------------------------------------------
def _flat_eligible(t: torch.Tensor) -> bool:
    """A plain dense contiguous tensor with real storage (not a DTensor shard, sparse, meta or quantized)."""
    return (type(t) is torch.Tensor and t.layout == torch.strided and t.is_contiguous()
            and t.device.type != "meta" and not t.is_quantized)


def _segments(numels: list[int], itemsize: int) -> tuple[list[int], int]:
    """Element offsets of consecutive segments, each starting on an ``_ALIGN_BYTES`` boundary; total length."""
    step = max(_ALIGN_BYTES // itemsize, 1)
    offsets, end = [], 0
    for n in numels:
        offsets.append(end)
        end += -(-n // step) * step
    return offsets, end


def _existing_flat(tensors: list[torch.Tensor], offsets: list[int], total: int) -> torch.Tensor | None:
    """The flat buffer ``tensors`` already live in, if they sit at exactly ``offsets`` of one storage of exactly
    ``total`` elements (so the buffer holds nothing else); else ``None``."""
    first = tensors[0]
    storage = first.untyped_storage()
    if storage.nbytes() != total * first.element_size():
        return None
    base = storage.data_ptr()
    for t, offset in zip(tensors, offsets):
        if t.untyped_storage().data_ptr() != base or t.storage_offset() != offset or not t.is_contiguous():
            return None
    return first.as_strided((total,), (1,), 0)


def flatten_parameters_(params: list[nn.Parameter]) -> torch.Tensor:
    """Make ``params`` (one dtype and device, ``_flat_eligible`` data) views into one new contiguous buffer and
    return it; values are kept and each ``nn.Parameter`` stays the same object (optimizers, hooks and caches of
    the parameter objects are unaffected). When they already live in such a buffer, return it and change nothing.
    """
    data = [p.data for p in params]
    offsets, total = _segments([d.numel() for d in data], data[0].element_size())
    flat = _existing_flat(data, offsets, total)
    if flat is not None:
        return flat
    flat = torch.zeros(total, dtype=data[0].dtype, device=data[0].device)
    for p, d, offset in zip(params, data, offsets):
        view = flat[offset:offset + d.numel()].view(d.shape)
        view.copy_(d)
        p.data = view
    return flat


def _local_tensors(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors this rank stores: FSDP2 shards (DTensors) as their local shards. The EMA network is sharded
    exactly like ``net`` (``fastgen.distributed.parallelize``), so the two local shards line up element for element and
    the update needs no communication - also for uneven shards, which are equally uneven in both."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed support
        return tensors
    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]


class _FlatGroup(NamedTuple):
    dst: torch.Tensor  # the EMA network's buffer
    src: torch.Tensor  # the online network's buffer
    tensor_weight: bool  # pass the lerp weight as a 0-dim tensor (see the module docstring)


class _Plan(NamedTuple):
    net: nn.Module
    ema: nn.Module
    groups: list[_FlatGroup]
    rest_dst: list[torch.Tensor]  # parameters updated with _foreach_lerp_ (the parameter objects themselves)
    rest_src: list[torch.Tensor]
    dst_buffers: list[torch.Tensor]
    src_buffers: list[torch.Tensor]
    # What the plan relies on (slots are (a module's _parameters or _buffers dict, name) pairs): the parameter
    # registered at each flat slot has its data where the plan put it in the buffer, and each other slot still
    # holds the very tensor object the plan uses (those are read through the object, so its .data may change).
    flat_owners: list[dict[str, Any]]
    flat_names: list[str]
    pointers: list[int]
    owners: list[dict[str, Any]]
    names: list[str]
    tensors: list[torch.Tensor]


def _slots(module: nn.Module, kind: str) -> list[tuple[dict[str, Any], str, torch.Tensor]]:
    """Where each tensor of ``module.parameters()`` (``kind="_parameters"``) or ``module.buffers()``
    (``"_buffers"``) is registered, in that order, each tensor once."""
    seen: set[int] = set()
    slots = []
    for sub in module.modules():
        owner = getattr(sub, kind)
        for name, tensor in owner.items():
            if tensor is not None and id(tensor) not in seen:
                seen.add(id(tensor))
                slots.append((owner, name, tensor))
    return slots


def _still_valid(plan: _Plan) -> bool:
    """Checked before every update; ``map`` over C functions keeps it at ~0.2 us per tensor."""
    try:
        pointers = list(map(torch.Tensor.data_ptr, map(dict.get, plan.flat_owners, plan.flat_names)))
    except TypeError:  # a parameter was deleted
        return False
    return pointers == plan.pointers and all(map(operator.is_, map(dict.get, plan.owners, plan.names), plan.tensors))


def _build_plan(net: nn.Module, ema: nn.Module, flat: bool) -> _Plan:
    src_slots, dst_slots = _slots(net, "_parameters"), _slots(ema, "_parameters")
    src_p, dst_p = [t for _, _, t in src_slots], [t for _, _, t in dst_slots]
    if len(src_p) != len(dst_p) or any(s.shape != d.shape for s, d in zip(src_p, dst_p)):
        raise ValueError("the EMA network's parameters do not match the online network's (count or shapes differ)")
    groups: list[_FlatGroup] = []
    rest: list[int] = []
    # Group the online network's parameters by (dtype, device) - a function of the online network alone, so every
    # EMA callback computes the same groups and they share one buffer per group.
    by_key: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, p in enumerate(src_p):
        if flat and _flat_eligible(p.data):
            by_key.setdefault((p.dtype, p.device), []).append(i)
        else:
            rest.append(i)
    flat_idx: list[int] = []
    for (dtype, device), idx in by_key.items():
        pairs_ok = all(_flat_eligible(dst_p[i].data) and dst_p[i].dtype == dtype and dst_p[i].device == device
                       for i in idx)
        if not pairs_ok:
            rest += idx
            continue
        src_flat = flatten_parameters_([src_p[i] for i in idx])
        dst_flat = flatten_parameters_([dst_p[i] for i in idx])
        tensor_weight = device.type == "cpu" and dtype in (torch.float32, torch.float64)
        groups.append(_FlatGroup(dst_flat, src_flat, tensor_weight))
        flat_idx += idx
    src_b, dst_b = _slots(net, "_buffers"), _slots(ema, "_buffers")
    if len(src_b) != len(dst_b):
        raise ValueError("the EMA network's buffers do not match the online network's")
    rest.sort()
    flat_slots = [src_slots[i] for i in flat_idx] + [dst_slots[i] for i in flat_idx]
    other_slots = [src_slots[i] for i in rest] + [dst_slots[i] for i in rest] + src_b + dst_b
    return _Plan(net, ema, groups, [dst_p[i] for i in rest], [src_p[i] for i in rest],
                 [t for _, _, t in dst_b], [t for _, _, t in src_b],
                 flat_owners=[o for o, _, _ in flat_slots], flat_names=[n for _, n, _ in flat_slots],
                 pointers=[t.data_ptr() for _, _, t in flat_slots],
                 owners=[o for o, _, _ in other_slots], names=[n for _, n, _ in other_slots],
                 tensors=[t for _, _, t in other_slots])


class EMACallback(Callback):
    """EMA of ``model.net`` into ``model.ema_nets[ema_name]`` after every optimizer step.

    ``type``/``beta``/``gamma``/``halflife_kimg``/``rampup_ratio`` pick the schedule, ``start_iter`` the step up to
    which the EMA copies the network, ``flat`` the flat-buffer layout (see the module docstring). The power EMA's
    width is ``gamma`` (default 6.94, ``sigma_rel ~ 0.10``) or ``sigma_rel`` (EDM2's parameter), not both.
    ``snapshot_iter`` (power EMAs): every that many network updates, write the EMA to ``RUN/ema_snapshots/`` so
    that ``fastgen ema RUN --sigma-rel S`` can reconstruct an EMA of any width afterwards (EDM2's post-hoc EMA,
    ``fastgen.utils.posthoc_ema``; the preset ``POSTHOC_EMA_CALLBACKS`` keeps EDM2's pair, 0.05 and 0.10).
    """

    def __init__(self, ema_name: str = "ema", type: Literal["constant", "power", "halflife"] = "constant",  # noqa: A002
                 beta: float = 0.999, gamma: float | None = None, halflife_kimg: float = 500.0,
                 rampup_ratio: float | None = 0.05, start_iter: int = 0, flat: bool = True,
                 sigma_rel: float | None = None, snapshot_iter: int | None = None) -> None:
        if sigma_rel is not None:
            if gamma is not None:
                raise ConfigError(f"EMACallback: set gamma ({gamma}) or sigma_rel ({sigma_rel}), not both - they "
                                  "are two ways of giving the power EMA's width (set the other to null)")
            if type != "power":
                raise ConfigError(f"EMACallback: sigma_rel is the width of the power EMA; type={type!r} does not "
                                  "use it")
            gamma = gamma_from_sigma_rel(float(sigma_rel))
        elif gamma is None:
            gamma = DEFAULT_GAMMA
        ema_beta(type, 1, beta=beta, gamma=gamma, halflife_kimg=halflife_kimg, rampup_ratio=rampup_ratio)
        if snapshot_iter is not None and (type != "power" or int(snapshot_iter) < 1):
            raise ConfigError(f"EMACallback: snapshot_iter={snapshot_iter} needs type='power' and a positive "
                              "interval (snapshots are for post-hoc EMA, fastgen.utils.posthoc_ema)")
        self.snapshot_iter = None if snapshot_iter is None else int(snapshot_iter)
        self.ema_name = ema_name
        self.kind = type
        self.beta, self.gamma, self.sigma_rel = beta, float(gamma), sigma_rel
        self.halflife_kimg, self.rampup_ratio = halflife_kimg, rampup_ratio
        self.start_iter = start_iter
        self.flat = bool(flat)
        self.last_beta = 0.0
        self.num_updates = 0  # optimizer steps of `net` so far (restored on resume)
        self.updates_at_start = 0  # num_updates at start_iter: the schedules' t counts from here
        self._loaded_counts: bool | None = None
        self.relayouts = 0
        self._plan: _Plan | None = None

    def on_model_init_end(self, model: Any) -> None:
        if self.ema_name not in model.ema_nets:
            raise ValueError(
                f"EMACallback(ema_name={self.ema_name!r}) has no EMA network: set model.use_ema to include "
                f"{self.ema_name!r} (it has {list(model.ema_nets) or 'none'})"
            )
        self._current_plan(model)  # lay the buffers out now, before the optimizers are built

    def _current_plan(self, model: Any) -> _Plan:
        plan = self._plan
        net, ema = model.net, model.ema_nets[self.ema_name]
        if plan is not None and plan.net is net and plan.ema is ema and _still_valid(plan):
            return plan
        if plan is not None:
            self.relayouts += 1
            if self.relayouts > _MAX_RELAYOUTS and self.flat:
                self.flat = False
                logger.warning("EMA %r: parameter storage keeps being replaced; using _foreach_lerp_ from now on",
                               self.ema_name)
            else:
                logger.info("EMA %r: a network or its parameter storage was replaced (.to(), assign=True load, "
                            "...); re-laying out the flat buffers", self.ema_name)
        with torch.no_grad():
            self._plan = plan = _build_plan(net, ema, self.flat)
        return plan

    @torch.no_grad()
    def update(self, model: Any, beta: float) -> None:
        """``ema <- beta * ema + (1 - beta) * net`` for every parameter, buffers copied (``beta = 0``: a copy)."""
        plan = self._current_plan(model)
        weight = 1.0 - beta
        for group in plan.groups:
            if beta == 0.0:
                group.dst.copy_(group.src)
            elif group.tensor_weight:
                group.dst.lerp_(group.src, torch.tensor(weight, dtype=group.dst.dtype))
            else:
                group.dst.lerp_(group.src, weight)
        if plan.rest_dst:
            dst, src = _local_tensors(plan.rest_dst), _local_tensors(plan.rest_src)
            if beta == 0.0:
                torch._foreach_copy_(dst, src)
            else:
                torch._foreach_lerp_(dst, src, weight)
        if plan.dst_buffers:
            torch._foreach_copy_(plan.dst_buffers, plan.src_buffers)

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0) -> None:
        trainer = self.trainer
        if trainer.step_skipped or "net" not in trainer.stepping:
            return  # the network did not move: nothing to average in
        self.num_updates += 1
        if iteration <= self.start_iter:
            beta = 0.0
            self.updates_at_start = self.num_updates
        else:
            beta = ema_beta(self.kind, self.num_updates - self.updates_at_start, beta=self.beta, gamma=self.gamma,
                            halflife_kimg=self.halflife_kimg, rampup_ratio=self.rampup_ratio,
                            batch_size=trainer.global_batch_size)
        self.update(model, beta)
        self.last_beta = beta
        trainer.log_scalar(f"ema/{self.ema_name}_beta", beta)
        t = self.num_updates - self.updates_at_start
        if self.snapshot_iter is not None and iteration > self.start_iter and t % self.snapshot_iter == 0:
            self.save_snapshot(model, t)

    def save_snapshot(self, model: Any, t: int) -> None:
        """Write this EMA's weights at schedule time ``t`` to ``RUN/ema_snapshots/`` for post-hoc reconstruction
        (``fastgen ema``). Written by rank 0: under FSDP2 gathered from every rank's shards (a collective all
        ranks join); replicated or single-process, rank 0 alone copies its whole network to the host - the other
        ranks' copies would be thrown away."""
        from fastgen.distributed import group as dist_utils
        from fastgen.distributed.parallelize import full_state_dict, has_sharded_parameters

        ema = model.ema_nets[self.ema_name]
        if not (dist_utils.is_rank0() or has_sharded_parameters(ema)):
            return
        state = full_state_dict(ema)
        if dist_utils.is_rank0():
            from fastgen.utils.posthoc_ema import save_snapshot, snapshot_path

            save_snapshot(snapshot_path(self.trainer.run_dir, self.ema_name, t), state, t, self.gamma)

    def on_load_checkpoint_end(self, model: Any, iteration: int = 0, checkpoint_path: str | None = None) -> None:
        if self._loaded_counts is None and iteration > 0:
            # A checkpoint without update counts (written before they were recorded): every iteration stepped.
            self.num_updates = iteration
            self.updates_at_start = min(iteration, self.start_iter)
        self._loaded_counts = None

    def state_dict(self) -> dict[str, Any]:
        # The EMA weights themselves are in the checkpoint's model_dict; only the schedule position lives here.
        return {"last_beta": self.last_beta, "num_updates": self.num_updates, "updates_at_start": self.updates_at_start}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_beta = float(state_dict.get("last_beta", 0.0))
        if "num_updates" in state_dict:
            self.num_updates = int(state_dict["num_updates"])
            self.updates_at_start = int(state_dict["updates_at_start"])
            self._loaded_counts = True
