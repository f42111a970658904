"""WandbCallback: Weights & Biases logging of scalars and sample images (rank 0 only).

Scalars: every ``loss_dict`` entry, averaged over the steps of each logging window (``trainer.logging_iter``),
plus what other callbacks report with ``trainer.log_scalar`` (``grad_norm``, ``ema/<name>_beta``, ...), the
learning rates (``lr/<optimizer>``), and validation losses (``val/<key>``). Logged at ``step=iteration``.

Images: every ``sample_iter`` iterations and at the end of training, ``num_samples`` samples from the model's
sampling network (the first EMA network when ``model.use_ema`` is set - which is why EMA callbacks must come
before this one) drawn with a private, fixed-seed generator so logging never changes the training random stream.
Each grid is also written to ``<run dir>/samples/iter_XXXXXXX.png``.

Mode: ``log_config.wandb_mode`` - ``online``, ``offline``, ``disabled``, or ``auto``: ``WANDB_MODE`` when set,
else online when an API key is available (``WANDB_API_KEY`` or ``credentials_dir/wandb_api.txt``) and
offline otherwise, with a one-line hint to upload later with ``wandb sync``. The W&B run id is stored in the run
directory (``wandb_run_id.txt``) so a resumed run continues the same W&B run. The logged config has secrets
redacted.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import torch

from fastgen.callbacks.callback import Callback
from fastgen.utils import distributed as dist_utils
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)


def resolve_wandb_mode(configured: str) -> str:
    if configured != "auto":
        return configured
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if env in ("online", "offline", "disabled"):
        return env
    if env == "dryrun":
        return "offline"
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class WandbCallback(Callback):
    def __init__(self, sample_iter: int = 1000, num_samples: int = 64, sample_seed: int = 0,
                 save_local_images: bool = True) -> None:
        self.sample_iter = int(sample_iter)
        self.num_samples = int(num_samples)
        self.sample_seed = int(sample_seed)
        self.save_local_images = save_local_images
        self.run: Any = None
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0
        self._last_image_iter = -1

    # ---- setup / teardown ----------------------------------------------------------------------------------
    def on_train_begin(self, model: Any, iteration: int = 0) -> None:
        if not dist_utils.is_rank0():
            return
        mode = resolve_wandb_mode(self.config.log_config.wandb_mode)
        if mode == "disabled":
            logger.info("W&B logging is disabled")
            return
        import wandb

        from fastgen.configs.config_utils import config_to_dict

        run_dir = Path(self.trainer.run_dir)
        id_file = run_dir / "wandb_run_id.txt"
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        if not run_id:
            from fastgen.utils.io import atomic_write_text

            run_id = secrets.token_hex(4)
            atomic_write_text(id_file, run_id + "\n")
        log = self.config.log_config
        self.run = wandb.init(
            project=log.project,
            group=log.group,
            name=log.name,
            entity=log.wandb_entity,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            mode=mode,
            config=config_to_dict(self.config),
            settings=wandb.Settings(silent=True, console="off"),
        )
        if mode == "offline":
            sync_dir = str(Path(self.run.dir).parent)  # <run dir>/wandb/offline-run-*/files -> the run folder
            reason = "no API key found" if not os.environ.get("WANDB_API_KEY") else "offline mode"
            logger.info("W&B: %s, logging offline to %s (upload later with `wandb sync %s`)", reason, sync_dir, sync_dir)

    def on_app_end(self) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if self.trainer.exception is not None else 0)
            self.run = None

    # ---- scalars -------------------------------------------------------------------------------------------
    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0) -> None:
        for key, value in loss_dict.items():
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.detach().float()
                self._sums[key] = self._sums[key] + value if key in self._sums else value.clone()
        self._count += 1
        if iteration % self.config.trainer.logging_iter == 0 or iteration == self.config.trainer.max_iter:
            self._flush_scalars(model, iteration)
        if self.sample_iter > 0 and iteration % self.sample_iter == 0:
            self._log_samples(model, iteration)

    def _flush_scalars(self, model: Any, iteration: int) -> None:
        means = {k: v / max(self._count, 1) for k, v in self._sums.items()}
        for key in sorted(means):  # identical order on every rank for the all-reduce
            dist_utils.all_reduce_mean(means[key])
        scalars: dict[str, float] = {k: float(v) for k, v in means.items()}
        for key, value in self.trainer.pop_scalars().items():
            scalars[key] = float(value)
        for name, optimizer in model.optimizer_dict.items():
            scalars[f"lr/{name}"] = float(optimizer.param_groups[0]["lr"])
        self._sums.clear()
        self._count = 0
        if self.run is not None:
            self.run.log(scalars, step=iteration)

    def on_validation_end(self, model: Any, loss_dict: dict | None = None, iteration: int = 0) -> None:
        if self.run is not None and loss_dict:
            self.run.log({f"val/{k}": float(v) for k, v in loss_dict.items()}, step=iteration)

    # ---- images --------------------------------------------------------------------------------------------
    def on_train_end(self, model: Any, iteration: int = 0) -> None:
        if self._last_image_iter != iteration:
            self._log_samples(model, iteration)

    def _log_samples(self, model: Any, iteration: int) -> None:
        if not dist_utils.is_rank0() or self.num_samples <= 0:
            return
        generator = torch.Generator().manual_seed(self.sample_seed)
        samples, labels = model.sample(self.num_samples, generator=generator)
        self._last_image_iter = iteration
        path = None
        if self.save_local_images:
            from fastgen.utils.images import save_samples_image

            path = save_samples_image(samples, Path(self.trainer.run_dir) / "samples" / f"iter_{iteration:07d}.png")
            self.trainer.last_sample_path = path
        if self.run is not None:
            import wandb

            caption = f"iteration {iteration}"
            if labels is not None:
                caption += "; labels row-major: " + " ".join(str(int(x)) for x in labels[: min(len(labels), 32)].tolist())
            if path is not None:
                self.run.log({"samples": wandb.Image(str(path), caption=caption)}, step=iteration)
