"""GPUStatsCallback: device and host memory, and GPU utilisation, once per logging window.

Every ``every_n`` optimizer steps (default: ``trainer.logging_iter``, and at the last step) each rank samples
its own device, the values are reduced over all ranks, and the results go to ``trainer.log_scalar`` (so the W&B
callback logs them - place this callback before ``wandb`` so they land in the same window).

On CUDA, per rank, then reduced to ``/min``, ``/avg`` (``sum / n_ranks_reporting``) and ``/max`` over ranks:

* ``gpu/mem_used_gb`` and ``gpu/mem_total_gb`` - the whole device as NVML sees it (``nvmlDeviceGetMemoryInfo``),
  other processes included: what decides whether the next allocation fits.
* ``gpu/util`` - percent of the last NVML sample period (1/6 s to 1 s, driver dependent) in which a kernel ran
  (``nvmlDeviceGetUtilizationRates().gpu``); a snapshot, not a window average.
* ``gpu/alloc_peak_gb`` / ``gpu/reserved_peak_gb`` - ``torch.cuda.max_memory_allocated`` / ``..._reserved`` since
  the previous report: the peaks are reset after every report (``torch.cuda.reset_peak_memory_stats``), so
  each value describes one window, not the whole run.

The spread over ranks is the point: ``max`` says how close the worst rank is to running out, and a large
``max - min`` shows imbalance. The reduction is two ``all_reduce`` calls per report (MIN over ``[x, -x]``, which
gives min and max at once, and SUM over ``[x, present]``); a value a rank could not read (NVML error) is left
out of the reduction on that rank instead of being counted as zero.

NVML (package ``nvidia-ml-py``, imported lazily) is optional: if it is missing or a query fails, that query's
keys are left out of the report, a warning is logged once, and the allocator keys still appear.

Always, for this process (rank 0's values, as only rank 0 logs): ``host/rss_gb`` (resident set size, from
``/proc/self/status``; falls back to the peak, ``host/rss_peak_gb``, from ``getrusage`` where there is no
``/proc``) and ``host/available_gb`` (``MemAvailable`` in ``/proc/meminfo``: memory the system can give out
without swapping). Without a GPU only these are logged, and the callback says once that there is no GPU.

Sizes are GiB (2**30 bytes), written ``_gb`` for brevity.
"""

from __future__ import annotations

import math
import os
import resource
import sys
from collections.abc import Sequence
from typing import Any

import torch

from fastgen.callbacks.callback import Callback
from fastgen.distributed import group as dist_utils
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

GIB = float(2**30)

# The per-rank GPU metrics, in the fixed order every rank reduces them in (the order must match across ranks).
GPU_METRICS: tuple[str, ...] = (
    "gpu/mem_used_gb",
    "gpu/mem_total_gb",
    "gpu/util",
    "gpu/alloc_peak_gb",
    "gpu/reserved_peak_gb",
)


def reduce_min_avg_max(values: Sequence[float | None], device: torch.device | str | None = None,
                       ) -> list[tuple[float, float, float] | None]:
    """``(min, mean, max)`` over ranks of each value; ``None`` where no rank had a value.

    Every rank must call this with the same number of values, in the same order. A ``None`` on one rank leaves
    that rank out of the statistics for that value (the mean divides by the ranks that reported). Works without
    a process group (the statistics of one rank). ``device`` is where the reduced tensors live: it must suit the
    backend (CUDA for NCCL); by default CUDA when the backend is NCCL, else CPU.
    """
    n = len(values)
    if device is None:
        device = "cpu"
        if dist_utils.is_initialized() and "nccl" in str(torch.distributed.get_backend()).lower():
            device = torch.device("cuda", torch.cuda.current_device())
    present = [v is not None and math.isfinite(float(v)) for v in values]
    xs = [float(v) if ok else 0.0 for v, ok in zip(values, present)]  # type: ignore[arg-type]
    inf = math.inf
    # MIN over [x, -x] yields min(x) and -max(x) in one collective; a missing value is +inf in both halves.
    mins = torch.tensor([x if ok else inf for x, ok in zip(xs, present)]
                        + [-x if ok else inf for x, ok in zip(xs, present)], dtype=torch.float64, device=device)
    sums = torch.tensor(xs + [1.0 if ok else 0.0 for ok in present], dtype=torch.float64, device=device)
    if dist_utils.is_initialized() and dist_utils.get_world_size() > 1:
        torch.distributed.all_reduce(mins, op=torch.distributed.ReduceOp.MIN)
        torch.distributed.all_reduce(sums, op=torch.distributed.ReduceOp.SUM)
    mins_l, sums_l = mins.tolist(), sums.tolist()
    out: list[tuple[float, float, float] | None] = []
    for i in range(n):
        count = sums_l[n + i]
        if count <= 0:
            out.append(None)
        else:
            out.append((mins_l[i], sums_l[i] / count, -mins_l[n + i]))
    return out


def host_memory() -> dict[str, float]:
    """This process's resident memory and the system's available memory, in GiB (keys as logged).

    ``/proc`` first (Linux): it gives the *current* RSS. Elsewhere ``getrusage`` gives only the peak, which is
    logged under its own name so it is never mistaken for the current value.
    """
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["host/rss_gb"] = int(line.split()[1]) * 1024 / GIB  # the kernel reports kB
                    break
    except (OSError, ValueError, IndexError):
        pass
    if "host/rss_gb" not in out:
        try:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
            out["host/rss_peak_gb"] = peak / GIB if sys.platform == "darwin" else peak * 1024 / GIB
        except (OSError, ValueError):
            pass
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    out["host/available_gb"] = int(line.split()[1]) * 1024 / GIB
                    break
    except (OSError, ValueError, IndexError):
        pass
    if "host/available_gb" not in out:
        try:
            out["host/available_gb"] = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GIB
        except (OSError, ValueError, AttributeError):
            pass
    return out


class GPUStatsCallback(Callback):
    def __init__(self, every_n: int | None = None) -> None:
        if every_n is not None and int(every_n) < 1:
            raise ValueError(f"GPUStatsCallback(every_n={every_n}): use a positive number of steps, or None")
        self.every_n = None if every_n is None else int(every_n)
        self.last_report: dict[str, float] = {}
        self._device: torch.device | None = None
        self._nvml: Any = None  # the pynvml module once initialised; None when unused or failed
        self._nvml_handle: Any = None
        self._nvml_warned = False
        self._said_no_gpu = False

    # ---- setup ---------------------------------------------------------------------------------------------
    def on_train_begin(self, model: Any, iteration: int = 0) -> None:
        if self.every_n is None:
            self.every_n = int(self.config.trainer.logging_iter)
        device = torch.device(self.trainer.device)
        if device.type == "cuda" and torch.cuda.is_available():
            self._device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
            self._init_nvml(self._device.index)
            torch.cuda.reset_peak_memory_stats(self._device)
        else:
            self._device = None
            if not self._said_no_gpu:
                self._said_no_gpu = True
                logger.info("GPU stats: no GPU (training on %s); logging host memory only", device)

    def _init_nvml(self, index: int) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml_handle = self._find_handle(pynvml, index)
            self._nvml = pynvml
        except Exception as exc:  # ImportError, NVMLError_* (no driver, no permission, ...): NVML is optional
            self._nvml = self._nvml_handle = None
            self._warn_nvml(exc)

    @staticmethod
    def _find_handle(pynvml: Any, index: int) -> Any:
        """The NVML handle of torch's CUDA device ``index``.

        NVML numbers devices ignoring ``CUDA_VISIBLE_DEVICES``, so torch's index is not NVML's: match by UUID
        when torch exposes it, else map through ``CUDA_VISIBLE_DEVICES`` when it lists plain indices.
        """
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:
            text = str(uuid)
            for candidate in (text, f"GPU-{text}"):
                try:
                    return pynvml.nvmlDeviceGetHandleByUUID(candidate)
                except Exception:  # noqa: BLE001 - try the other spelling, then the index mapping
                    continue
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        if visible:
            entries = [e.strip() for e in visible.split(",") if e.strip()]
            if index < len(entries) and entries[index].isdigit():
                return pynvml.nvmlDeviceGetHandleByIndex(int(entries[index]))
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def _warn_nvml(self, exc: BaseException) -> None:
        if not self._nvml_warned:
            self._nvml_warned = True
            logger.warning("GPU stats: NVML failed (%s: %s); its keys are left out where it keeps failing",
                           type(exc).__name__, exc)

    # ---- sampling ------------------------------------------------------------------------------------------
    def sample_gpu(self) -> list[float | None]:
        """This rank's values of ``GPU_METRICS`` (``None`` where unreadable); resets the allocator peaks."""
        assert self._device is not None
        used = total = util = None
        if self._nvml is not None:
            # Each query on its own: some devices (MIG slices, some vGPUs) answer memory but not utilisation.
            try:
                mem = self._nvml.nvmlDeviceGetMemoryInfo(self._nvml_handle)
                used, total = mem.used / GIB, mem.total / GIB
            except Exception as exc:  # noqa: BLE001 - a transient NVML error must not stop training
                self._warn_nvml(exc)
            try:
                util = float(self._nvml.nvmlDeviceGetUtilizationRates(self._nvml_handle).gpu)
            except Exception as exc:  # noqa: BLE001
                self._warn_nvml(exc)
        alloc = torch.cuda.max_memory_allocated(self._device) / GIB
        reserved = torch.cuda.max_memory_reserved(self._device) / GIB
        torch.cuda.reset_peak_memory_stats(self._device)
        return [used, total, util, alloc, reserved]

    def collect(self) -> dict[str, float]:
        """Every scalar of one report (collective on the CUDA path: all ranks must call it together)."""
        report: dict[str, float] = {}
        if self._device is not None:
            stats = reduce_min_avg_max(self.sample_gpu())
            for name, stat in zip(GPU_METRICS, stats):
                if stat is None:
                    continue
                report[f"{name}/min"], report[f"{name}/avg"], report[f"{name}/max"] = stat
        report.update(host_memory())
        return report

    def on_training_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                             iteration: int = 0) -> None:
        every = self.every_n or int(self.config.trainer.logging_iter)
        if iteration % every != 0 and iteration != self.config.trainer.max_iter:
            return
        self.last_report = self.collect()
        for key, value in self.last_report.items():
            self.trainer.log_scalar(key, value)

    def on_app_end(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a library we only read from
                pass
            self._nvml = self._nvml_handle = None
