"""The distributed trainer as users run it: real gloo workers started by the real launcher (`fastgen train
--nproc-per-node`, two "nodes" on loopback, `torchrun -m fastgen`, `torchrun train.py`)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from fastgen_testing import FASTGEN, free_port
from multirank import TORCHRUN, Job, fastgen, losses, read_json

REPO = Path(__file__).resolve().parents[2]
SFT = ["-c", "Toy/config_sft_toy", "-", "trainer.max_iter=12", "trainer.logging_iter=4", "trainer.save_ckpt_iter=6",
       "model.net.backbone.hidden_dim=64", "model.use_ema=true",
       "+trainer.callbacks.ema={_target_:fastgen.callbacks.ema.EMACallback,beta:0.9}"]
# DMD2 with the GAN branch on the frozen teacher's features, exact R1, learning-rate schedules and an EMA, on a
# small digits U-Net with a random teacher (the point is equality between layouts, not quality). Learning rates and
# schedules are pinned here, not taken from the recipe: the worst element of assert_close_states is Adam turning
# rounding noise into a step of up to the learning rate, so its bound follows these rates, not the recipe's tuning.
DMD2 = ["-c", "Digits/config_dmd2_digits", "--eval-samples", "0", "-", "trainer.max_iter=8", "trainer.logging_iter=4",
        "trainer.save_ckpt_iter=8", "model.teacher_ckpt=null", "model.net.backbone.model_channels=8",
        "model.student_update_freq=2", "model.r1_weight=1.0", "model.net_optimizer.lr=3e-4",
        "model.fake_score_optimizer.lr=8e-4", "model.discriminator_optimizer.lr=4e-4", "model.discriminator_scheduler=null",
        "model.net_scheduler={_target_:torch.optim.lr_scheduler.LinearLR,start_factor:1.0,end_factor:0.5,total_iters:4}",
        "model.fake_score_scheduler={_target_:torch.optim.lr_scheduler.LinearLR,start_factor:1.0,end_factor:0.5,total_iters:4}"]
# FSDP2 cannot differentiate twice through sharded modules: the exact R1 is refused there, the finite-difference one
# is used (test_exact_r1_is_refused_under_fsdp).
DMD2_FD = [*DMD2, "model.r1_estimator=finite_difference"]


def probes(tmp_path: Path, name: str) -> list[str]:
    return [f"+trainer.callbacks.loss_log={{_target_:rank_probes.LossLog,path:{tmp_path / (name + '.losses')}}}",
            f"log_config.name={name}"]


def final_state(output_root: Path, group: str, name: str) -> dict[str, torch.Tensor]:
    from fastgen_testing import state_tensors

    from fastgen.checkpoint.checkpointer import Checkpointer, load_checkpoint

    folder = output_root / "fastgen" / group / name
    latest = Checkpointer("checkpoints", folder).latest()
    assert latest is not None, f"no checkpoint in {folder}"
    return state_tensors(load_checkpoint(latest))


def assert_close_states(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    """Every tensor of two checkpoints (weights, EMA, optimizer moments) agrees to ``atol``, except at most 0.01% of
    the elements, which may differ by up to 2e-3. Those are parameters whose gradient is zero up to rounding - a
    convolution's bias in front of a GroupNorm, which removes it - where Adam's normalised step m / sqrt(v) turns
    the rounding noise of two summation orders into a step of up to the learning rate."""
    assert a.keys() == b.keys()
    total = outside = 0
    worst = 0.0
    for key in a:
        if not a[key].is_floating_point():
            assert torch.equal(a[key], b[key]), key
            continue
        diff = (a[key].double() - b[key].double()).abs()
        total += diff.numel()
        outside += int((diff > atol).sum())
        worst = max(worst, float(diff.max()))
    assert outside <= 1e-4 * total, f"{outside} of {total} elements differ by more than {atol}"
    assert worst <= 2e-3, f"largest difference {worst:.3g}"


def assert_close_losses(a: list[tuple[int, float]], b: list[tuple[int, float]], rtol: float) -> None:
    assert [i for i, _ in a] == [i for i, _ in b]
    for (i, x), (_, y) in zip(a, b):
        assert abs(x - y) <= rtol * max(abs(x), abs(y), 1e-12), f"iteration {i}: {x!r} vs {y!r}"


@dataclass
class Run:
    """A finished run: its per-step losses, its last checkpoint's tensors, and (with StateBytes) each rank's bytes."""

    losses: list[tuple[int, float]]
    state: dict[str, torch.Tensor]
    bytes: list[dict[str, int]]


def run_two_ranks(recipe: list[str], group: str, name: str, extra: list[str], folder: Path, output_root: Path,
                  env: dict[str, str] | None = None) -> Run:
    result = fastgen("train", "--nproc-per-node", "2", *recipe, *extra, *probes(folder, name),
                     f"+trainer.callbacks.bytes={{_target_:rank_probes.StateBytes,prefix:{folder / name}}}",
                     cwd=folder, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return Run(losses(folder / f"{name}.losses"), final_state(output_root, group, name),
               [read_json(folder / f"{name}.rank{rank}.json") for rank in (0, 1)])


@pytest.fixture(scope="module")
def sft_ddp(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The 2-rank DDP run of the SFT toy recipe at 32 per rank, which four tests compare against: run once."""
    folder = tmp_path_factory.mktemp("sft_ddp")
    root = folder / "output"
    return run_two_ranks(SFT, "toy", "ddp", ["trainer.ddp=True", "dataloader_train.batch_size=32"], folder, root,
                         env={"FASTGEN_OUTPUT_ROOT": str(root)})


@pytest.mark.slow
@pytest.mark.parametrize("recipe, group, per_rank", [(SFT, "toy", 32), (DMD2, "digits", 8)], ids=["sft", "dmd2"])
def test_two_rank_ddp_matches_one_process_at_the_same_global_batch(recipe: list[str], group: str, per_rank: int,
                                                                   output_root: Path, tmp_path: Path,
                                                                   request: pytest.FixtureRequest) -> None:
    """The noise of every sample is keyed by its global index and the loader hands rank r positions r, r + 2, ...
    of the epoch, so both runs see the same samples with the same noise and average the same gradients: losses and
    weights agree to float rounding (the two runs sum the batch in a different order)."""
    one = fastgen("train", *recipe, f"dataloader_train.batch_size={2 * per_rank}", *probes(tmp_path, "one"),
                  cwd=tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    if recipe is SFT:
        two = request.getfixturevalue("sft_ddp")
    else:
        two = run_two_ranks(recipe, group, "two", ["trainer.ddp=True", f"dataloader_train.batch_size={per_rank}"],
                            tmp_path, output_root)
    assert_close_losses(losses(tmp_path / "one.losses"), two.losses, rtol=1e-4)
    assert_close_states(final_state(output_root, group, "one"), two.state)


@pytest.mark.slow
@pytest.mark.parametrize("recipe, group, per_rank", [(SFT, "toy", 32), (DMD2_FD, "digits", 8)], ids=["sft", "dmd2"])
def test_fsdp_matches_ddp_and_holds_half_per_rank(recipe: list[str], group: str, per_rank: int, output_root: Path,
                                                  tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """FSDP2 reduce-scatters what DDP all-reduces: the same losses, weights and EMA within float tolerance, while
    each rank holds about half of the parameters, gradients and optimizer state (uneven shards and buffers make
    it a little more than half)."""
    batch = [f"dataloader_train.batch_size={per_rank}"]
    if recipe is SFT:
        ddp = request.getfixturevalue("sft_ddp")
    else:
        ddp = run_two_ranks(recipe, group, "ddp", ["trainer.ddp=True", *batch], tmp_path, output_root)
    fsdp = run_two_ranks(recipe, group, "fsdp", ["trainer.fsdp=True", *batch], tmp_path, output_root)
    assert_close_losses(ddp.losses, fsdp.losses, rtol=1e-4)
    assert_close_states(ddp.state, fsdp.state)
    assert any(key.startswith("model.ema") for key in fsdp.state)  # the EMA is compared too
    for rank in (0, 1):
        ratio = sum(fsdp.bytes[rank].values()) / sum(ddp.bytes[rank].values())
        assert 0.45 <= ratio <= 0.55, (rank, ddp.bytes[rank], fsdp.bytes[rank])


@pytest.mark.slow
def test_two_nodes_on_loopback_train_like_two_workers_on_one_node(output_root: Path, tmp_path: Path,
                                                                    sft_ddp: Run) -> None:
    base = [*SFT, "trainer.ddp=True", "dataloader_train.batch_size=32"]
    port = free_port()
    nodes = [Job([FASTGEN, "train", "--nnodes", "2",
                  "--node-rank", str(rank), "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}", *base,
                  *probes(tmp_path, "nodes")], cwd=tmp_path) for rank in (0, 1)]
    results = [node.wait(300) for node in nodes]
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    assert sft_ddp.losses == losses(tmp_path / "nodes.losses")
    a, b = sft_ddp.state, final_state(output_root, "toy", "nodes")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_sigkill_of_one_rank_stops_the_other_with_one_line_then_the_command_resumes(output_root: Path,
                                                                                      tmp_path: Path) -> None:
    command = ["train", "--nproc-per-node", "2", *SFT, "trainer.ddp=True", "trainer.max_iter=40",
               "trainer.save_ckpt_iter=5", "dataloader_train.batch_size=32", "log_config.name=killed",
               f"+trainer.callbacks.pid={{_target_:rank_probes.PidFile,folder:{tmp_path}}}"]
    job = Job([FASTGEN, *command], cwd=tmp_path)
    checkpoints = output_root / "fastgen" / "toy" / "killed" / "checkpoints"
    deadline = time.monotonic() + 120
    while not (checkpoints / "0000005.pth").exists() or not (tmp_path / "pid1").exists():
        assert job.process.poll() is None, job.wait(10).stderr[-3000:]
        assert time.monotonic() < deadline, "the run never saved its first checkpoint"
        time.sleep(0.1)
    os.kill(int((tmp_path / "pid1").read_text()), signal.SIGKILL)
    result = job.wait(timeout=60)  # well inside trainer.dist_timeout_s: a lost peer is noticed at once
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [errors[0]] and "rank 1" in errors[0] and "SIGKILL" in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    again = fastgen(*command[:-1], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr
    assert (checkpoints / "0000040.pth").exists()


@pytest.mark.slow
def test_a_rank_that_raises_stops_every_rank_with_one_line(output_root: Path, tmp_path: Path) -> None:
    result = fastgen("train", "--nproc-per-node", "2", *SFT, "trainer.ddp=True", "trainer.max_iter=40",
                     "+trainer.callbacks.fail={_target_:rank_probes.FailOn,rank:1,iteration:3}", cwd=tmp_path,
                     timeout=120)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "rank 1" in errors[0] and "boom on rank 1" in errors[0], result.stderr[-3000:]


def test_a_multi_rank_launch_of_a_config_without_ddp_or_fsdp_is_refused(output_root: Path, tmp_path: Path) -> None:
    result = fastgen("train", "--nproc-per-node", "2", *SFT, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "trainer.ddp=True" in errors[0] and "trainer.fsdp=True" in errors[0], errors
    # the same for a worker of any launcher: WORLD_SIZE > 1 and no process group to join is never a replica
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    worker = fastgen("train", *SFT, cwd=tmp_path, env=env, timeout=120)
    assert worker.returncode == 2 and "trainer.ddp or trainer.fsdp" in worker.stderr, worker.stderr
    assert not (output_root / "fastgen").exists()


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["module", "script"])
def test_torchrun_runs_fastgen_as_a_module_and_the_seed_script(entry: str, output_root: Path, tmp_path: Path) -> None:
    target = ["-m", "fastgen", "train"] if entry == "module" else [str(REPO / "train.py")]
    job = Job([TORCHRUN, "--standalone", "--nproc-per-node", "2", *target, *SFT, "trainer.ddp=True",
               f"log_config.name={entry}"], cwd=tmp_path)
    result = job.wait(300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (output_root / "fastgen" / "toy" / entry / "checkpoints" / "0000012.pth").exists()
    assert result.stderr.count("done: 12 iterations") == 1  # only rank 0 reports


META = ["-c", "Digits/config_dmd2_digits", "--eval-samples", "0", "-", "trainer.fsdp=True", "model.r1_weight=1.0",
        "model.r1_estimator=finite_difference", "dataloader_train.batch_size=8"]


@pytest.mark.slow
def test_meta_init_trains_exactly_like_a_real_build(output_root: Path, tmp_path: Path) -> None:
    """With model.meta_init rank 0 alone builds the method for real (reading the shipped teacher) and broadcasts
    the weights into every rank's shards: the run is identical to one that builds on every rank."""
    for name, meta in (("real", "false"), ("meta", "true")):
        result = fastgen("train", "--nproc-per-node", "2", *META, "trainer.max_iter=4", "trainer.save_ckpt_iter=4",
                         f"model.meta_init={meta}", *probes(tmp_path, name), cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    assert losses(tmp_path / "real.losses") == losses(tmp_path / "meta.losses")
    a, b = final_state(output_root, "digits", "real"), final_state(output_root, "digits", "meta")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_meta_init_holds_one_full_copy_on_the_host(output_root: Path, tmp_path: Path) -> None:
    """Without meta_init every rank builds the full method (student, EMA, teacher, fake score; here 4 x 9M
    parameters, ~150 MB, with a random teacher of that size) before sharding it; with it, rank 1 never allocates
    more than its shards. Its peak memory once the model is built is lower by about the half it does not keep:
    measured 0.45 x the full weights (67 of 147 MB; the rest of the build's peak - FSDP's padded shard storage,
    one full tensor at a time during the broadcast - is the same in both)."""
    size = ["trainer.max_iter=1", "model.teacher_ckpt=null", "model.net.backbone.model_channels=96"]
    for name, meta in (("real", "false"), ("meta", "true")):
        result = fastgen("train", "--nproc-per-node", "2", *META, *size, f"model.meta_init={meta}",
                         f"log_config.name={name}",
                         f"+trainer.callbacks.rss={{_target_:rank_probes.PeakRSS,prefix:{tmp_path / name}}}",
                         cwd=tmp_path, env={"MALLOC_MMAP_THRESHOLD_": "65536"})
        assert result.returncode == 0, result.stderr[-3000:]
    real, meta = read_json(tmp_path / "real.rank1.json"), read_json(tmp_path / "meta.rank1.json")
    assert real["local_weight_bytes"] == meta["local_weight_bytes"] < 0.55 * real["full_weight_bytes"]
    assert real["peak_rss_bytes"] - meta["peak_rss_bytes"] >= 0.4 * real["full_weight_bytes"], (real, meta)


def test_pretrained_model_path_on_a_network_that_cannot_read_it_is_refused(output_root: Path, tmp_path: Path) -> None:
    override = "model.pretrained_model_path=/some/weights"
    result = fastgen("dryrun", *SFT, override, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "model.pretrained_model_path is read by diffusers-backed networks only" in lines[0], lines


def test_exact_r1_is_refused_under_fsdp(output_root: Path, tmp_path: Path) -> None:
    result = fastgen("train", "--nproc-per-node", "2", *DMD2, "trainer.fsdp=True", "dataloader_train.batch_size=8",
                     cwd=tmp_path, timeout=180)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model.r1_estimator=finite_difference" in errors[0], result.stderr[-2000:]
    assert not (output_root / "fastgen").exists()


def test_ddp_and_fsdp_together_and_a_bad_shard_size_are_refused(tmp_path: Path) -> None:
    both = fastgen("dryrun", *SFT, "trainer.ddp=True", "trainer.fsdp=True", cwd=tmp_path, timeout=120)
    assert both.returncode == 2 and "choose one" in both.stderr
    bad = fastgen("train", "--nproc-per-node", "2", *SFT, "trainer.fsdp=True", "trainer.fsdp_shard_size=3",
                  cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and "fsdp_shard_size=3" in bad.stderr, bad.stderr[-2000:]


@pytest.mark.slow
def test_progress_on_a_terminal_shows_rank_0_and_global_throughput(output_root: Path, tmp_path: Path) -> None:
    import pty
    import subprocess

    from multirank import job_env

    master, slave = pty.openpty()
    env = job_env({"COLUMNS": "160"})
    env.pop("FASTGEN_NO_PROGRESS", None)
    process = subprocess.Popen([FASTGEN, "train", "--nproc-per-node", "2", *SFT, "trainer.ddp=True",
                                "trainer.max_iter=40", "dataloader_train.batch_size=16"], cwd=tmp_path, stdin=slave,
                               stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        process.wait(timeout=240)
    finally:
        os.close(master)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    screen = b"".join(chunks).decode(errors="replace")
    assert process.returncode == 0, screen[-3000:]
    assert "samples/s" in screen and "40/40" in screen, screen[-3000:]
    assert screen.count("40 iterations") == 1  # rank 0 alone reports ("done" is styled on a terminal)


@pytest.mark.slow
def test_fsdp_mixed_precision_trains_in_bf16_and_keeps_float32_weights(output_root: Path, tmp_path: Path) -> None:
    """trainer.fsdp_param_dtype=bfloat16 all-gathers the float32 shards as bf16 for forward and backward:
    the losses follow the float32 run's to bf16 precision, and the checkpoint (and optimizer) keep float32."""
    runs = {}
    for name, extra in (("fp32", []), ("bf16", ["trainer.fsdp_param_dtype=bfloat16",
                                                "trainer.fsdp_reduce_dtype=float32"])):
        result = fastgen("train", "--nproc-per-node", "2", *SFT, "trainer.fsdp=True", "dataloader_train.batch_size=32",
                         *extra, *probes(tmp_path, name), cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = losses(tmp_path / f"{name}.losses")
    assert runs["fp32"] != runs["bf16"]  # the policy does change the arithmetic
    assert_close_losses(runs["fp32"], runs["bf16"], rtol=0.05)
    state = final_state(output_root, "toy", "bf16")
    assert all(v.dtype == torch.float32 for k, v in state.items() if k.startswith("model.net."))


@pytest.mark.slow
def test_hybrid_sharding_and_no_reshard_train_like_ddp(output_root: Path, tmp_path: Path, sft_ddp: Run) -> None:
    """trainer.fsdp_shard_size=1 on 2 ranks is HSDP on a (2 replicate x 1 shard) mesh; fsdp_reshard_after_forward
    =False keeps the gathered parameters from forward to backward. Both compute what DDP computes."""
    base = [*SFT, "dataloader_train.batch_size=32"]
    for name, extra in (("hsdp", ["trainer.fsdp=True", "trainer.fsdp_shard_size=1"]),
                        ("keep", ["trainer.fsdp=True", "trainer.fsdp_reshard_after_forward=False"])):
        result = fastgen("train", "--nproc-per-node", "2", *base, *extra, *probes(tmp_path, name), cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    for name in ("hsdp", "keep"):
        assert_close_losses(sft_ddp.losses, losses(tmp_path / f"{name}.losses"), rtol=1e-5)
        assert_close_states(sft_ddp.state, final_state(output_root, "toy", name))


def test_cpu_offload_on_a_cpu_run_is_refused(output_root: Path, tmp_path: Path) -> None:
    result = fastgen("train", "--nproc-per-node", "2", *SFT, "trainer.fsdp=True", "trainer.fsdp_cpu_offload=True",
                     cwd=tmp_path, timeout=180)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "trainer.fsdp_cpu_offload" in errors[0], result.stderr[-2000:]
    assert not (output_root / "fastgen").exists()  # found by the workers at start-up: nothing is left behind


def test_a_rank_failing_at_start_up_leaves_no_run_directory_while_another_is_still_starting(
        output_root: Path, tmp_path: Path) -> None:
    """Rank 1 refuses to start while rank 0, which made the run directory, is still starting: torch's agent stops
    rank 0 with SIGTERM, and rank 0 still removes what it made. The launcher reports rank 1's error (exit 2)."""
    probe = f"+trainer.callbacks.startup={{_target_:rank_probes.FailAtStartUp,folder:{tmp_path},rank:1,pause_s:60}}"
    result = fastgen("train", "--nproc-per-node", "2", *SFT, "trainer.ddp=True", probe, cwd=tmp_path, timeout=180)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "rank 1 refuses to start" in errors[0], result.stderr[-2000:]
    assert not (output_root / "fastgen").exists()


def test_a_rank_stopped_while_it_cleans_up_a_failed_start_still_removes_the_run_directory(
        output_root: Path, tmp_path: Path) -> None:
    """Both ranks fail at start-up; rank 1 is gone at once while rank 0 is still cleaning up (10 s in a callback's
    ``on_app_end``) when torch's agent sends it SIGTERM: the signal waits, and the run directory is removed."""
    probe = (f"+trainer.callbacks.startup={{_target_:rank_probes.FailAtStartUp,folder:{tmp_path},rank:-2,"
             "linger_s:10}")
    result = fastgen("train", "--nproc-per-node", "2", *SFT, "trainer.ddp=True", probe, cwd=tmp_path, timeout=180)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "refuses to start" in errors[0], result.stderr[-2000:]
    assert (tmp_path / "cleaning0").exists()
    assert not (output_root / "fastgen").exists()


@pytest.mark.parametrize("swallow", [False, True], ids=["raised", "swallowed"])
def test_sigterm_during_start_up_leaves_no_run_directory(output_root: Path, tmp_path: Path, swallow: bool) -> None:
    """A single process stopped by SIGTERM (a scheduler, ``kill``) before its first step removes the run directory
    it made, ends with one line and 143 (128 + SIGTERM) - also when code it was running swallowed the exception."""
    probe = (f"+trainer.callbacks.startup={{_target_:rank_probes.FailAtStartUp,folder:{tmp_path},rank:-1,pause_s:60,"
             f"swallow:{swallow}}}")
    job = Job([FASTGEN, "train", *SFT, probe], cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not (tmp_path / "starting0").exists():
        assert job.process.poll() is None, job.wait(10).stderr[-3000:]
        assert time.monotonic() < deadline, "the run never reached start-up"
        time.sleep(0.05)
    assert (output_root / "fastgen").exists()  # the run directory is made before the models are built
    job.process.send_signal(signal.SIGTERM)
    result = job.wait(timeout=60)
    assert result.returncode == 143, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "SIGTERM" in errors[0], result.stderr[-3000:]
    assert not (output_root / "fastgen").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_launcher_during_start_up_leaves_no_run_directory(output_root: Path, tmp_path: Path,
                                                                         sig: signal.Signals) -> None:
    """SIGTERM or Ctrl-C to the launcher while every rank is still starting: the agent passes it on, each rank
    stops and rank 0 removes the run directory it made; one line, 128 + the signal."""
    probe = f"+trainer.callbacks.startup={{_target_:rank_probes.FailAtStartUp,folder:{tmp_path},rank:-1,pause_s:60}}"
    job = Job([FASTGEN, "train", "--nproc-per-node", "2", *SFT, "trainer.ddp=True", probe], cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not ((tmp_path / "starting0").exists() and (tmp_path / "starting1").exists()):
        assert job.process.poll() is None, job.wait(10).stderr[-3000:]
        assert time.monotonic() < deadline, "the ranks never reached start-up"
        time.sleep(0.05)
    assert (output_root / "fastgen").exists()
    job.process.send_signal(sig)
    result = job.wait(timeout=90)
    assert result.returncode == 128 + sig, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"stopped by {sig.name}" in errors[0], result.stderr[-3000:]
    assert not (output_root / "fastgen").exists()


@pytest.mark.slow
def test_ctrl_c_to_the_launcher_stops_every_rank_after_a_checkpoint(output_root: Path, tmp_path: Path) -> None:
    """SIGINT to the launcher (Ctrl-C) reaches torch's agent, which passes it to the workers once: they finish the
    step, save a checkpoint and stop; the launcher ends with one line and 130, and the same command resumes."""
    command = ["train", "--nproc-per-node", "2", *SFT, "trainer.ddp=True", "trainer.max_iter=400",
               "trainer.save_ckpt_iter=1000", "dataloader_train.batch_size=32", "log_config.name=stopped",
               f"+trainer.callbacks.pid={{_target_:rank_probes.PidFile,folder:{tmp_path}}}"]
    job = Job([FASTGEN, *command], cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not (tmp_path / "pid1").exists():
        assert job.process.poll() is None, job.wait(10).stderr[-3000:]
        assert time.monotonic() < deadline, "the run never started training"
        time.sleep(0.1)
    job.process.send_signal(signal.SIGINT)
    result = job.wait(timeout=90)
    assert result.returncode == 130, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "stopped by SIGINT" in errors[0], result.stderr[-3000:]
    saved = sorted((output_root / "fastgen" / "toy" / "stopped" / "checkpoints").glob("*.pth"))
    assert saved, "no checkpoint was saved on the way out"
    again = fastgen(*command[:-1], "trainer.max_iter=" + str(int(saved[-1].stem) + 2), cwd=tmp_path)
    assert again.returncode == 0 and "resumed from" in again.stderr, again.stderr[-3000:]
