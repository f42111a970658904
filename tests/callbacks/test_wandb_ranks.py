"""WandbCallback over two real gloo ranks: logged scalars are the mean over ranks, accumulation rounds and the
logging window; log modules on rank 0 receive every rank's entries, and what they return is logged."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from fastgen.callbacks.callback import Callback
from fastgen.callbacks.log_modules.base import LogModule, MediaEntry, gather_to_rank0
from fastgen.callbacks.wandb import WandbCallback
from fastgen.trainer import Trainer
from fastgen_testing import exit_rank, free_port, join_ranks, read_wandb_history, shutdown_gloo, tiny_toy_config

NUM_SAMPLES = 5  # 3 on rank 0 (indices 0, 2, 4 of the global order), 2 on rank 1


class RoundLosses(Callback):
    """Every accumulation round's losses on this rank, by (completed step, round)."""

    def __init__(self) -> None:
        self.losses: dict[tuple[int, int], dict[str, float]] = {}

    def on_training_accum_step_end(self, model: Any, data_batch: dict, output_batch: dict, loss_dict: dict,
                                   iteration: int = 0, accum_iter: int = 0) -> None:
        self.losses[(iteration + 1, accum_iter)] = {k: float(v.detach()) for k, v in loss_dict.items()}


class RecordingWandb(WandbCallback):
    """Keeps a copy of the entries this rank contributes at each sample step."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.local: dict[int, list[tuple[int, int, torch.Tensor]]] = {}

    def local_entries(self, model: Any, iteration: int) -> list[MediaEntry]:
        entries = super().local_entries(model, iteration)
        self.local[iteration] = [(e.rank, e.index, e.data.clone()) for e in entries]
        return entries


class GatherProbe(LogModule):
    """Records what rank 0 receives; returns scalars that must come out under ``probe/``."""

    def __init__(self) -> None:
        self.received: dict[int, list[tuple[int, int, torch.Tensor]]] = {}
        self.calls_on_rank: list[int] = []

    def process(self, entries: list[MediaEntry], iteration: int) -> dict[str, Any]:
        self.calls_on_rank.append(int(os.environ["RANK"]))
        self.received[iteration] = [(e.rank, e.index, e.data.clone()) for e in entries]
        return {"loss_dict": {"entries": len(entries), "from_rank1": sum(e.rank for e in entries)}}


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      GLOO_SOCKET_IFNAME="lo", FASTGEN_OUTPUT_ROOT=str(Path(out_dir) / "runs"),
                      WANDB_MODE="offline", WANDB_SILENT="true")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    result: dict[str, Any] = {}
    try:
        gathered = gather_to_rank0({"rank": rank, "t": torch.full((2,), float(rank))})
        result["gather"] = gathered
        # 16 per rank x 2 ranks x 2 accumulation rounds = 64 per optimizer step
        config = tiny_toy_config("two_ranks", max_iter=4, logging_iter=2, save_ckpt_iter=100, batch_size_global=64, ddp=True)
        config.log_config.wandb_mode = "offline"
        rounds, probe = RoundLosses(), GatherProbe()
        wandb_cb = RecordingWandb(sample_iter=2, num_samples=NUM_SAMPLES, log_modules={"probe": probe})
        trainer = Trainer(config, extra_callbacks={"rounds": rounds, "wandb": wandb_cb})
        trainer.run()
        result.update(rounds=rounds.losses, local=wandb_cb.local, received=probe.received,
                      calls_on_rank=probe.calls_on_rank, run_dir=str(trainer.run_dir), accum=trainer.accum_rounds)
    finally:
        shutdown_gloo()
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    exit_rank()


@pytest.mark.slow
def test_scalars_are_means_over_ranks_and_rounds_and_modules_see_every_rank(tmp_path: Path) -> None:
    context = mp.start_processes(_rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2, join=False,
                                 start_method="spawn")
    join_ranks(context, timeout=120)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))

    # the gather helper: every rank's object, in rank order, on rank 0 only
    assert r1["gather"] is None
    assert [g["rank"] for g in r0["gather"]] == [0, 1] and torch.equal(r0["gather"][1]["t"], torch.ones(2))

    assert r0["accum"] == r1["accum"] == 2
    rows = read_wandb_history(Path(r0["run_dir"]))  # exactly one offline run: rank 1 never starts W&B
    logged = {row["_step"]: row for row in rows if "total_loss" in row}
    assert sorted(logged) == [2, 4]
    for step in (2, 4):
        for key in ("total_loss", "denoising_loss"):
            values = [r["rounds"][(s, a)][key] for r in (r0, r1) for s in (step - 1, step) for a in (0, 1)]
            assert len(values) == 8  # 2 ranks x 2 steps of the window x 2 rounds
            assert logged[step][key] == pytest.approx(sum(values) / 8, rel=1e-5)
            rank0_only = sum(r0["rounds"][(s, a)][key] for s in (step - 1, step) for a in (0, 1)) / 4
            assert logged[step][key] != pytest.approx(rank0_only, rel=1e-7)  # the other rank really counts
        # what the module returned on rank 0 went through the same aggregation, under probe/
        assert logged[step]["probe/entries"] == NUM_SAMPLES and logged[step]["probe/from_rank1"] == 2

    # the module ran on rank 0 only and received both ranks' entries, exactly as each rank produced them
    assert r0["calls_on_rank"] == [0, 0] and r1["calls_on_rank"] == [] and r1["received"] == {}
    for step in (2, 4):
        expected = r0["local"][step] + r1["local"][step]
        got = r0["received"][step]
        assert [(rank, index) for rank, index, _ in got] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
        assert all(torch.equal(a[2], b[2]) for a, b in zip(got, expected, strict=True))
        assert not torch.equal(got[0][2], got[3][2])  # each rank draws its own samples (seed sample_seed + rank)
