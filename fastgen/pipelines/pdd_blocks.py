"""A PDD student (``fastgen.methods.pdd``) in a diffusers pipeline: one fused output projection per sampling block.

A diffusers pipeline calls one network, with fixed weights, at every step; a PDD student's block ``b`` needs its
own fused projection ``sum_j w_bj W_j`` (``fastgen.networks.heads``). So the export writes

* the network with block 0's fused projection in place of the widened one - a stock model of the base
  architecture that ``from_pretrained`` loads as it is, and that *is* the one-evaluation student when there is one
  block;
* ``pdd_blocks.safetensors`` beside ``model_index.json``: every block's fused weight (and bias), with the
  projection's module path and the block sizes in its metadata;

and ``PDDBlockWeights(folder)``, a ``callback_on_step_end`` that loads block ``i + 1``'s projection after step
``i`` (block 0 again after the last, so the pipeline can be called again)::

    pipe = DiffusionPipeline.from_pretrained(OUT)
    images = pipe(prompt, callback_on_step_end=PDDBlockWeights(OUT), **call)   # call: fastgen_export.json

The scheduler is deterministic flow-matching Euler at the blocks' start times, ``x_e = x_s + (t_e - t_s) v``:
the fused-block step.

A multimodal student (LTX-2: one widened projection per stream, ``fastgen.networks.heads.head_projections_of``)
exports every stream's projection the same way: block 0's fused projection of each stream in the network, and in
``pdd_blocks.safetensors`` (format ``fastgen-pdd-blocks-v2``) ``block{i}.{stream}.weight`` / ``.bias`` with the
streams' module paths in its metadata; ``PDDBlockWeights`` swaps all of them after each step (``LTX2Pipeline`` steps
both streams with the same sigmas, the blocks' start times).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

BLOCKS_FILE = "pdd_blocks.safetensors"
FORMAT_V1 = "fastgen-pdd-blocks-v1"  # one projection
FORMAT_V2 = "fastgen-pdd-blocks-v2"  # one projection per stream (a multimodal student)


def fused_blocks(net: nn.Module, grid: torch.Tensor, blocks: list[int],
                 projection: nn.Module | None = None) -> list[dict[str, torch.Tensor]]:
    """``net``'s widened projection (or ``projection``, one of a multimodal network's) fused per block of
    ``blocks`` (weights of ``fusion_weights``): one ``{"weight", "bias"}`` per block, at the projection's dtype, on
    the CPU."""
    from fastgen.methods.pdd import fusion_weights
    from fastgen.networks.heads import head_projection_of

    projection = projection if projection is not None else head_projection_of(net)
    if projection is None:
        raise ValueError("the network has no widened output projection")
    fused, start = [], 0
    for size in blocks:
        with projection.fused(fusion_weights(grid, start, start + size)):
            weight, bias = projection._parameters_now()
        fused.append({"weight": weight.detach().cpu().contiguous(),
                      **({} if bias is None else {"bias": bias.detach().cpu().contiguous()})})
        start += size
    return fused


@contextlib.contextmanager
def base_projection(net: nn.Module, params: dict[str, torch.Tensor], projection: Any = None) -> Iterator[None]:
    """Within the context, ``net``'s widened projection (or ``projection``, one of a multimodal network's) is
    replaced by the base layer it widened, holding ``params`` (a fused block): what ``save_pretrained`` then writes
    is the stock architecture."""
    from fastgen.networks.heads import head_projection_of

    projection = projection if projection is not None else head_projection_of(net)
    if projection is None:
        raise ValueError("the network has no widened output projection")
    prefix = "backbone." if hasattr(net, "backbone") else ""
    path = prefix + projection.spec.path
    weight = params["weight"]
    if projection.conv is None:
        layer: nn.Module = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in params)
    else:
        layer = nn.Conv2d(weight.shape[1] * projection.conv["groups"], weight.shape[0], tuple(weight.shape[2:]),
                          bias="bias" in params, **projection.conv)
    layer = layer.to(dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if "bias" in params:
            layer.bias.copy_(params["bias"])
    parent_path, _, name = path.rpartition(".")
    parent = net.get_submodule(parent_path) if parent_path else net
    setattr(parent, name, layer)
    try:
        yield
    finally:
        setattr(parent, name, projection)


def write_blocks(path: Path, fused: list[dict[str, torch.Tensor]] | dict[str, list[dict[str, torch.Tensor]]],
                 component: str, module_path: str | dict[str, str], blocks: list[int], times: list[float]) -> None:
    """``pdd_blocks.safetensors``: ``block{i}.weight`` / ``block{i}.bias`` and, in its metadata, the pipeline
    ``component`` and ``module_path`` they belong to, the block sizes and their start times. A multimodal student:
    ``fused`` and ``module_path`` are dicts by stream, written as ``block{i}.{stream}.weight`` with the paths in
    ``module_paths`` (format v2)."""
    from safetensors.torch import save_file

    metadata = {"component": component, "blocks": json.dumps(blocks), "times": json.dumps(times)}
    if isinstance(fused, dict):
        if not isinstance(module_path, dict) or set(module_path) != set(fused):
            raise ValueError("a multimodal student's blocks need one module path per stream")
        tensors = {f"block{i}.{stream}.{name}": tensor for stream, per_block in fused.items()
                   for i, params in enumerate(per_block) for name, tensor in params.items()}
        metadata.update(module_paths=json.dumps(module_path), format=FORMAT_V2)
    else:
        tensors = {f"block{i}.{name}": tensor for i, params in enumerate(fused) for name, tensor in params.items()}
        metadata.update(module_path=str(module_path), format=FORMAT_V1)
    save_file(tensors, str(path), metadata=metadata)


class PDDBlockWeights:
    """``callback_on_step_end`` for an exported PDD pipeline: after step ``i`` the network's projection holds block
    ``i + 1``'s fused weights (block 0's after the last step). ``folder``: the exported pipeline folder."""

    def __init__(self, folder: str | Path) -> None:
        from safetensors import safe_open

        file = Path(folder) / BLOCKS_FILE
        with safe_open(str(file), framework="pt") as handle:
            meta = handle.metadata() or {}
            if meta.get("format") not in (FORMAT_V1, FORMAT_V2):
                raise ValueError(f"{file} is not a fastgen PDD blocks file")
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        self.component = meta["component"]
        self.blocks: list[int] = json.loads(meta["blocks"])
        # {stream: module path}; a one-projection student's stream is "" (its tensors are block{i}.weight)
        if meta["format"] == FORMAT_V2:
            self.module_paths: dict[str, str] = json.loads(meta["module_paths"])
        else:
            self.module_paths = {"": meta["module_path"]}
        self.module_path = next(iter(self.module_paths.values()))
        key = lambda i, stream, name: f"block{i}.{stream}.{name}" if stream else f"block{i}.{name}"  # noqa: E731
        self.params = [{stream: {name: tensors[key(i, stream, name)] for name in ("weight", "bias")
                                 if key(i, stream, name) in tensors} for stream in self.module_paths}
                       for i in range(len(self.blocks))]

    def load_block(self, pipe: Any, index: int) -> None:
        """Put block ``index``'s fused projection (every stream's) into ``pipe``'s network."""
        network = getattr(pipe, self.component)
        with torch.no_grad():
            for stream, module_path in self.module_paths.items():
                layer = network.get_submodule(module_path)
                for name, tensor in self.params[index][stream].items():
                    getattr(layer, name).copy_(tensor.to(getattr(layer, name)))

    def __call__(self, pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
        self.load_block(pipe, (step + 1) % len(self.blocks))
        return callback_kwargs


__all__ = ["BLOCKS_FILE", "FORMAT_V1", "FORMAT_V2", "PDDBlockWeights", "base_projection", "fused_blocks",
           "write_blocks"]
