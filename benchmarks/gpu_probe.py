"""In-process probes for ``benchmarks/gpu_check.sh``: what the trainer's log does not show. Run under
``torchrun --standalone --nproc-per-node 1 benchmarks/gpu_probe.py`` on a machine with a CUDA GPU.

It joins the process group through fastgen's own ``init_distributed`` (the digits SFT recipe with trainer.fsdp,
FSDP2 bf16 parameters / float32 reduction), builds the recipe's method and shards it with fastgen's
``parallelize``, as the trainer does, and checks:

* ``collective``    - ``collective_device()`` (and the fingerprint module's ``_collective_device``) is
  ``cuda:LOCAL_RANK`` under NCCL, and an all-reduce on it completes;
* ``bound device``  - ``torch.cuda.current_device() == LOCAL_RANK`` and the default process group is bound to
  ``cuda:LOCAL_RANK`` (``device_id`` given to ``init_process_group``: ``ProcessGroup.bound_device_id``), and
  the device mesh is a CUDA mesh;
* ``mixed precision`` - one ``single_train_step`` + backward + Adam step of the sharded method: the sharded
  (master) parameters are float32 DTensors on the GPU, a convolution inside the network sees bfloat16 weights
  during forward (FSDP2's all-gather dtype), the gradients are float32, the loss is finite;
* ``pinned staging`` - an async sharded save through fastgen's ``CheckpointManager`` (``async_save=True``):
  the ``ReusedHostStager``'s host buffers are pinned (every non-scalar tensor), the save completes (marker and
  DCP ``.metadata``), and loading it back restores the weights exactly;
* ``cpu offload``   - the method sharded with ``trainer.fsdp_cpu_offload=True``: every parameter's local shard
  lives in (pinned) host memory, forward runs on the GPU, one step leaves the gradients on the host and changes
  the parameters.

Each check prints ``ok: ...`` or ``FAIL: ...`` (``skip: ...`` in the CPU self-test); the exit code is 1 when any
failed. ``GPU_CHECK_ALLOW_CPU=1`` (self-test of this script on a machine without a GPU): gloo and CPU are expected
instead, and the offload probe checks that fastgen refuses the option on CPU.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

RECIPE = "Digits/config_sft_digits"
ALLOW_CPU = os.environ.get("GPU_CHECK_ALLOW_CPU") == "1"
FAILED: list[str] = []


def report(ok: bool, what: str, detail: str = "") -> None:
    line = f"{'ok' if ok else 'FAIL'}: {what}" + (f" ({detail})" if detail else "")
    if not ok:
        FAILED.append(what)
    print(line, flush=True)


def guarded(what: str):
    """Run a probe; an exception is one FAIL line naming it (the traceback goes to stderr)."""
    def wrap(fn):
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every failure is reported, the next probe still runs
                traceback.print_exc(file=sys.stderr)
                report(False, what, f"raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
                return None
        return run
    return wrap


def _config(*overrides: str) -> Any:
    from fastgen.configs.config_utils import apply_overrides, load_config, validate_config

    config = load_config(RECIPE)
    apply_overrides(config, ["trainer.fsdp=True", "trainer.fsdp_param_dtype=bfloat16",
                             "trainer.fsdp_reduce_dtype=float32", "trainer.validation_iter=null", *overrides])
    return validate_config(config)


def _build(config: Any, device: torch.device, mesh: Any) -> Any:
    """The method as the trainer builds it on a fresh run (``Trainer._build_model`` without ``meta_init``)."""
    from fastgen.configs.instantiate import instantiate
    from fastgen.distributed.parallelize import parallelize

    torch.manual_seed(config.trainer.seed)
    model = instantiate(config.model_class, config=config.model)
    model.to(device)
    model.init_weights()
    parallelize(model, config.trainer, mesh)
    model.train()
    model.init_optimizers()
    return model


def _first_conv(module: torch.nn.Module) -> torch.nn.Module:
    for sub in module.modules():
        if isinstance(sub, (torch.nn.Conv2d, torch.nn.Linear)) and not list(sub.children()):
            return sub
    raise RuntimeError("the network has no Conv2d / Linear layer to watch")


def _train_step(model: Any, loader: Any, device: torch.device, iteration: int = 0) -> tuple[float, dict[str, Any]]:
    """One trainer-style step (``Trainer._train`` without callbacks): loss, backward, optimizer step. Returns the
    loss and what a forward pre-hook saw of the first convolution's weight."""
    from fastgen.trainer import _to_device

    seen: dict[str, Any] = {}
    layer = _first_conv(model.net)

    def hook(mod: torch.nn.Module, args: Any) -> None:
        weight = mod.weight
        seen.setdefault("dtype", weight.dtype)
        seen.setdefault("device", weight.device)
        seen.setdefault("input_device", args[0].device if args else None)

    handle = layer.register_forward_pre_hook(hook)
    try:
        data = _to_device(next(loader), device)
        with model.bind_batch(data, iteration, seed=0):
            loss_dict, _ = model.single_train_step(data, iteration)
        loss = loss_dict["total_loss"]
        loss.backward()
    finally:
        handle.remove()
    seen["grads"] = [p.grad for p in model.net.parameters() if p.grad is not None]
    seen["grad_dtypes"] = sorted({str(g.dtype) for g in seen["grads"]})
    seen["grad_devices"] = sorted({str(_local(g).device) for g in seen["grads"]})
    for optimizer in model.optimizer_dict.values():
        optimizer.step()
    return float(loss.detach()), seen


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _tensors(v)]
    return []


class _NoCallbacks:
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


# ---- the probes ---------------------------------------------------------------------------------------------------
@guarded("collective_device is the rank's CUDA device under NCCL")
def probe_collective(expected: torch.device) -> None:
    from fastgen.distributed import group as dist_utils
    from fastgen.distributed.fingerprint import _collective_device

    backend = str(dist.get_backend())
    device = dist_utils.collective_device()
    other = _collective_device()
    value = torch.ones(1, device=device)
    dist.all_reduce(value)
    ok = device == expected and other == expected and float(value) == float(dist.get_world_size())
    report(ok, "collective_device is the rank's CUDA device under NCCL" if not ALLOW_CPU
           else "collective_device under gloo (CPU self-test)",
           f"backend {backend}, collective_device() {device}, fingerprint._collective_device() {other}, "
           f"expected {expected}, all_reduce {'ok' if float(value) == dist.get_world_size() else 'wrong'}")


@guarded("process group bound to cuda:LOCAL_RANK")
def probe_bound_device(local_rank: int, mesh: Any) -> None:
    from torch.distributed.distributed_c10d import _get_default_group

    bound = getattr(_get_default_group(), "bound_device_id", "n/a")
    if ALLOW_CPU:
        ok = bound is None and mesh.device_type == "cpu"
        report(ok, "process group not bound to a device on CPU (CPU self-test)",
               f"bound_device_id {bound}, mesh {mesh.device_type}")
        return
    current = torch.cuda.current_device()
    expected = torch.device("cuda", local_rank)
    ok = current == local_rank and bound == expected and mesh.device_type == "cuda"
    report(ok, "process group bound to cuda:LOCAL_RANK",
           f"LOCAL_RANK {local_rank}, torch.cuda.current_device() {current}, bound_device_id {bound}, "
           f"mesh {mesh.device_type} {tuple(mesh.shape)}")


@guarded("FSDP2 mixed precision: bf16 compute, float32 master weights and gradients")
def probe_mixed_precision(model: Any, loader: Any, device: torch.device) -> None:
    from torch.distributed.tensor import DTensor

    params = list(model.net.parameters())
    sharded = all(isinstance(p, DTensor) for p in params)
    master = sorted({str(p.dtype) for p in params})
    where = sorted({str(_local(p).device) for p in params})
    loss, seen = _train_step(model, loader, device)
    ok = (sharded and master == ["torch.float32"] and where == [str(device)] and seen.get("dtype") == torch.bfloat16
          and seen["grad_dtypes"] == ["torch.float32"] and bool(seen["grads"]) and torch.isfinite(torch.tensor(loss)))
    report(ok, "FSDP2 mixed precision: bf16 compute, float32 master weights and gradients",
           f"{len(params)} DTensor parameters: {sharded}, master {','.join(master)} on {','.join(where)}; forward "
           f"weight dtype {seen.get('dtype')} on {seen.get('device')}; grads {','.join(seen['grad_dtypes'])}; "
           f"loss {loss:.4f}")


@guarded("pinned host staging of an async sharded save, and its round trip")
def probe_pinned_staging(config: Any, model: Any, workdir: Path) -> None:
    from fastgen.checkpoint.manager import CheckpointManager, TrainingState

    manager = CheckpointManager(config.trainer.checkpointer, workdir / "probe_run", sharded=True,
                                seed=config.trainer.seed, run_prefix="gpu_probe")
    if not manager.async_save:
        raise RuntimeError("trainer.checkpointer.async_save did not reach the CheckpointManager")
    state = TrainingState(model=model, callbacks=_NoCallbacks(), loaders={}, iteration=1)
    before = {k: v.detach().clone() for k, v in model.net.state_dict().items()}
    before = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).cpu() for k, v in before.items()}
    marker = manager.save(state)
    stager = getattr(manager, "_stager", None)
    cache = getattr(stager, "state_dict_cache", None)
    if stager is None or cache is None:
        raise RuntimeError(f"no staged host buffers after an async sharded save (stager {type(stager).__name__})")
    staged = [_local(t) for t in _tensors(cache)]
    host = all(t.device.type == "cpu" for t in staged)
    eligible = [t for t in staged if t.dim() > 0 and t.numel() > 0]  # DCP stages 0-d entries (Adam's step) unpinned
    pinned = sum(1 for t in eligible if t.is_pinned())
    mb = sum(t.numel() * t.element_size() for t in eligible) / 2**20
    manager.wait()
    folder = Path(str(marker)).with_suffix(".dcp")
    written = Path(str(marker)).is_file() and (folder / ".metadata").is_file()
    # second save: the same buffers are reused (no fresh allocation)
    ids = [t.data_ptr() for t in eligible]
    state.iteration = 2
    marker2 = manager.save(state)
    reused = [_local(t).data_ptr() for t in _tensors(manager._stager.state_dict_cache)
              if _local(t).dim() > 0 and _local(t).numel() > 0] == ids
    manager.wait()
    with torch.no_grad():
        for p in model.net.parameters():
            p.zero_()
    manager.load(str(marker2), state)
    after = {k: v.detach() for k, v in model.net.state_dict().items()}
    after = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).cpu() for k, v in after.items()}
    exact = before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    want_pinned = torch.cuda.is_available()
    ok = host and written and reused and exact and (pinned == len(eligible) if want_pinned else True)
    what = ("pinned host staging of an async sharded save, and its round trip" if not ALLOW_CPU
            else "host staging of an async sharded save, and its round trip (CPU self-test: not pinned)")
    report(ok, what, f"{pinned}/{len(eligible)} staged tensors pinned ({mb:.1f} MiB), on host: {host}; "
                     f"buffers reused by the next save: {reused}; marker + .metadata written: {written}; "
                     f"weights restored exactly: {exact}")


@guarded("FSDP CPU offload: shards in host memory, GPU compute, a step trains")
def probe_cpu_offload(device: torch.device, mesh: Any) -> None:
    from fastgen.configs.instantiate import instantiate

    config = _config("trainer.fsdp_cpu_offload=True")
    if ALLOW_CPU:
        from fastgen.utils.errors import ConfigError

        try:
            _build(config, device, mesh)
        except ConfigError as exc:
            print(f"skip: FSDP CPU offload needs CUDA (CPU self-test: refused as expected: {str(exc)[:80]}...)",
                  flush=True)
            return
        report(False, "FSDP CPU offload refused on CPU", "parallelize accepted trainer.fsdp_cpu_offload on CPU")
        return
    model = _build(config, device, mesh)
    loader = instantiate(config.dataloader_train)
    params = list(model.net.parameters())
    locals_ = [_local(p) for p in params]
    on_host = all(t.device.type == "cpu" for t in locals_)
    pinned = sum(1 for t in locals_ if t.numel() and t.is_pinned())
    before = [t.detach().clone() for t in locals_]
    loss, seen = _train_step(model, loader, device)
    changed = any(not torch.equal(b, _local(p).detach()) for b, p in zip(before, model.net.parameters()))
    grads_host = seen["grad_devices"] == ["cpu"]
    ok = (on_host and seen.get("device") is not None and seen["device"].type == "cuda" and grads_host and changed
          and torch.isfinite(torch.tensor(loss)))
    report(ok, "FSDP CPU offload: shards in host memory, GPU compute, a step trains",
           f"{len(params)} parameter shards on host: {on_host} ({pinned} pinned); forward weights on "
           f"{seen.get('device')}; grads on {','.join(seen['grad_devices'])}; parameters changed: {changed}; "
           f"loss {loss:.4f}")


def main() -> int:
    from fastgen.configs.instantiate import instantiate
    from fastgen.distributed import group as dist_utils

    if not ALLOW_CPU and not torch.cuda.is_available():
        report(False, "a CUDA GPU is visible", "set GPU_CHECK_ALLOW_CPU=1 for the CPU self-test")
        return 1
    if "RANK" not in os.environ:
        report(False, "launched by torchrun", "run: torchrun --standalone --nproc-per-node 1 benchmarks/gpu_probe.py")
        return 1
    config = _config("trainer.checkpointer.async_save=True")
    mesh = dist_utils.init_distributed(config.trainer)
    try:
        if mesh is None:
            report(False, "init_distributed formed a process group", "it returned no mesh")
            return 1
        local_rank = dist_utils.get_local_rank()
        device = dist_utils.select_device(config.trainer.device)
        expected = torch.device("cpu") if ALLOW_CPU else torch.device("cuda", local_rank)
        probe_collective(expected)
        probe_bound_device(local_rank, mesh)
        model = _build(config, device, mesh)
        loader = instantiate(config.dataloader_train)
        probe_mixed_precision(model, loader, device)
        with tempfile.TemporaryDirectory(prefix="fastgen_gpu_probe_") as tmp:
            probe_pinned_staging(config, model, Path(tmp))
        probe_cpu_offload(device, mesh)
    finally:
        dist_utils.teardown()
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
