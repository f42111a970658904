"""MemTrackerCallback in real CPU training runs: what it records, how it categorises, crashes, two gloo ranks."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from fastgen.callbacks.callback import Callback
from fastgen.callbacks.mem_tracker import MemTrackerCallback
from fastgen.profiling.analysis import analyse
from fastgen.profiling.snapshot import load_snapshot
from fastgen.trainer import Trainer
from fastgen_testing import assert_same_weights, exit_rank, free_port, join_ranks, shutdown_gloo, tiny_toy_config


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def test_window_is_recorded_categorised_and_reported() -> None:
    tracker = MemTrackerCallback(start_iter=1, num_iters=2)
    trainer = Trainer(tiny_toy_config("mem_tracked", max_iter=4), extra_callbacks={"mem": tracker})
    model = trainer.run()
    run_dir = Path(trainer.run_dir)
    assert tracker.report_path == run_dir / "memory" / "memory_report.html"
    assert tracker.snapshot_path == run_dir / "memory" / "memory_report_rank0.json.gz"
    snap = load_snapshot(tracker.snapshot_path)
    assert snap["backend"] == "cpu_profiler" and snap["device"] == "cpu" and snap["crash"] is None
    assert snap["window"] == {"start_iter": 1, "end_iter": 3}
    phases = [(m[1], m[2]) for m in snap["markers"]]
    for iteration in (1, 2):
        for phase in ("data", "forward", "backward", "optimizer", "callbacks"):
            assert (phase, iteration) in phases
    assert ("forward", 0) not in phases and ("forward", 3) not in phases and phases[-1][0] == "end"

    a = analyse(snap)
    params = storage_bytes([*model.parameters(), *model.buffers()])
    opt_state = storage_bytes([v for opt in model.optimizer_dict.values() for s in opt.state.values()
                               for v in s.values() if isinstance(v, torch.Tensor)])
    grads = sum(p.numel() * p.element_size() for p in model.net.parameters())
    # Parameters and Adam's state (created at iteration 0) existed before the window: counted from its start.
    assert a.start_bytes == params + opt_state
    assert a.max_by_category["parameters"] == params
    assert a.max_by_category["optimizer_state"] == opt_state
    assert a.max_by_category["gradients"] == grads  # all gradients exist together just before the step
    assert a.max_by_category["activations"] > 0 and a.max_by_category["other"] > 0
    assert a.peak_bytes >= params + opt_state + grads
    assert sum(a.peak_breakdown.values()) == a.peak_bytes
    # Sites point into fastgen's own code, with the operator that allocated.
    labels = [row.label for row in a.sites]
    assert any(label.startswith("fastgen/networks/") and "aten::" in label for label in labels), labels
    assert any("Backward" in label for label in labels), labels
    html = tracker.report_path.read_text()
    assert f'data-peak-bytes="{a.peak_bytes}"' in html and 'id="timeline-0"' in html
    assert snap["estimate"]["parameters"] == sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def test_tracking_does_not_change_training() -> None:
    plain = Trainer(tiny_toy_config("mem_plain", max_iter=3))
    plain.run()
    tracked = Trainer(tiny_toy_config("mem_with", max_iter=3), extra_callbacks={"mem": MemTrackerCallback(0, 2)})
    tracked.run()
    assert_same_weights(plain.checkpointer.path_for(3), tracked.checkpointer.path_for(3))


class Crasher(Callback):
    def __init__(self, error: BaseException, at: int) -> None:
        self.error = error
        self.at = at

    def on_backward_begin(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict, iteration: int = 0,
                          accum_iter: int = 0) -> None:
        if iteration == self.at:
            raise self.error


@pytest.mark.parametrize(("error", "oom"), [
    (RuntimeError("boom in backward"), False),
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
], ids=["exception", "out_of_memory"])
def test_a_crash_inside_the_window_still_leaves_a_report(error: BaseException, oom: bool, tmp_path: Path) -> None:
    out = tmp_path / "crash" / "report.html"
    tracker = MemTrackerCallback(start_iter=1, num_iters=3, output=str(out))
    trainer = Trainer(tiny_toy_config("mem_crash", max_iter=6),
                      extra_callbacks={"mem": tracker, "crasher": Crasher(error, at=2)})
    with pytest.raises(type(error)):
        trainer.run()
    assert tracker.report_path == out and out.is_file()
    snap = load_snapshot(tmp_path / "crash" / "report_rank0.json.gz")
    assert snap["crash"]["type"] == type(error).__name__ and snap["crash"]["iteration"] == 2
    assert snap["crash"]["oom"] is oom and str(error) in snap["crash"]["message"]
    assert snap["markers"][-1][1] == ("oom" if oom else "crash")
    assert ("backward", 2) in [(m[1], m[2]) for m in snap["markers"]]
    html = out.read_text()
    assert 'class="crash-marker"' in html and ("ran out of memory" if oom else "crashed") in html
    assert analyse(snap).peak_bytes > 0


def test_a_window_never_reached_records_nothing() -> None:
    tracker = MemTrackerCallback(start_iter=5, num_iters=2)
    trainer = Trainer(tiny_toy_config("mem_never", max_iter=2), extra_callbacks={"mem": tracker})
    trainer.run()
    assert tracker.report_path is None and not (Path(trainer.run_dir) / "memory").exists()


def test_an_unwritable_report_does_not_stop_training(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    tracker = MemTrackerCallback(start_iter=0, num_iters=1, output=str(blocker / "report.html"))
    trainer = Trainer(tiny_toy_config("mem_unwritable", max_iter=3), extra_callbacks={"mem": tracker})
    trainer.run()  # the run finishes; the failure is logged
    assert trainer.iteration == 3 and tracker.finished and tracker.report_path is None


def test_bad_window_is_refused() -> None:
    with pytest.raises(ValueError, match="num_iters"):
        MemTrackerCallback(start_iter=0, num_iters=0)


# ---- two real gloo ranks ----------------------------------------------------------------------------------------
def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    result: dict[str, Any] = {}
    try:
        tracker = MemTrackerCallback(start_iter=0, num_iters=2, output=str(Path(out_dir) / "mem" / "report.html"))
        config = tiny_toy_config("mem_ranks", max_iter=2, ddp=True)
        config.dataloader_train.batch_size = 16 * (rank + 1)  # rank 1 uses more activation memory
        Trainer(config, extra_callbacks={"mem": tracker}).run()
        result["report"] = str(tracker.report_path) if tracker.report_path else None
        result["snapshot"] = str(tracker.snapshot_path)
    finally:
        shutdown_gloo()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    exit_rank()


@pytest.mark.slow
def test_two_gloo_ranks_one_report_with_a_tab_per_rank(tmp_path: Path) -> None:
    context = mp.start_processes(_rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2, join=False,
                                 start_method="spawn")
    join_ranks(context, timeout=120)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert results[0]["report"] == str(tmp_path / "mem" / "report.html") and results[1]["report"] is None
    snaps = [load_snapshot(results[r]["snapshot"]) for r in (0, 1)]
    assert [(s["rank"], s["world_size"]) for s in snaps] == [(0, 2), (1, 2)]
    peaks = [analyse(s).peak_bytes for s in snaps]
    assert analyse(snaps[1]).max_by_category["activations"] > analyse(snaps[0]).max_by_category["activations"]
    html = (tmp_path / "mem" / "report.html").read_text()
    assert 'data-ranks="2"' in html
    for rank, peak in enumerate(peaks):
        assert f'id="rank-{rank}" data-rank="{rank}" data-peak-bytes="{peak}"' in html
        assert f'id="timeline-{rank}"' in html
