"""WandbCallback: Weights & Biases logging of scalars, sample media (images, videos, audio) and log modules.

Logged keys (all at ``step=iteration``, the number of completed optimizer steps):

* every scalar of ``loss_dict`` (``total_loss``, ...) - the trainer already averages each step's values over its
  ``R`` gradient-accumulation rounds; this callback averages them over the steps of the logging window
  (``trainer.logging_iter``) and then over ranks: ``logged = (1/W) sum_w (1/|S|) sum_{s in S} (1/R) sum_r
  loss_{w,s,r}`` for ``W`` ranks and window steps ``S`` (one all-reduce of all keys per window);
* ``<module>/<key>`` - the ``loss_dict`` a log module returns, aggregated the same way (window mean; its value is
  broadcast from rank 0 so every rank takes part in the all-reduce);
* what other callbacks report with ``trainer.log_scalar`` (``grad_norm``, ``ema/<name>_beta``, ...), as reported;
* ``lr/<optimizer>`` - each optimizer's current learning rate;
* ``val/<key>`` - validation losses (already averaged over batches and ranks by the trainer);
* ``samples`` - every ``sample_iter`` iterations and at the end of training, ``num_samples`` samples in total
  (rank ``r`` of ``W`` draws ``len(range(r, num_samples, W))`` of them with a private generator seeded
  ``sample_seed + r``, so logging never changes the training random stream), gathered to rank 0 and logged by
  their shape (``media="auto"``): ``(N, C, T, H, W)`` -> a looping GIF of the sample grid (``wandb.Video``, written
  with Pillow: no moviepy or ffmpeg); ``(N, C, H, W)`` -> an image grid (``wandb.Image``); ``(N, 2)`` toy points ->
  a scatter plot; ``(N, C, T)`` or ``(N, T)`` waveforms -> up to ``max_audio`` clips logged as ``samples/<k>``
  (``wandb.Audio`` of a 16-bit WAV written with the stdlib ``wave`` module: no soundfile); an audio-visual model's
  ``{"video", "audio"}`` samples -> the video GIF, and for the first ``max_audio`` samples their sound as
  ``samples/audio_<k>`` and the video with its sound track as ``samples/av_<k>`` (an MP4, PyAV). Local copies go
  to ``<run dir>/samples/iter_XXXXXXX.{png,gif}``, ``iter_XXXXXXX_<k>.wav`` and ``iter_XXXXXXX_{audio,av}_<k>.*``;
* ``<module>/<key>`` media - whatever the log modules return (see ``fastgen.callbacks.log_modules.base``).

A latent model's samples (a diffusers-backed network: SD, Flux, Wan) are decoded to pixels by its family's VAE,
read from ``model.pretrained_model_path`` at the first samples (``fastgen.networks.codecs``; no text encoder):
W&B shows images and videos, never raw latents - without a VAE there, samples are not logged (said once).

Samples come from the model's sampling network - the first EMA network when ``model.use_ema`` is set. EMA
callbacks update the EMA in ``on_training_step_end``, so to make "the samples of iteration k use the EMA after
update k" hold whatever the callback order, this callback does not sample (or flush scalars) inside its own
``on_training_step_end``: it marks the step and does the work at the next point after *every* callback's
``on_training_step_end`` has run - the next ``on_training_step_begin``, ``on_save_checkpoint_start`` or
``on_train_end``, whichever comes first. Nothing changes the weights between those points (validation runs
without gradients), so the result is the same as sampling at the very end of step ``k``; scalars that later
callbacks report during step ``k`` are logged with step ``k`` too.

Log modules (``log_modules={"name": LogModule}``): at each sample step every rank builds one ``MediaEntry`` per
sample (with ``metadata`` copied from the batch keys in ``metadata_keys``, e.g. camera poses and actions), the
entries are gathered to rank 0, and each module's ``process(entries, iteration)`` runs there; at the end of
training each module's ``close`` may return final results. A module that raises is reported with a warning and
skipped for that step (so one bad module cannot hang the other ranks at the next collective).

Mode: ``log_config.wandb_mode`` - ``online``, ``offline``, ``disabled``, or ``auto``: ``WANDB_MODE`` when set,
else online when an API key is available (``WANDB_API_KEY`` or ``credentials_dir/wandb_api.txt``) and
offline otherwise, with a one-line hint to upload later with ``wandb sync``. The W&B run id is stored in the run
directory (``wandb_run_id.txt``) so a resumed run continues the same W&B run. The logged config has secrets
redacted. With W&B disabled, samples are still drawn and saved locally and the log modules still run.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fastgen.callbacks.callback import Callback
from fastgen.callbacks.log_modules.base import LogModule, MediaEntry, gather_to_rank0
from fastgen.distributed import group as dist_utils
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

MEDIA_MODES = ("auto", "image", "video", "audio", "points")
DEFAULT_METADATA_KEYS = ("camera_poses", "intrinsics", "actions", "prompt", "caption")


def resolve_wandb_mode(configured: str) -> str:
    if configured != "auto":
        return configured
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if env in ("online", "offline", "disabled"):
        return env
    if env == "dryrun":
        return "offline"
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def _is_sharded(module: Any) -> bool:
    """True when ``module`` holds FSDP2-sharded parameters: every rank must then run its forward together."""
    from fastgen.distributed.parallelize import has_sharded_parameters

    return has_sharded_parameters(module)


def _start_wandb(wandb: Any, mode: str, **kwargs: Any) -> Any:
    """``wandb.init`` in ``mode``; a login or connection failure becomes a one-line ``UsageError`` (exit 2) that says
    how to go on without the server (the run directory this start created is then removed by the trainer)."""
    from fastgen.utils.errors import UsageError

    try:
        return wandb.init(mode=mode, settings=wandb.Settings(silent=True, console="off"), **kwargs)
    except wandb.errors.Error as exc:
        from fastgen.utils.secrets import redact_text, secret_values

        text = redact_text(" ".join(str(exc).split()), secret_values())
        if len(text) > 300:
            text = text[:300].rsplit(" ", 1)[0] + " ..."
        raise UsageError(
            f"W&B could not start in {mode} mode ({type(exc).__name__}: {text}); check WANDB_API_KEY (or "
            "credentials_dir/wandb_api.txt), or log without the server: - log_config.wandb_mode=offline"
        ) from None


def media_kind(samples: torch.Tensor, media: str = "auto") -> str:
    """The kind of media a batch of samples is: ``video`` (5-D), ``image`` (4-D), ``audio`` (3-D, or 2-D with
    more than 3 values per sample) or ``points`` (2-D with at most 3 values per sample); ``media`` forces one."""
    if media != "auto":
        return media
    if samples.dim() == 5:
        return "video"
    if samples.dim() == 4:
        return "image"
    if samples.dim() == 3:
        return "audio"
    if samples.dim() == 2:
        return "points" if samples.shape[1] <= 3 else "audio"
    raise ValueError(f"cannot tell what kind of media samples of shape {tuple(samples.shape)} are; set media=")


def _slice_rows(value: Any, count: int) -> Any:
    """The first ``count`` rows of a batch value (cycled when the batch is smaller), on the CPU."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 or value.shape[0] == 0:
            return None
        rows = torch.arange(count) % value.shape[0]
        return value.detach()[rows.to(value.device)].cpu()
    if isinstance(value, (list, tuple)) and value:
        return [value[i % len(value)] for i in range(count)]
    return None


class WandbCallback(Callback):
    def __init__(self, sample_iter: int = 1000, num_samples: int = 64, sample_seed: int = 0,
                 save_local_images: bool = True, media: str = "auto", video_fps: float = 8.0,
                 sample_rate: int = 16000, max_audio: int = 4,
                 metadata_keys: Sequence[str] = DEFAULT_METADATA_KEYS,
                 log_modules: Mapping[str, LogModule] | None = None,
                 module_close_timeout_s: float = 60.0) -> None:
        if media not in MEDIA_MODES:
            raise ValueError(f"media must be one of {', '.join(MEDIA_MODES)}; got {media!r}")
        self.sample_iter = int(sample_iter)
        self.num_samples = int(num_samples)
        self.sample_seed = int(sample_seed)
        self.save_local_images = save_local_images
        self.media = media
        self.video_fps = float(video_fps)
        self.sample_rate = int(sample_rate)
        self.max_audio = int(max_audio)
        self.metadata_keys = tuple(metadata_keys)
        self.log_modules: dict[str, LogModule] = {}
        for name, module in (log_modules or {}).items():
            if not isinstance(module, LogModule):
                raise TypeError(f"log_modules[{name!r}] is a {type(module).__name__}, not a LogModule")
            module.name = str(name)
            self.log_modules[str(name)] = module
        self.module_close_timeout_s = float(module_close_timeout_s)
        self.run: Any = None
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}
        self._flush_due: int | None = None
        self._sample_due: int | None = None
        self._sample_metadata: dict[str, Any] = {}
        self._last_sample_iter = -1
        self._modules_closed = False
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._vae: Any = None  # a latent model's VAE (a codec without text encoders), loaded at the first samples

    # ---- setup / teardown ----------------------------------------------------------------------------------
    def on_train_begin(self, model: Any, iteration: int = 0) -> None:
        run_dir = Path(self.trainer.run_dir)
        for module in self.log_modules.values():
            module.setup(run_dir, dist_utils.is_rank0())
        if not dist_utils.is_rank0():
            return
        mode = resolve_wandb_mode(self.config.log_config.wandb_mode)
        if mode == "disabled":
            logger.info("W&B logging is disabled")
            return
        import wandb

        from fastgen.configs.config_utils import config_to_dict

        id_file = run_dir / "wandb_run_id.txt"
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        if not run_id:
            from fastgen.utils.io import atomic_write_text

            run_id = secrets.token_hex(4)
            atomic_write_text(id_file, run_id + "\n")
        log = self.config.log_config
        self.run = _start_wandb(
            wandb,
            mode,
            project=log.project,
            group=log.group,
            name=log.name,
            entity=log.wandb_entity,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=config_to_dict(self.config),
        )
        if mode == "offline":
            sync_dir = str(Path(self.run.dir).parent)  # <run dir>/wandb/offline-run-*/files -> the run folder
            reason = "no API key found" if not os.environ.get("WANDB_API_KEY") else "offline mode"
            logger.info("W&B: %s, logging offline to %s (upload later with `wandb sync %s`)", reason, sync_dir, sync_dir)

    def on_app_end(self) -> None:
        if not self._modules_closed:  # training raised: stop the modules' background work, log nothing more
            self._modules_closed = True
            for name, module in self.log_modules.items():
                try:
                    module.close(timeout_s=min(self.module_close_timeout_s, 5.0))
                except Exception:  # noqa: BLE001 - shutting down after an error: report, do not mask it
                    logger.warning("log module %r failed to close", name, exc_info=True)
        if self.run is not None:
            self.run.finish(exit_code=1 if self.trainer.exception is not None else 0)
            self.run = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # ---- the step: accumulate now, sample and flush once every callback has finished the step --------------
    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0) -> None:
        self._accumulate(loss_dict)
        if iteration % self.config.trainer.logging_iter == 0 or iteration == self.config.trainer.max_iter:
            self._flush_due = iteration
        if self.sample_iter > 0 and iteration % self.sample_iter == 0:
            self._sample_due = iteration
        if self._sample_due == iteration or iteration == self.config.trainer.max_iter:  # incl. the final samples
            self._sample_metadata = self._batch_metadata(data_batch)

    def on_training_step_begin(self, model: Any, iteration: int = 0) -> None:
        if self._sample_due is not None or self._flush_due is not None:
            self._after_step(model)

    def on_save_checkpoint_start(self, model: Any, iteration: int = 0) -> None:
        if self._sample_due is not None or self._flush_due is not None:
            self._after_step(model)

    def on_train_end(self, model: Any, iteration: int = 0) -> None:
        self._after_step(model)
        if self._last_sample_iter != iteration:
            self._log_samples(model, iteration)
        self._close_modules(iteration)
        if self._sums or self._flush_due is not None:
            self._flush_scalars(model, iteration)

    def _after_step(self, model: Any) -> None:
        if self._sample_due is not None:
            iteration, self._sample_due = self._sample_due, None
            self._log_samples(model, iteration)
        if self._flush_due is not None:
            iteration, self._flush_due = self._flush_due, None
            self._flush_scalars(model, iteration)

    # ---- scalars -------------------------------------------------------------------------------------------
    def _accumulate(self, values: Mapping[str, Any]) -> None:
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    continue
                value = value.detach().float().reshape(())
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                value = torch.tensor(float(value))
            else:
                continue
            self._sums[key] = self._sums[key] + value if key in self._sums else value.clone()
            self._counts[key] = self._counts.get(key, 0) + 1

    def _flush_scalars(self, model: Any, iteration: int) -> None:
        keys = sorted(self._sums)  # identical order on every rank for the all-reduce
        scalars: dict[str, float] = {}
        if keys:
            device = getattr(self.trainer, "device", torch.device("cpu"))
            means = torch.stack([(self._sums[k] / self._counts[k]).to(device, torch.float32) for k in keys])
            dist_utils.all_reduce_mean(means)  # one collective for every key: the mean over ranks
            scalars.update(zip(keys, means.tolist()))
        for key, value in self.trainer.pop_scalars().items():
            scalars[key] = float(value)
        for name, optimizer in model.optimizer_dict.items():
            scalars[f"lr/{name}"] = float(optimizer.param_groups[0]["lr"])
        self._sums.clear()
        self._counts.clear()
        if self.run is not None:
            self.run.log(scalars, step=iteration)

    def on_validation_end(self, model: Any, loss_dict: dict | None = None, iteration: int = 0) -> None:
        if self.run is not None and loss_dict:
            self.run.log({f"val/{k}": float(v) for k, v in loss_dict.items()}, step=iteration)

    # ---- samples -------------------------------------------------------------------------------------------
    def _batch_metadata(self, data_batch: Any) -> dict[str, Any]:
        if not isinstance(data_batch, Mapping) or self.num_samples <= 0:
            return {}
        count = len(range(dist_utils.get_rank(), self.num_samples, dist_utils.get_world_size()))
        found = {}
        for key in self.metadata_keys:
            if key in data_batch:
                rows = _slice_rows(data_batch[key], count)
                if rows is not None:
                    found[key] = rows
        return found

    def local_entries(self, model: Any, iteration: int) -> list[MediaEntry]:
        """This rank's share of the samples as ``MediaEntry`` objects (CPU tensors)."""
        rank, world = dist_utils.get_rank(), dist_utils.get_world_size()
        count = len(range(rank, self.num_samples, world))
        if count <= 0:
            if _is_sharded(model.sampling_net()):  # its forward is a collective: take part, keep nothing
                model.sample(1, generator=torch.Generator().manual_seed(self.sample_seed + rank))
            return []
        generator = torch.Generator().manual_seed(self.sample_seed + rank)
        samples, labels = model.sample(count, generator=generator)
        sound, rate = None, None
        if isinstance(samples, dict):  # an audio-visual model: the video with its sound track
            found = self._audio_visual(model, samples)
            if found is None:
                return []
            samples, sound, rate = found
        samples = self._viewable(model, samples.detach())
        if samples is None:
            return []
        samples = samples.float().cpu()
        kind = media_kind(samples, self.media)
        label_list = labels.tolist() if labels is not None else [None] * count
        metadata = self._sample_metadata
        entries = []
        for i in range(count):
            meta = {key: value[i] for key, value in metadata.items()}
            caption = meta.get("prompt") or meta.get("caption")
            if caption is None and label_list[i] is not None:
                caption = f"label {int(label_list[i])}"
            entries.append(MediaEntry(
                kind=kind, data=samples[i], iteration=iteration, rank=rank, index=i,
                label=None if label_list[i] is None else int(label_list[i]),
                caption=None if caption is None else str(caption),
                fps=self.video_fps if kind == "video" else None,
                sample_rate=rate if sound is not None else self.sample_rate if kind == "audio" else None,
                metadata=meta, audio=sound[i] if sound is not None else None,
            ))
        return entries

    def _audio_visual(self, model: Any, samples: dict[str, torch.Tensor]
                      ) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """``(videos, waveforms, sample_rate)`` of an audio-visual model's ``{"video", "audio"}`` samples, the audio
        rendered as its data set says (``fastgen.evaluation.sampling.audio_renderer``); None (said once) when
        there is no way to play it."""
        from fastgen.evaluation.sampling import audio_renderer, dataset_of_config

        renderer = audio_renderer(dataset_of_config(self.trainer.config)) if set(samples) == {"video", "audio"} else None
        if renderer is None:
            if not getattr(self, "_said_no_sound", False):
                logger.warning("W&B samples of this multimodal model (%s) are not logged: no renderer for its audio",
                               ", ".join(sorted(samples)))
                self._said_no_sound = True
            return None
        render, rate = renderer
        return samples["video"], render(samples["audio"].detach().float().cpu()), int(rate)

    def _viewable(self, model: Any, samples: torch.Tensor) -> torch.Tensor | None:
        """Samples as pixels: a latent model's (a diffusers-backed network) decoded by its family's VAE from
        ``model.pretrained_model_path`` - never raw latents; None when that folder has no VAE to decode with
        (said once). Other models' samples as they are, and so a diffusers network's trained on a pixel data set
        (the moving digits' Wan and LTX-2)."""
        from fastgen.evaluation.sampling import PIXEL_DATASETS, dataset_of_config
        from fastgen.networks.diffusers_nets import DiffusersBackbone

        if not isinstance(getattr(model.net, "backbone", None), DiffusersBackbone):
            return samples
        pixels = dataset_of_config(self.trainer.config) in PIXEL_DATASETS
        if pixels and not getattr(model.config, "pretrained_model_path", None):  # a diffusers network on pixels
            return samples
        if self._vae is None:
            from fastgen.networks.codecs import load_codec
            from fastgen.utils.errors import UsageError

            folder = getattr(model.config, "pretrained_model_path", None)
            try:
                if not folder:
                    raise UsageError("model.pretrained_model_path is not set")
                self._vae = load_codec(folder, text=False).to(samples.device)
            except UsageError as exc:
                logger.warning("W&B samples of this latent model are not logged: no VAE to decode them (%s)", exc)
                self._vae = False
        if self._vae is False:
            return None
        return self._vae.decode_latents(samples).clamp(-1, 1)

    def _log_samples(self, model: Any, iteration: int) -> None:
        if self.num_samples <= 0:
            return
        self._last_sample_iter = iteration
        gathered = gather_to_rank0(self.local_entries(model, iteration))
        self._sample_metadata = {}
        module_scalars: dict[str, float] = {}
        if gathered is not None:  # rank 0
            entries = [entry for rank_entries in gathered for entry in rank_entries]
            if entries:
                self._log_media(entries, iteration)
            for name, module in self.log_modules.items():
                try:
                    result = module.process(entries, iteration)
                except Exception:  # noqa: BLE001 - a faulty module must not stop training or hang the ranks
                    logger.warning("log module %r failed at iteration %d", name, iteration, exc_info=True)
                    continue
                module_scalars.update(self._log_module_result(name, result, iteration))
        if self.log_modules:
            module_scalars = dist_utils.broadcast_object(module_scalars)  # the same keys on every rank
            self._accumulate(module_scalars)

    def _media_dir(self) -> Path:
        if self.save_local_images:
            return Path(self.trainer.run_dir) / "samples"
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="fastgen-wandb-media-")
        return Path(self._tmp.name)

    def _log_media(self, entries: list[MediaEntry], iteration: int) -> None:
        from fastgen.utils.images import save_samples_image, save_samples_video

        kind = entries[0].kind
        if not self.save_local_images and self.run is None:
            return
        folder = self._media_dir()
        caption = f"iteration {iteration}"
        labels = [e.label for e in entries if e.label is not None]
        if labels:
            caption += "; labels row-major: " + " ".join(str(x) for x in labels[:32])
        logged: Any = None
        if kind in ("image", "points"):
            data = torch.stack([e.data for e in entries])
            if kind == "points":
                data = data[:, :2] if data.shape[1] >= 2 else torch.cat([data, torch.zeros_like(data)], dim=1)
            path = save_samples_image(data, folder / f"iter_{iteration:07d}.png")
            if self.save_local_images:
                self.trainer.last_sample_path = path
            if self.run is not None:
                import wandb

                logged = wandb.Image(str(path), caption=caption)
        elif kind == "video":
            path = save_samples_video(torch.stack([e.data for e in entries]), folder / f"iter_{iteration:07d}.gif",
                                      fps=self.video_fps)
            if self.save_local_images:
                self.trainer.last_sample_path = path
            if self.run is not None:
                import wandb

                logged = wandb.Video(str(path), format="gif", caption=caption)  # a file path: no moviepy needed
            if entries[0].audio is not None:
                self._log_sound_tracks(entries, folder, iteration)
        elif kind == "audio":
            from fastgen.callbacks.log_modules.media import save_wav

            clips = []
            for k, entry in enumerate(entries[: max(self.max_audio, 0)]):
                path = save_wav(entry.data, entry.sample_rate or self.sample_rate, folder / f"iter_{iteration:07d}_{k}.wav")
                clips.append((path, entry))
            if clips and self.save_local_images:
                self.trainer.last_sample_path = clips[0][0]
            if self.run is not None and clips:
                import wandb

                # wandb.Audio(numpy) and lists of wandb.Audio need soundfile; one WAV file per key does not.
                self.run.log({f"samples/{k}": wandb.Audio(str(p), sample_rate=e.sample_rate or self.sample_rate,
                                                          caption=e.caption or f"iteration {iteration} sample {k}")
                              for k, (p, e) in enumerate(clips)}, step=iteration)
        if logged is not None and self.run is not None:
            self.run.log({"samples": logged}, step=iteration)

    def _log_sound_tracks(self, entries: list[MediaEntry], folder: Path, iteration: int) -> None:
        """The first ``max_audio`` audio-visual samples: each one's sound as ``samples/audio_<k>`` (a WAV) and the
        video with its sound as ``samples/av_<k>`` (an MP4 with an AAC track; local copies beside the GIF)."""
        from fastgen.callbacks.log_modules.media import save_wav
        from fastgen.pipelines.media import write_mp4
        from fastgen.utils.images import to_uint8

        logged: dict[str, Any] = {}
        for k, entry in enumerate(entries[: max(self.max_audio, 0)]):
            assert entry.audio is not None and entry.sample_rate
            wav = save_wav(entry.audio, entry.sample_rate, folder / f"iter_{iteration:07d}_audio_{k}.wav")
            frames = to_uint8(entry.data.transpose(0, 1)).numpy()  # (T, H, W, C)
            upscale = max(1, 64 // frames.shape[2])
            frames = frames.repeat(upscale, axis=1).repeat(upscale, axis=2)
            seconds = entry.audio.shape[-1] / entry.sample_rate
            mp4 = folder / f"iter_{iteration:07d}_av_{k}.mp4"
            write_mp4(mp4, frames, fps=max(1, round(frames.shape[0] / seconds)), audio=entry.audio.numpy(),
                      sample_rate=entry.sample_rate)
            if self.run is not None:
                import wandb

                caption = entry.caption or f"iteration {iteration} sample {k}"
                logged[f"samples/audio_{k}"] = wandb.Audio(str(wav), sample_rate=entry.sample_rate, caption=caption)
                logged[f"samples/av_{k}"] = wandb.Video(str(mp4), format="mp4", caption=caption)
        if logged:
            self.run.log(logged, step=iteration)

    def _log_module_result(self, name: str, result: Any, iteration: int) -> dict[str, float]:
        """Split what a module returned into scalars (returned, for aggregation) and media (logged now)."""
        if not result:
            return {}
        if not isinstance(result, Mapping):
            logger.warning("log module %r returned a %s, not a dict; ignored", name, type(result).__name__)
            return {}
        scalars: dict[str, float] = {}
        for key, value in dict(result.get("loss_dict") or {}).items():
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = float(value.detach())
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                scalars[f"{name}/{key}"] = float(value)
        media = {f"{name}/{key}": value for key, value in result.items() if key != "loss_dict" and value is not None}
        if media and self.run is not None:
            self.run.log({key: self._to_wandb(value) for key, value in media.items()}, step=iteration)
        return scalars

    @staticmethod
    def _to_wandb(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [WandbCallback._to_wandb(v) for v in value]
        try:
            from PIL import Image
        except ImportError:  # pragma: no cover - Pillow is a dependency
            return value
        if isinstance(value, Image.Image):
            import wandb

            return wandb.Image(value)
        return value

    def _close_modules(self, iteration: int) -> None:
        if self._modules_closed or not self.log_modules:
            self._modules_closed = True
            return
        self._modules_closed = True
        module_scalars: dict[str, float] = {}
        if dist_utils.is_rank0():
            for name, module in self.log_modules.items():
                try:
                    result = module.close(timeout_s=self.module_close_timeout_s)
                except Exception:  # noqa: BLE001
                    logger.warning("log module %r failed to close", name, exc_info=True)
                    continue
                module_scalars.update(self._log_module_result(name, result, iteration))
        module_scalars = dist_utils.broadcast_object(module_scalars)
        self._accumulate(module_scalars)
