"""The failure watch (``fastgen.distributed.group``): every failure reaches the rendezvous store, a ``DistError`` a
rank raises for a reason of its own included, so the other ranks stop at once and the launcher names that error; and
when the store cannot be reached the watch says so at start-up instead of silently switching itself off. Real gloo
ranks, and the real launcher (``fastgen train --nproc-per-node 2``)."""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import torch
from fastgen_testing import finish_rank, gloo_results
from multirank import fastgen

SFT = ["-c", "Toy/config_sft_toy", "-", "trainer.logging_iter=4", "trainer.save_ckpt_iter=100",
       "model.net.backbone.hidden_dim=64", "dataloader_train.batch_size=32"]


def trainer_config(timeout_s: float = 45.0) -> SimpleNamespace:
    return SimpleNamespace(ddp=True, fsdp=False, fsdp_shard_size=None, device="cpu", dist_timeout_s=timeout_s)


class Records(logging.Handler):
    """Every record of the ``fastgen`` logger, unfiltered (the command line's handler would drop rank 1's)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append((record.levelname, record.getMessage()))


def _env(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)


# ---- without the store: one warning on rank 0 at start-up ---------------------------------------------------------
def _rank_without_store(rank: int, world: int, port: int, out_dir: str) -> None:
    import torch.distributed.distributed_c10d as c10d

    from fastgen.distributed import group as dist_utils

    _env(rank, world, port)
    del c10d._get_default_store  # as in a torch release that renamed or dropped the private function
    records = Records()
    logging.getLogger("fastgen").addHandler(records)
    logging.getLogger("fastgen").setLevel(logging.DEBUG)
    result: dict[str, object] = {}
    try:
        dist_utils.init_distributed(trainer_config(45))
        dist_utils.init_distributed(trainer_config(45))  # joined again (an already initialised group): still once
        watch = dist_utils.FailureWatch(lambda message: None).start()
        result["watch_thread"] = watch._thread is not None
        watch.stop()
        result["warnings"] = [message for level, message in records.messages if level == "WARNING"]
    finally:
        finish_rank(out_dir, rank, result)


def test_without_the_private_store_getter_rank_0_warns_once_at_start_up(tmp_path: Path) -> None:
    rank0, rank1 = gloo_results(_rank_without_store, tmp_path, timeout=90)
    assert rank0["watch_thread"] is False and rank1["watch_thread"] is False  # the watch cannot run...
    (warning,) = rank0["warnings"]  # ...and rank 0 says so, once
    assert "failure watch cannot run" in warning and "_get_default_store" in warning, warning
    assert "trainer.dist_timeout_s=45s" in warning, warning
    assert rank1["warnings"] == []


# ---- with the store: which failures are a rank's own --------------------------------------------------------------
def _rank_with_store(rank: int, world: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from fastgen.distributed import group as dist_utils

    _env(rank, world, port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=45))
    result: dict[str, object] = {}
    own = dist.DistError("boom")
    try:
        if rank == 1:  # the first failure of the job, a DistError: its own, announced
            result["own_is_peer_failure"] = dist_utils.is_peer_failure(own)
            dist_utils.report_failure("DistError: boom", secondary=dist_utils.is_peer_failure(own))
        dist.barrier()
        result["reported"] = dist_utils.reported_failure()
        if rank == 0:  # after rank 1's announcement: a DistError here follows it, and announcing it changes nothing
            later = dist.DistError("a collective failed")
            result["later_is_peer_failure"] = dist_utils.is_peer_failure(later)
            dist_utils.report_failure("DistError: a collective failed", secondary=True)
            result["reported_after_second"] = dist_utils.reported_failure()
            result["peer_lost"] = dist_utils.is_peer_failure(dist.DistError("Connection closed by peer [127.0.0.1]"))
        dist.barrier()
        if rank == 0:  # a new job's store, whose first failure came from a rank that could not announce it (killed):
            dist_utils._store().set(dist_utils.FAILURE_KEY, "")  # the consequence is announced, so waiting ranks stop
            dist_utils.report_failure("DistError: Connection closed by peer", secondary=True)
        dist.barrier()
        result["reported_secondary"] = dist_utils.reported_failure()
    finally:
        dist.destroy_process_group()
        if rank == 1:  # asked again with no group (the command's last line): the verdict does not change
            result["own_after_teardown"] = dist_utils.is_peer_failure(own)
            result["fresh_after_teardown"] = dist_utils.is_peer_failure(dist.DistError("boom"))
        finish_rank(out_dir, rank, result)


def test_a_dist_error_that_comes_first_is_a_ranks_own_failure_and_reaches_the_store(tmp_path: Path) -> None:
    rank0, rank1 = gloo_results(_rank_with_store, tmp_path, timeout=90)
    assert rank1["own_is_peer_failure"] is False
    assert rank0["reported"] == rank1["reported"] == "rank 1: DistError: boom"
    assert rank0["later_is_peer_failure"] is True
    assert rank0["reported_after_second"] == "rank 1: DistError: boom"  # the first failure stays the reported one
    assert rank0["peer_lost"] is True
    assert rank1["reported_secondary"] == "rank 0: DistError: Connection closed by peer"
    assert rank1["own_after_teardown"] is False
    assert rank1["fresh_after_teardown"] is True  # no store to ask: taken to follow another rank's failure


# ---- end to end: the other rank stops at once, the launcher names the DistError -----------------------------------
def test_a_rank_raising_its_own_disterror_stops_every_rank_long_before_the_timeout(output_root: Path,
                                                                                  tmp_path: Path) -> None:
    """Rank 1 raises ``DistError`` after step 3 and is slow to clean up (its process group stays up), while rank 0
    is already in step 4's gradient all-reduce. Before the fix the DistError was taken for a consequence of another
    rank's failure and never announced: rank 0 waited in the all-reduce for the whole ``dist_timeout_s`` (120 s).
    Now rank 0's failure watch stops it within seconds (the job is given 100 s in all), and the launcher's one line
    names rank 1's error."""
    probe = "+trainer.callbacks.fail={_target_:rank_probes.FailOn,rank:1,iteration:3,error:dist,linger_s:300}"
    result = fastgen("train", "--nproc-per-node", "2", *SFT, "trainer.ddp=True", "trainer.max_iter=40",
                     "trainer.dist_timeout_s=120", "log_config.name=dist_error", probe, cwd=tmp_path, timeout=100)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert "rank 1: DistError: boom on rank 1" in errors[0], errors[0]
    assert "Traceback" not in result.stderr


def test_a_rank_failing_during_an_async_sharded_save_ends_the_job_and_keeps_the_previous_checkpoint(
        output_root: Path, tmp_path: Path) -> None:
    """Rank 1 fails while the FSDP save of iteration 4 is still being written in the background. The job ends well
    before ``dist_timeout_s`` (no rank waits at exit for a save that needs the rank that failed), no marker is
    written for the abandoned save, and the save of iteration 2 stays the newest valid checkpoint."""
    probe = "+trainer.callbacks.fail={_target_:rank_probes.FailDuringAsyncSave,rank:1,iteration:4,slow_write_s:60}"
    result = fastgen("train", "--nproc-per-node", "2", "-c", "Toy/config_sft_toy", "-", "trainer.fsdp=True",
                     "trainer.checkpointer.async_save=True", "trainer.save_ckpt_iter=2", "trainer.max_iter=10",
                     "trainer.dist_timeout_s=120", "log_config.name=async_fail", probe, cwd=tmp_path, timeout=100)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "boom on rank 1 during the async save" in errors[0], result.stderr[-3000:]
    checkpoints = output_root / "fastgen" / "toy" / "async_fail" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("*.pth")) == ["0000002.pth"]
    from fastgen.checkpoint.checkpointer import load_checkpoint

    assert load_checkpoint(checkpoints / "0000002.pth")["iteration"] == 2  # whole and loadable
