"""``fastgen convert-ckpt RUN OUT --to diffusers``: a run's network as a complete diffusers pipeline folder.

The folder is the teacher's pipeline folder (the run's ``model.pretrained_model_path``, or ``weights``) with

* the network (the EMA copy when the run keeps one, else the trained one; ``only`` picks; a LoRA network merged)
  in place of the teacher's ``unet/`` or ``transformer/``, written by diffusers' own ``save_pretrained``;
* a scheduler that samples as the network samples (``fastgen.pipelines.schedulers``), named in
  ``model_index.json``;
* ``fastgen_export.json``: where it came from and the ``"call"`` arguments that reproduce fastgen's samples:
  ``DiffusionPipeline.from_pretrained(OUT)(prompt, generator=torch.Generator().manual_seed(seed), **call)``
  renders what ``fastgen sample RUN --prompt prompt --seed seed`` rendered (with ``"global_seed": true``, also
  call ``torch.manual_seed(seed)`` first: that pipeline re-noises from torch's global generator);
* ``README.md``, a model card with the command, the sampling and the run's (redacted) config;
* for a PDD student, block 0's fused projection in the network and ``pdd_blocks.safetensors`` with every block's,
  loaded step by step by ``fastgen.pipelines.pdd_blocks.PDDBlockWeights`` (``callback_on_step_end``) - every
  stream's projection for a multimodal student (LTX-2's video and audio).

The other components (VAE, text encoders, tokenizers) are hard-linked from the weights folder when it is on the
same file system, else copied. The folder is built beside ``OUT`` and renamed onto it when complete: a failure
leaves nothing at ``OUT``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from fastgen.utils.errors import UsageError
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

EXPORT_FILE = "fastgen_export.json"
_PIPELINE_TAG = {"sd": "text-to-image", "sdxl": "text-to-image", "flux": "text-to-image", "wan": "text-to-video",
                 "qwenimage": "text-to-image", "cogvideox": "text-to-video", "ltx2": "text-to-video",
                 "cosmos3": "text-to-video", "cosmos2": "text-to-image",
                 "cosmos25": "text-to-video"}


def _link_or_copy(source: Path, target: Path) -> None:
    if source.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        for child in source.iterdir():
            _link_or_copy(child, target / child.name)
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _model_card(info: dict[str, Any], config_yaml: str) -> str:
    call = ", ".join(f"{k}={v!r}" for k, v in info["call"].items())
    seed_line = "torch.manual_seed(0)  # this pipeline re-noises from torch's global generator\n" if info["global_seed"] else ""
    if "pdd" in info:  # one fused output projection per block, loaded by a step-end callback
        call += ", callback_on_step_end=PDDBlockWeights(\"PATH/TO/THIS/FOLDER\")"
        seed_line = "from fastgen.pipelines.pdd_blocks import PDDBlockWeights\n" + seed_line
    return f"""---
library_name: diffusers
pipeline_tag: {_PIPELINE_TAG.get(info["family"], "text-to-image")}
tags:
- fastgen
- {info["method"]}
- distillation
---

# {info["pipeline"]} sampling in {len(info["times"])} step(s), exported by fastgen

* made by: `{info["command"]}`
* network: `{info["network"]}` of {info["checkpoint"]} (iteration {info["iteration"]}, method {info["method"]})
* components from: {info["weights"]}
* sampler: {info["sampler"]} at fastgen times {info["times"]} (scheduler {info["scheduler"]})

```python
import torch
from diffusers import DiffusionPipeline

pipe = DiffusionPipeline.from_pretrained("PATH/TO/THIS/FOLDER")
{seed_line}out = pipe(prompt="a prompt", generator=torch.Generator().manual_seed(0), {call})
```

`fastgen_export.json` holds the same call arguments (`"call"`).

## The run's configuration

```yaml
{config_yaml}```
"""


def export_diffusers(src: str, out: str, only: str | None = None, weights: str | None = None,
                     credentials_dir: str | None = None, steps: int | None = None, guidance: float | None = None,
                     command: str = "") -> dict[str, Any]:
    """Write the diffusers pipeline folder ``out`` for network ``only`` (net, ema, teacher; default the EMA copy
    when the run has one) of the run / checkpoint ``src``. ``steps`` / ``guidance``: for a network without a
    student sampler (a teacher, an SFT model), its ODE grid and guidance. Returns what ``fastgen_export.json``
    holds."""
    from fastgen.checkpoint.convert import staged_folder
    from fastgen.checkpoint.run import load_run, select_net
    from fastgen.configs.config_utils import config_to_yaml
    from fastgen.networks.codecs import codec_family, quiet_libraries
    from fastgen.networks.diffusers_nets import DiffusersBackbone
    from fastgen.networks.heads import head_projections_of
    from fastgen.pipelines.pdd_blocks import BLOCKS_FILE, base_projection, fused_blocks, write_blocks
    from fastgen.pipelines.schedulers import diffusers_sampling, plan_of
    from fastgen.utils.lora_utils import is_adapted, merge_lora

    target = Path(out).expanduser()
    if "://" in out:
        raise UsageError("--to diffusers writes a local folder: upload it afterwards")
    if target.exists():
        raise UsageError(f"{target} exists: --to diffusers writes a new folder")
    from fastgen.utils.io import check_can_create

    check_can_create(target, "the pipeline folder", "Choose another destination.")
    run = load_run(src, credentials_dir=credentials_dir)
    model = run.model
    which = only or ("ema" if len(getattr(model, "ema_nets", {})) else "net")
    if which not in ("net", "ema", "teacher"):
        raise UsageError(f"--only {which}: --to diffusers exports net, ema or teacher")
    net = select_net(run, which)
    if getattr(getattr(net, "backbone", None), "causal", False):
        raise UsageError(f"--to diffusers: this run's {which} is block-causal (chunk by chunk with a KV cache), which "
                         "a diffusers pipeline would run bidirectionally; sample it with fastgen instead")
    folder = weights or run.config.model.pretrained_model_path
    if not folder:
        raise UsageError("--to diffusers needs the teacher's pipeline folder: the run has no "
                         "model.pretrained_model_path; pass --weights DIR")
    folder_path = Path(folder).expanduser()
    family = codec_family(folder_path)
    backbone = getattr(net, "backbone", None)
    if not isinstance(backbone, DiffusersBackbone):
        raise UsageError(f"--to diffusers exports diffusers-backed networks; this run's {which} is "
                         f"{type(backbone).__name__}")
    plan = plan_of(model, which, steps, guidance)
    pdd = which != "teacher" and getattr(model, "student_sampler", None) == "pdd"
    if pdd and not getattr(net.noise_scheduler, "native_pred_type", "") == "flow":
        raise UsageError("a PDD student exports to a rectified-flow pipeline (Flux, Wan, Qwen-Image): its blocks are "
                         "flow-matching Euler steps, which this family's scheduler does not take")
    sampling = diffusers_sampling(family, plan, net)
    if is_adapted(net):
        merge_lora(net)
    index = json.loads((folder_path / "model_index.json").read_text())
    subfolder = backbone.weights_subfolder
    if subfolder not in index:
        raise UsageError(f"{folder_path}: model_index.json has no {subfolder!r} component for the network")
    info = {
        "fastgen_export": 1, "family": family, "pipeline": index.get("_class_name", ""),
        "checkpoint": str(run.checkpoint), "iteration": run.iteration, "network": which,
        "method": type(model).__name__, "weights": str(folder_path.resolve()), "sampler": plan.sampler,
        "times": list(plan.times), "scheduler": type(sampling.scheduler).__name__, "call": sampling.call,
        "global_seed": sampling.global_seed, "command": command,
    }
    blocks = model.sampling_blocks(steps) if pdd else []
    if pdd:
        info["pdd"] = {"blocks": blocks, "grid": [float(t) for t in model.grid],
                       "callback_on_step_end": "fastgen.pipelines.pdd_blocks.PDDBlockWeights(OUT)"}
    with staged_folder(target) as staging:
        staging.mkdir()
        for entry in sorted(folder_path.iterdir()):
            if entry.name in (subfolder, "scheduler", "model_index.json", "README.md", EXPORT_FILE, BLOCKS_FILE):
                continue
            if entry.name.startswith("."):
                continue
            _link_or_copy(entry, staging / entry.name)
        with quiet_libraries():  # diffusers' own progress bars stay out of fastgen's output
            if pdd:  # block 0 in the network itself, every block's projection beside it (pdd_blocks)
                # one projection, or one per stream of a multimodal student (LTX-2's video and audio)
                projections = head_projections_of(net)
                fused = {name: fused_blocks(net, model.grid, blocks, projection)
                         for name, projection in projections.items()}
                paths = {name: projection.spec.path.removeprefix("model.") for name, projection in projections.items()}
                with contextlib.ExitStack() as stack:
                    for name, projection in projections.items():
                        stack.enter_context(base_projection(net, fused[name][0], projection))
                    backbone.model.save_pretrained(staging / subfolder, safe_serialization=True)
                if None in projections:
                    write_blocks(staging / BLOCKS_FILE, fused[None], subfolder, paths[None], blocks, list(plan.times))
                else:
                    write_blocks(staging / BLOCKS_FILE, fused, subfolder, paths, blocks, list(plan.times))
            else:
                backbone.model.save_pretrained(staging / subfolder, safe_serialization=True)
            sampling.scheduler.save_pretrained(staging / "scheduler")
        index["scheduler"] = ["diffusers", type(sampling.scheduler).__name__]
        (staging / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
        (staging / EXPORT_FILE).write_text(json.dumps(info, indent=2) + "\n")
        (staging / "README.md").write_text(_model_card(info, config_to_yaml(run.config)))
    logger.info("exported the %s of %s to %s", which, run.checkpoint, target)
    return info


__all__ = ["EXPORT_FILE", "export_diffusers"]
