"""fastgen check-ranks' library side: the comparison across ranks (pure, and over two real gloo ranks), the
environment tier, the checkpoint's tensors, a checkpoint read through a FIFO, the launcher's worker command line.

The whole command, through the real launcher, is tested in tests/e2e/test_check_ranks.py."""

from __future__ import annotations

import datetime
import os
import threading
from pathlib import Path

import pytest
import torch
from fastgen.cli.launching import worker_argv
from fastgen_testing import finish_rank, gloo_results, tiny_toy_config

from fastgen.distributed.fingerprint import Disagreement, disagreements, gather_fingerprints
from fastgen.distributed.rank_check import (
    Finding,
    _Tier3,
    checkpoint_tensors,
    compare_tier3,
    environment_findings,
    environment_info,
    read_checkpoint,
)
from fastgen.utils.errors import UsageError


# ---- the comparison ------------------------------------------------------------------------------------------------
def test_disagreements_name_the_odd_rank_out_and_what_a_rank_lacks() -> None:
    per_rank = [{"a": 1, "b": 2, "c": 5}, {"a": 1, "b": 3}, {"a": 1, "b": 2, "c": 5}]
    found = {d.name: d for d in disagreements(per_rank)}
    assert set(found) == {"b", "c"}
    assert found["b"].groups == ((2, (0, 2)), (3, (1,))) and found["b"].odd_ranks == (1,)
    assert found["c"].missing == (1,) and found["c"].odd_ranks == (1,)
    assert found["b"].describe(str) == "ranks [0, 2] have 2; ranks [1] have 3"
    # the largest group is the reference, also when rank 0 is the odd one; a tie goes to the lowest rank
    assert disagreements([{"x": 2}, {"x": 1}, {"x": 1}])[0].odd_ranks == (0,)
    assert disagreements([{"x": 1}, {"x": 2}])[0].odd_ranks == (1,)
    # a rank left out (it failed earlier) is not compared; without require_all a name is compared where held
    assert disagreements([{"x": 1}, None, {"x": 1}]) == []
    assert disagreements([{"s": 1}, {"t": 2}], require_all=False) == []
    assert [d.odd_ranks for d in disagreements([{"s": 1}, {"s": 2}, {"t": 0}], require_all=False)] == [(1,)]
    assert disagreements([{"a": 1}, {"a": 1}]) == []


def test_gather_without_a_process_group_is_this_rank_alone() -> None:
    assert gather_fingerprints(["a", "b"], torch.tensor([3, -4])) == [{"a": 3, "b": -4}]


def test_finding_lines() -> None:
    assert Finding("fingerprints", (1,), "buffer net.x", "differs").line() == "rank 1: buffer net.x: differs"
    assert Finding("environment", (2, 3), "torch version", "v").line() == "ranks 2, 3: torch version: v"


def test_environment_tier_compares_versions_and_config_but_not_hosts() -> None:
    base = environment_info(tiny_toy_config("env"))
    other_seed = tiny_toy_config("env")
    other_seed.trainer.seed = 7
    infos = [dict(base), {**environment_info(other_seed), "hostname": "node-b"}, {**base, "torch": "2.12.0"}]
    infos[2]["hostname"] = "node-c"
    found = {f.subject: f for f in environment_findings(infos)}
    assert set(found) == {"torch version", "config"}
    assert found["torch version"].ranks == (2,) and "rank 2 has 2.12.0" in found["torch version"].detail
    assert found["config"].ranks == (1,) and found["config"].detail.endswith("at trainer.seed")
    assert environment_findings([base, dict(base)]) == []
    assert {"python", "torch", "cuda", "nccl", "fastgen", "config", "hostname", "device"} <= set(base)


# ---- the checkpoint as each rank reads it --------------------------------------------------------------------------
def test_checkpoint_tensors_are_every_tensor_by_path() -> None:
    payload = {"format": "x", "iteration": 3, "model": {"net": {"w": torch.ones(2), "b": torch.zeros(1)}},
               "optimizers": {"net": {"state": {"w": {"exp_avg": torch.ones(2), "step": torch.tensor(1.0)}},
                                      "param_groups": [{"lr": 0.1}]}},
               "rng": {0: {"torch": torch.arange(3), "cuda": [torch.arange(2)]}}}
    assert sorted(checkpoint_tensors(payload)) == ["model.net.b", "model.net.w", "optimizers.net.state.w.exp_avg",
                                                   "optimizers.net.state.w.step", "rng.0.cuda.0", "rng.0.torch"]


def test_read_checkpoint_reads_a_fifo_and_names_a_missing_file(tmp_path: Path) -> None:
    from fastgen.checkpoint.checkpointer import FORMAT

    payload = {"format": FORMAT, "version": 2, "iteration": 1, "model": {"net": {"w": torch.arange(6.0)}}}
    source = tmp_path / "source.pth"
    torch.save(payload, source)
    fifo = tmp_path / "ckpt.pth"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(source.read_bytes()), daemon=True)
    writer.start()
    read = read_checkpoint(str(fifo))
    writer.join(timeout=10)
    assert torch.equal(read["model"]["net"]["w"], torch.arange(6.0))
    with pytest.raises(UsageError, match="no such file"):
        read_checkpoint(str(tmp_path / "missing.pth"))
    with pytest.raises(UsageError, match=r"--checkpoint .*: no valid checkpoint \(NNNNNNN.pth\) in"):
        read_checkpoint(str(tmp_path))  # a folder is its newest valid checkpoint; this one has none


def test_worker_argv_drops_the_launcher_flags() -> None:
    argv = ["check-ranks", "-c", "X", "--nproc-per-node", "2", "--nnodes=2", "--node-rank", "1", "--rdzv-endpoint",
            "h:1", "--rdzv_id=a", "--checkpoint", "c.pth", "--max-restarts", "3", "-", "trainer.ddp=True"]
    assert worker_argv(argv) == ["check-ranks", "-c", "X", "--checkpoint", "c.pth", "-", "trainer.ddp=True"]


# ---- the tier-3 comparison over two real gloo ranks ----------------------------------------------------------------
def _material(rank: int, case: str) -> _Tier3:
    fp = torch.tensor
    mine = _Tier3()
    mine.kinds = {"net.a": "parameter", "net.b": "buffer", "net.w": "sharded parameter"}
    if case == "drift":
        mine.initial = (["net.a", "net.b"], fp([1, 2 if rank == 0 else 3]))
        mine.replicated = (["net.a", "net.b"], fp([1, 2]))
        # hybrid sharding: the same shard on both ranks (replicas) differs; a shard only rank 1 holds is fine
        names = ["net.w [0:2]"] + (["net.w [2:4]"] if rank == 1 else [])
        mine.shards = (names, fp([7 + rank] + ([9] if rank == 1 else [])))
        mine.checkpoint = (["model.net.a"], fp([5]))
        if rank == 1:
            mine.local = [("sharded parameter net.w [0:2]", "the local shard differs")]
    elif case == "one_fails":
        mine.initial = (["net.a"], fp([1]))
        if rank == 1:
            mine.error = (1, "checkpoint c.pth is corrupt or truncated")
        else:
            mine.checkpoint = (["model.net.a"], fp([5]))
    elif case == "all_fail":
        mine.error = (2, "--checkpoint c.pth: no such file")
    return mine


def _compare_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    results = {}
    try:
        for case in ("drift", "one_fails", "all_fail"):
            found, compared, error = compare_tier3(_material(rank, case), group=None)
            results[case] = {"lines": [f.line() for f in found], "compared": compared, "error": error}
    finally:
        finish_rank(out_dir, rank, results)


def test_tier3_comparison_over_two_gloo_ranks(tmp_path: Path) -> None:
    results = gloo_results(_compare_main, tmp_path, timeout=90)
    assert results[0] == results[1]  # every rank reaches the same verdict
    drift = results[0]["drift"]["lines"]
    assert len(drift) == 3, drift
    assert drift[0].startswith("rank 1: initial buffer net.b: differs from rank 0")
    assert drift[1].startswith("rank 1: sharded parameter net.w [0:2]: differs from rank 0")
    assert "across hybrid-sharding replicas" in drift[1]
    assert drift[2] == "rank 1: sharded parameter net.w [0:2]: the local shard differs"
    one = results[0]["one_fails"]
    # rank 1's failure is its finding; its (empty) checkpoint is then not compared with rank 0's
    assert one["lines"] == ["rank 1: failed: checkpoint c.pth is corrupt or truncated"] and one["error"] is None
    assert results[0]["all_fail"]["error"] == [2, "--checkpoint c.pth: no such file"]
    assert results[0]["all_fail"]["lines"] == []


def test_disagreement_is_hashable_data() -> None:
    d = Disagreement("x", ((1, (0,)), (2, (1,))))
    assert d.reference_ranks == (0,) and d.odd_ranks == (1,) and d == Disagreement("x", ((1, (0,)), (2, (1,))))
