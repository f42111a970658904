"""GPUStatsCallback: host memory without a GPU, the CUDA/NVML path with stand-ins, and the reduction over ranks.

The CUDA path is exercised with a fake ``pynvml`` and fake allocator counters (this suite must pass on machines
without a GPU); the all-ranks reduction runs in a real two-process gloo group.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from fastgen.callbacks import gpu_stats
from fastgen.callbacks.gpu_stats import GIB, GPU_METRICS, GPUStatsCallback, host_memory, reduce_min_avg_max
from fastgen.trainer import Trainer
from fastgen_testing import tiny_toy_config, free_port, join_ranks, shutdown_gloo


# ---- no GPU: a real training run ---------------------------------------------------------------------------------
def test_without_gpu_logs_host_memory_and_says_so_once(fastgen_records: pytest.LogCaptureFixture) -> None:
    if torch.cuda.is_available():
        pytest.skip("this test is about machines without a GPU")
    stats = GPUStatsCallback()
    trainer = Trainer(tiny_toy_config("gpu_stats_cpu", max_iter=5), extra_callbacks={"gpu_stats": stats})
    logged: list[tuple[str, Any]] = []
    original = trainer.log_scalar
    trainer.log_scalar = lambda key, value: (logged.append((key, value)), original(key, value))  # type: ignore[method-assign]
    trainer.run()

    no_gpu = [r for r in fastgen_records.records if "no GPU" in r.getMessage()]
    assert len(no_gpu) == 1 and no_gpu[0].levelno == logging.INFO
    assert stats.every_n == 2  # the tiny config's logging_iter
    report = stats.last_report
    assert set(report) == {"host/rss_gb", "host/available_gb"}
    assert 0 < report["host/rss_gb"] < 1024
    assert 0 < report["host/available_gb"] < 1024 * 1024
    # Reports at steps 2, 4 and the last one, 5, through trainer.log_scalar.
    assert [key for key, _ in logged if key == "host/rss_gb"] == ["host/rss_gb"] * 3
    assert not any(key.startswith("gpu/") for key, _ in logged)


def test_host_memory_matches_proc() -> None:
    values = host_memory()
    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc on this system")
    # The current RSS, not a stale figure: a touched 64 MiB tensor is resident, so RSS is at least that.
    big = torch.ones(64 * 2**20 // 4)
    after = host_memory()
    assert after["host/rss_gb"] * GIB > big.numel() * big.element_size()
    assert values["host/available_gb"] > 0


# ---- the CUDA path with stand-ins --------------------------------------------------------------------------------
class FakeNVML(types.ModuleType):
    """What GPUStatsCallback uses of pynvml, with values chosen by the test."""

    def __init__(self, fail_util: bool = False, fail_init: bool = False) -> None:
        super().__init__("pynvml")
        self.fail_util, self.fail_init = fail_util, fail_init
        self.shutdowns = 0
        self.handles: list[str] = []

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if not uuid.startswith("GPU-"):
            raise RuntimeError("not found")
        self.handles.append(uuid)
        return uuid

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"index-{index}"

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        return types.SimpleNamespace(used=30 * GIB, total=80 * GIB, free=50 * GIB)

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        if self.fail_util:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return types.SimpleNamespace(gpu=87, memory=40)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"reset": 0}
    peaks = iter([(2.0, 3.0), (1.0, 3.5)] * 10)
    current: dict[str, float] = {}

    def max_allocated(device: Any = None) -> float:
        current["alloc"], current["reserved"] = next(peaks)
        return current["alloc"] * GIB

    def max_reserved(device: Any = None) -> float:
        return current["reserved"] * GIB

    def reset(device: Any = None) -> None:
        calls["reset"] += 1

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", max_allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", max_reserved)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: types.SimpleNamespace(uuid="1234-abcd", name="Fake GPU"))
    return calls


def _cuda_callback(monkeypatch: pytest.MonkeyPatch, nvml: Any) -> GPUStatsCallback:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    callback = GPUStatsCallback(every_n=1)
    callback._device = torch.device("cuda", 0)
    callback._init_nvml(0)
    return callback


def test_cuda_path_reports_nvml_and_allocator_peaks(monkeypatch: pytest.MonkeyPatch, fake_cuda: dict[str, int]) -> None:
    nvml = FakeNVML()
    callback = _cuda_callback(monkeypatch, nvml)
    assert nvml.handles == ["GPU-1234-abcd"]  # matched by UUID, not by index

    report = callback.collect()
    for metric, value in [("gpu/mem_used_gb", 30.0), ("gpu/mem_total_gb", 80.0), ("gpu/util", 87.0),
                          ("gpu/alloc_peak_gb", 2.0), ("gpu/reserved_peak_gb", 3.0)]:
        assert [report[f"{metric}/{s}"] for s in ("min", "avg", "max")] == pytest.approx([value] * 3), metric
    assert report["host/rss_gb"] > 0
    assert fake_cuda["reset"] == 1  # the peaks describe one window
    assert callback.collect()["gpu/alloc_peak_gb/max"] == pytest.approx(1.0)
    assert fake_cuda["reset"] == 2

    callback.on_app_end()
    assert nvml.shutdowns == 1 and callback._nvml is None


def test_nvml_errors_are_tolerated_and_reported_once(monkeypatch: pytest.MonkeyPatch, fake_cuda: dict[str, int],
                                                     fastgen_records: pytest.LogCaptureFixture) -> None:
    callback = _cuda_callback(monkeypatch, FakeNVML(fail_util=True))
    for _ in range(3):
        report = callback.collect()
        assert not any(key.startswith("gpu/util") for key in report)
        assert report["gpu/mem_used_gb/max"] == pytest.approx(30.0)  # the query that works still reports
        assert report["gpu/alloc_peak_gb/avg"] > 0
    warnings = [r for r in fastgen_records.records if "NVML failed" in r.getMessage()]
    assert len(warnings) == 1 and "GPU_IS_LOST" in warnings[0].getMessage()


@pytest.mark.parametrize("broken", ["missing_module", "init_fails"])
def test_without_nvml_the_allocator_keys_remain(broken: str, monkeypatch: pytest.MonkeyPatch,
                                                fake_cuda: dict[str, int]) -> None:
    nvml = None if broken == "missing_module" else FakeNVML(fail_init=True)  # None in sys.modules -> ImportError
    callback = _cuda_callback(monkeypatch, nvml)
    assert callback._nvml is None
    report = callback.collect()
    assert set(report) >= {"gpu/alloc_peak_gb/min", "gpu/reserved_peak_gb/max", "host/rss_gb"}
    assert not any(key.startswith("gpu/util") for key in report)


# ---- the reduction over ranks ------------------------------------------------------------------------------------
def test_reduction_without_a_process_group() -> None:
    assert reduce_min_avg_max([1.5, None, float("nan")]) == [(1.5, 1.5, 1.5), None, None]
    assert len(GPU_METRICS) == len(set(GPU_METRICS))


# Per rank: a value only rank 0 has, one only rank 1 has, one both have, one neither has.
RANK_VALUES = {0: [1.0, 7.0, None, None], 1: [3.0, None, 2.0, None]}
EXPECTED = [(1.0, 2.0, 3.0), (7.0, 7.0, 7.0), (2.0, 2.0, 2.0), None]


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    try:
        result = gpu_stats.reduce_min_avg_max(RANK_VALUES[rank])
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        shutdown_gloo()


def test_min_avg_max_over_two_gloo_ranks(tmp_path: Path) -> None:
    context = mp.start_processes(_rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2, join=False,
                                 start_method="spawn")
    join_ranks(context, timeout=60)
    for rank in (0, 1):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert len(result) == len(EXPECTED)
        for got, want in zip(result, EXPECTED):
            if want is None:
                assert got is None
            else:
                assert got == pytest.approx(want)
                assert all(math.isfinite(x) for x in got)
