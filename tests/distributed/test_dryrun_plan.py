"""``fastgen dryrun --nproc-per-node N``: the per-rank plan against what real ranks hold (real gloo workers started
by the real launcher), inside a running job, and its refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from multirank import TORCHRUN, Job, fastgen, read_json

from fastgen.configs.config_utils import apply_overrides, load_config
from fastgen.profiling.plan import estimate_memory, plan_state

SFT = ["-c", "Digits/config_sft_digits", "-", "trainer.max_iter=3", "trainer.save_ckpt_iter=3",
       "dataloader_train.batch_size=16", "dataloader_val.batch_size=16", "~trainer.callbacks.wandb"]
# DMD2 on a small digits U-Net with a random teacher: student, EMA, frozen teacher, fake score and discriminator.
DMD2 = ["-c", "Digits/config_dmd2_digits", "--eval-samples", "0", "-", "trainer.max_iter=3", "trainer.save_ckpt_iter=3",
        "model.teacher_ckpt=null", "model.net.backbone.model_channels=8", "model.student_update_freq=2",
        "dataloader_train.batch_size=8"]


def planned(args: list[str], world: int) -> object:
    config = load_config(args[args.index("-c") + 1])
    apply_overrides(config, [a for a in args[args.index("-") + 1:] if "callbacks" not in a] + ["trainer.fsdp=True"])
    return plan_state(config, world)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [SFT, DMD2], ids=["sft", "dmd2"])
def test_the_plan_is_what_each_rank_of_a_real_fsdp_run_holds(recipe: list[str], output_root: Path,
                                                             tmp_path: Path) -> None:
    """Every rank's local parameters (EMA and frozen teacher included), gradients and optimizer state, measured on
    the live model by ``rank_probes.StateBytes`` (gradients before the step of iteration 1, optimizer state after
    it), equal the plan's for that rank. The plan counts a gradient for every optimizer; DMD2 alternates, so
    iteration 1 (a critic iteration at student_update_freq=2) holds the fake score's and the discriminator's."""
    result = fastgen("train", "--nproc-per-node", "2", *recipe, "trainer.fsdp=True",
                     f"+trainer.callbacks.bytes={{_target_:rank_probes.StateBytes,prefix:{tmp_path / 'fsdp'}}}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    plan = planned(recipe, 2)
    for rank in (0, 1):
        measured = read_json(tmp_path / f"fsdp.rank{rank}.json")
        expected = plan.ranks[rank]
        stepping = ["fake_score", "discriminator"] if recipe is DMD2 else ["net"]
        assert measured == {"parameters": expected.parameters,
                            "gradients": sum(expected.gradients_by_optimizer[name] for name in stepping),
                            "optimizer_state": expected.optimizer_state}, (rank, expected)


WORKER = """
import json, os, sys
import torch.distributed as dist
from fastgen_testing import tiny_toy_config
from fastgen.profiling.plan import estimate_memory
from fastgen.profiling.plan import plan_state

dist.init_process_group("gloo")
config = tiny_toy_config(fsdp=True)
config.model.net.backbone.hidden_dim = 33
plan = plan_state(config, 2)
assert dist.is_initialized()  # the job's group is left as it was
dist.barrier()
out = [[r.parameters, r.gradients, r.optimizer_state] for r in plan.ranks]
open(os.path.join(sys.argv[1], f"plan{dist.get_rank()}.json"), "w").write(json.dumps(out))
dist.destroy_process_group()
"""


def test_inside_a_running_job_the_plan_uses_its_group_and_matches_the_dry_run(tmp_path: Path) -> None:
    """``MemTrackerCallback`` asks for the estimate inside a torchrun job, where no fake group can be made: the plan
    then shards on the job's own (gloo) group - and gives every rank the same figures as the dry run."""
    from fastgen_testing import tiny_toy_config

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    result = Job([TORCHRUN, "--standalone", "--nproc-per-node", "2", str(script), str(tmp_path)], cwd=tmp_path).wait(180)
    assert result.returncode == 0, result.stderr[-3000:]
    config = tiny_toy_config(fsdp=True)
    config.model.net.backbone.hidden_dim = 33
    dry = [[r.parameters, r.gradients, r.optimizer_state] for r in plan_state(config, 2).ranks]
    assert dry[0] != dry[1]  # uneven shards: the ranks differ
    for rank in (0, 1):
        assert json.loads((tmp_path / f"plan{rank}.json").read_text()) == dry


def table_values(stdout: str) -> dict[str, int]:
    values = {}
    for label in ("parameters", "gradients", "optimizer state", "total"):
        match = re.search(rf"^\s*{label}\s+\S\s+([\d,]+)", stdout, re.MULTILINE)
        assert match, (label, stdout)
        values[label.replace(" ", "_")] = int(match.group(1).replace(",", ""))
    return values


def test_dryrun_prints_the_busiest_rank_of_the_plan(tmp_path: Path) -> None:
    args = ["-c", "Toy/config_sft_toy", "-", "model.net.backbone.hidden_dim=33"]  # odd rows: uneven shards
    result = fastgen("dryrun", "--nproc-per-node", "3", *args, "trainer.fsdp=True", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "sharded over 3 ranks (FSDP2); rank 0, which holds the most" in result.stdout
    plan = planned(args, 3)
    assert table_values(result.stdout) == {"parameters": plan.busiest.parameters, "gradients": plan.busiest.gradients,
                                           "optimizer_state": plan.busiest.optimizer_state, "total": plan.busiest.total}
    assert re.search(rf"rank 2 \(least\)\s+\S\s+{plan.ranks[2].total:,}", result.stdout), result.stdout
    alias = fastgen("dryrun", "--world-size", "3", *args, "trainer.fsdp=True", cwd=tmp_path, timeout=120)
    assert alias.returncode == 0 and table_values(alias.stdout) == table_values(result.stdout)
    hsdp = fastgen("dryrun", "--nnodes", "2", "--nproc-per-node", "2", *args, "trainer.fsdp=True",
                   "trainer.fsdp_shard_size=2", cwd=tmp_path, timeout=120)
    assert hsdp.returncode == 0 and "sharded over 2 ranks, replicated 2x (HSDP)" in hsdp.stdout, hsdp.stderr
    assert table_values(hsdp.stdout)["total"] == planned([*args, "trainer.fsdp_shard_size=2"], 4).busiest.total
    ddp = fastgen("dryrun", "--nproc-per-node", "4", *args, "trainer.ddp=True", cwd=tmp_path, timeout=120)
    assert ddp.returncode == 0 and "replicated on 4 ranks (DDP)" in ddp.stdout
    config = load_config("Toy/config_sft_toy")
    apply_overrides(config, args[2:])
    whole = estimate_memory(config)  # replication: every rank holds everything
    assert table_values(ddp.stdout) == {k: whole[k] for k in ("parameters", "gradients", "optimizer_state", "total")}
    assert not (tmp_path / "FASTGEN_OUTPUT").exists()  # a dry run writes nothing


@pytest.mark.parametrize("options, overrides, message", [
    (["--nproc-per-node", "0"], ["trainer.fsdp=True"], "--nproc-per-node must be at least 1, got 0"),
    (["--nproc-per-node", "3"], ["trainer.fsdp=True", "trainer.fsdp_shard_size=2"],
     "trainer.fsdp_shard_size=2 must divide the world size 3"),
    (["--nproc-per-node", "2"], [], "trainer.ddp=True"),
    (["--world-size", "2", "--nproc-per-node", "2"], ["trainer.ddp=True"], "not both"),
], ids=["zero", "shard-size", "not-distributed", "both-flags"])
def test_bad_rank_counts_are_one_line_and_exit_2(options: list[str], overrides: list[str], message: str,
                                                 tmp_path: Path) -> None:
    result = fastgen("dryrun", *options, "-c", "Toy/config_sft_toy", "-", *overrides, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert "Traceback" not in result.stderr and not result.stdout.strip()


# a toy MLP large enough that activations, not the loader's in-memory dataset (0.4 MB), make the peak
PEAK = ["-c", "Toy/config_sft_toy", "-", "model.net.backbone.hidden_dim=512", "dataloader_train.batch_size=1024",
        "trainer.validation_iter=null", "~trainer.callbacks.wandb"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_the_dry_runs_training_peak_is_within_10_percent_of_each_ranks_measured_peak(mode: str, output_root: Path,
                                                                                    tmp_path: Path) -> None:
    """``fastgen dryrun --nproc-per-node 2`` traces training steps on fake tensors; ``fastgen profile-memory`` on 2
    real ranks records every allocation. The dry run's training peak is each rank's measured one within 10%
    (measured 0.976 / 1.020 for FSDP2, 0.989 for DDP)."""
    from fastgen.profiling.analysis import measured_memory
    from fastgen.profiling.snapshot import load_snapshot

    report = tmp_path / "mem" / "peak.html"
    overrides = [*PEAK[PEAK.index("-") + 1:], f"trainer.{mode}=True"]
    job = Job([TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "fastgen", "profile-memory", *PEAK[:2],
               "--iters", "2", "--out", str(report), "-", *overrides], tmp_path,
              {"WANDB_MODE": "disabled", "FASTGEN_NO_PROGRESS": "1"})
    result = job.wait(300)
    assert result.returncode == 0, result.stderr[-3000:]
    dry = fastgen("dryrun", "--nproc-per-node", "2", *PEAK[:2], "-", *overrides, cwd=tmp_path, timeout=120)
    assert dry.returncode == 0, dry.stderr[-3000:]
    match = re.search(r"^\s*training peak\s+\S\s+([\d,]+)", dry.stdout, re.MULTILINE)
    assert match, dry.stdout[-2000:]
    estimate = int(match.group(1).replace(",", ""))
    for rank in (0, 1):
        measured = measured_memory(load_snapshot(report.with_name(f"peak_rank{rank}.json.gz")))["training_peak"]
        assert 0.9 <= estimate / measured <= 1.1, (rank, estimate, measured)
