"""Per-rank memory estimate of a config's static state, computed on the meta device (no weights allocated).

What it counts, per rank, in bytes:

* ``parameters`` - every parameter and buffer of the method (``net``, EMA copies, teachers, ...), each storage
  once: ``sum(numel * element_size)``;
* ``gradients`` - one gradient of the parameter's dtype for every parameter an optimizer steps;
* ``optimizer_state`` - what the optimizers keep, found by *running one optimizer step on the meta device* and
  adding up ``optimizer.state``: for Adam that is two moments per parameter plus a step counter (Kingma & Ba
  2015, Algorithm 1: ``m_t`` and ``v_t``), i.e. the ``K = 8`` bytes per fp32 parameter of Rajbhandari et al.
  2020 (ZeRO), Sec. 3.1 without a master copy. ``torch.optim.LBFGS`` cannot step without a closure, so its state
  is counted from what it documents and keeps (:func:`lbfgs_state_bytes`): at a full history that is
  ``2 * history_size + 2`` flat copies of the parameters - by far the largest of the optimizers. Any other
  optimizer that cannot step on the meta device falls back to the rule above (Adam-like: 2 x parameters; SGD with
  momentum: 1 x; otherwise 0) and says so in ``method``.

With ``trainer.fsdp`` and more than one rank, parameters, gradients and optimizer state are sharded (ZeRO stage
3 / FSDP full sharding, Rajbhandari et al. 2020, Fig. 1): the numbers are then those of the busiest rank under
the real sharding plan, from ``fastgen.profiling.plan`` (the trainer's ``parallelize`` on a fake process group).
Activations depend on the batch and are not estimated: the report puts this estimate beside the measured peak to
show how much they add.
"""

from __future__ import annotations

from typing import Any

from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

ESTIMATE_KEYS: tuple[str, ...] = ("parameters", "gradients", "optimizer_state")


def build_meta_model(config: Any) -> Any:
    """The config's method with every tensor on the meta device (shapes and dtypes, no storage)."""
    import torch

    from fastgen.configs.instantiate import instantiate

    with torch.device("meta"):
        return instantiate(config.model_class, config=config.model)


def _nbytes(tensor: Any) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


def lbfgs_state_bytes(optimizer: Any) -> int:
    """Bytes of ``torch.optim.LBFGS``'s state once its history is full (after ``history_size`` accepted updates).

    LBFGS keeps one state for all its parameters, flattened into vectors of ``N`` elements (Nocedal 1980; the
    torch implementation, ``torch/optim/lbfgs.py``): the search direction ``d`` and the previous gradient
    ``prev_flat_grad`` (``N`` each), the curvature pairs ``old_dirs`` (``y = g_k+1 - g_k``) and ``old_stps``
    (``s = t d``), ``history_size`` vectors each, and the 0-dim tensors ``ro`` (``1 / y.s``, ``history_size``),
    ``al`` (``history_size``) and ``H_diag``; the step ``t`` and the counters are Python numbers. So
    ``((2 * history_size + 2) * N + 2 * history_size + 1)`` elements. (torch's docstring quotes
    ``param_bytes * (history_size + 1)``, which leaves out one of the two histories.) Transient buffers of a step
    (the flat gradient, the two-loop recursion's ``q``, the line search's copies) are not state and not counted.
    """
    group = optimizer.param_groups[0]
    history = int(group["history_size"])
    params = list(group["params"])
    flat = sum(_nbytes(p) for p in params)  # a complex parameter is flattened as two reals: the same bytes
    scalar = params[0].element_size() // (2 if params[0].is_complex() else 1) if params else 0
    return (2 * history + 2) * flat + (2 * history + 1) * scalar


def estimate_unsharded(config: Any, world_size: int = 1, model: Any = None) -> dict[str, Any]:
    """Bytes per rank of parameters, gradients and optimizer state when every rank holds whole networks (one
    process, DDP; see the module docstring). ``fastgen.profiling.plan.estimate_memory`` adds FSDP's plan."""
    import torch

    if model is None:
        model = build_meta_model(config)
    seen: set[int] = set()
    parameters = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            parameters += _nbytes(tensor)
    if not getattr(model, "optimizer_dict", None):
        with torch.device("meta"):
            model.init_optimizers()
    stepped: list[Any] = []
    gradients = 0
    grad_ids: set[int] = set()
    for optimizer in model.optimizer_dict.values():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in grad_ids:
                    grad_ids.add(id(p))
                    gradients += _nbytes(p)
                    stepped.append(p)
    optimizer_state, method = 0, "one optimizer step on the meta device"
    for name, optimizer in model.optimizer_dict.items():
        if isinstance(optimizer, torch.optim.LBFGS):
            optimizer_state += lbfgs_state_bytes(optimizer)
            method = f"LBFGS's state at a full history of {optimizer.param_groups[0]['history_size']} pairs"
            continue
        try:
            for p in (p for g in optimizer.param_groups for p in g["params"]):
                p.grad = torch.zeros_like(p, device="meta")
            optimizer.step()
            optimizer_state += sum(_nbytes(v) for state in optimizer.state.values() for v in state.values()
                                   if isinstance(v, torch.Tensor))
        except Exception as exc:  # noqa: BLE001 - any optimizer may refuse meta tensors; fall back to the rule
            params = sum(_nbytes(p) for g in optimizer.param_groups for p in g["params"])
            kind = type(optimizer).__name__.lower()
            momentum = any(float(g.get("momentum", 0) or 0) > 0 for g in optimizer.param_groups)
            factor = 2 if "adam" in kind else 1 if momentum else 0
            optimizer_state += factor * params
            method = f"rule of thumb for {type(optimizer).__name__} ({factor} x parameters)"
            logger.debug("optimizer %s cannot step on the meta device (%s); using the rule of thumb", name, exc)
        finally:
            for p in stepped:
                p.grad = None
    world_size = max(int(world_size), 1)
    values = {"parameters": parameters, "gradients": gradients, "optimizer_state": optimizer_state}
    return {**values, "total": sum(values.values()), "world_size": world_size, "sharded": False, "method": method}
