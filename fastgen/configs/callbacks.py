"""Callback presets. Compose them as dictionaries; callbacks run in dictionary order::

    from fastgen.configs.callbacks import WANDB_CALLBACK, GradClip_CALLBACK, EMA_CALLBACK
    from omegaconf import DictConfig
    config.trainer.callbacks = DictConfig({**GradClip_CALLBACK, **EMA_CALLBACK, **WANDB_CALLBACK})

Each preset is ``{name: LazyCall(CallbackClass)(...)}``; the name is the key under which the callback's state
is saved in checkpoints. Place EMA callbacks before ``wandb`` so that logged samples use the updated EMA.
"""

from __future__ import annotations

from omegaconf import DictConfig

from fastgen.configs.instantiate import LazyCall

EMA_CALLBACK: dict[str, DictConfig] = {
    "ema": LazyCall("fastgen.callbacks.ema.EMACallback")(ema_name="ema", type="constant", beta=0.999, start_iter=0),
}
EMA_POWER_CALLBACK: dict[str, DictConfig] = {
    "ema": LazyCall("fastgen.callbacks.ema.EMACallback")(ema_name="ema", type="power", gamma=6.94),
}
EMA_HALFLIFE_CALLBACK: dict[str, DictConfig] = {
    "ema": LazyCall("fastgen.callbacks.ema.EMACallback")(ema_name="ema", type="halflife", halflife_kimg=500.0, rampup_ratio=0.05),
}
# EDM2's post-hoc EMA pair (Karras et al. 2024, Sec. 3.2): power EMAs of sigma_rel 0.05 and 0.10 that write
# snapshots every 500 network updates; set model.use_ema=[ema_005, ema_010] and reconstruct any width afterwards
# with `fastgen ema RUN --sigma-rel S` (fastgen.utils.posthoc_ema).
POSTHOC_EMA_CALLBACKS: dict[str, DictConfig] = {
    name: LazyCall("fastgen.callbacks.ema.EMACallback")(ema_name=name, type="power", sigma_rel=sigma, snapshot_iter=500)
    for name, sigma in (("ema_005", 0.05), ("ema_010", 0.10))
}
GradClip_CALLBACK: dict[str, DictConfig] = {
    "grad_clip": LazyCall("fastgen.callbacks.grad_clip.GradClipCallback")(grad_norm=1.0, max_consecutive_nonfinite=20),
}
# float16 autocast's dynamic loss scaling; the trainer adds it with these defaults when model.precision_amp=float16
LOSS_SCALE_CALLBACK: dict[str, DictConfig] = {
    "loss_scale": LazyCall("fastgen.callbacks.loss_scale.LossScaleCallback")(
        init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000),
}
WANDB_CALLBACK: dict[str, DictConfig] = {
    "wandb": LazyCall("fastgen.callbacks.wandb.WandbCallback")(sample_iter=1000, num_samples=64),
}
GPU_STATS_CALLBACK: dict[str, DictConfig] = {
    "gpu_stats": LazyCall("fastgen.callbacks.gpu_stats.GPUStatsCallback")(every_n=None),
}
TRAIN_PROFILER_CALLBACK: dict[str, DictConfig] = {
    "train_profiler": LazyCall("fastgen.callbacks.train_profiler.TrainProfilerCallback")(every_n=None, sync_device=True),
}
PARAM_COUNT_CALLBACK: dict[str, DictConfig] = {
    "param_count": LazyCall("fastgen.callbacks.param_count.ParamCountCallback")(),
}
RANK_CONSISTENCY_CALLBACK: dict[str, DictConfig] = {
    "rank_consistency": LazyCall("fastgen.callbacks.rank_consistency.RankConsistencyCallback")(every_n=100, check_params=False),
}
# EDM2 forced weight normalisation of magnitude-preserving layers (fastgen.networks.edm2), before each step.
FORCED_WEIGHT_NORM_CALLBACK: dict[str, DictConfig] = {
    "forced_weight_norm": LazyCall("fastgen.callbacks.forced_weight_norm.ForcedWeightNormCallback")(),
}
CT_SCHEDULE_CALLBACK: dict[str, DictConfig] = {
    "ct_schedule": LazyCall("fastgen.callbacks.ct_schedule.CTScheduleCallback")(q=2.0, ratio_limit=0.999, kimg_per_stage=100.0),
}
# Method-owned state carried across iterations, committed only after completed steps (fastgen.callbacks.carry).
CARRY_CALLBACK: dict[str, DictConfig] = {
    "carry": LazyCall("fastgen.callbacks.carry.CarryCallback")(carry_through_validation=False, check_finite=True),
}
# Memory profiling: records iterations [start_iter, start_iter + num_iters) and writes an HTML report (default
# <run dir>/memory/memory_report.html) with the raw snapshot beside it; put it first to mark phases precisely.
MEM_TRACKER_CALLBACK: dict[str, DictConfig] = {
    "mem_tracker": LazyCall("fastgen.callbacks.mem_tracker.MemTrackerCallback")(start_iter=0, num_iters=2, output=None, estimate=True),
}
# W&B with log modules (fastgen.callbacks.log_modules): each is a whole "wandb" entry, so
# ``config.trainer.callbacks.update(VLM_VID_CALLBACK)`` replaces the plain W&B callback in place (same name, same
# position after the EMA callbacks). To combine modules, give one wandb entry several ``log_modules``.
# VLM judge: set VLM_BASE_URL and OPENAI_API_KEY (or credentials_dir/openai_api.txt).
VLM_IMG_CALLBACK: dict[str, DictConfig] = {
    "wandb": LazyCall("fastgen.callbacks.wandb.WandbCallback")(
        sample_iter=1000, num_samples=64,
        log_modules={"vlm": LazyCall("fastgen.callbacks.log_modules.vlm.VLMLogger")(media="image", max_entries_per_step=4)},
    ),
}
VLM_VID_CALLBACK: dict[str, DictConfig] = {
    "wandb": LazyCall("fastgen.callbacks.wandb.WandbCallback")(
        sample_iter=1000, num_samples=8,
        log_modules={"vlm": LazyCall("fastgen.callbacks.log_modules.vlm.VLMLogger")(
            media="video", num_frames=4, max_entries_per_step=4)},
    ),
}
# Camera trajectories and action overlays for batches with camera_poses / intrinsics / actions.
VIPE_CALLBACK: dict[str, DictConfig] = {
    "wandb": LazyCall("fastgen.callbacks.wandb.WandbCallback")(
        sample_iter=1000, num_samples=8,
        log_modules={"vipe": LazyCall("fastgen.callbacks.log_modules.vipe.VipeLogger")(pose_convention="c2w")},
    ),
}
# The callbacks every recipe starts from; EMA presets go before these (see the module docstring).
BASE_CALLBACKS: dict[str, DictConfig] = {
    **GradClip_CALLBACK,
    **WANDB_CALLBACK,
}
