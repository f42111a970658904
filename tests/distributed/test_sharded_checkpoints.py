"""Sharded (FSDP2 / DCP) and asynchronous checkpoints as users meet them: real gloo workers from the real launcher,
runs killed with SIGKILL mid-run and in the middle of a sharded save, resumes at another world size, a save that
fails on one rank (``fastgen.checkpoint.manager``)."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import pytest
import torch
from fastgen_testing import FASTGEN, run_cli, state_tensors
from multirank import Job, fastgen, losses

TOY = ["-c", "Toy/config_sft_toy", "-", "trainer.logging_iter=4", "model.net.backbone.hidden_dim=64", "model.use_ema=true",
       "+trainer.callbacks.ema={_target_:fastgen.callbacks.ema.EMACallback,beta:0.9}"]
DMD2 = ["-c", "Digits/config_dmd2_digits", "--eval-samples", "0", "-", "trainer.logging_iter=4",
        "model.teacher_ckpt=null", "model.net.backbone.model_channels=8", "model.student_update_freq=2",
        "model.r1_weight=1.0", "model.r1_estimator=finite_difference",
        "model.net_scheduler={_target_:torch.optim.lr_scheduler.LinearLR,start_factor:1.0,end_factor:0.5,total_iters:4}"]


def checkpoints(output_root: Path, group: str, name: str) -> Path:
    return output_root / "fastgen" / group / name / "checkpoints"


def final_tensors(folder: Path, iteration: int) -> dict[str, torch.Tensor]:
    from fastgen.checkpoint.checkpointer import load_checkpoint

    return state_tensors(load_checkpoint(folder / f"{iteration:07d}.pth"))


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [key for key in a if not torch.equal(a[key], b[key])]
    assert not different, different[:5]


def sample_ids(prefix: Path) -> list[int]:
    ids: list[int] = []
    for path in sorted(prefix.parent.glob(prefix.name + ".rank*")):
        for line in path.read_text().splitlines():
            ids.extend(int(value) for value in line.split()[1:])
    return ids


def wait_for(path: Path, job: Job, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert job.process.poll() is None, job.wait(10).stderr[-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.slow
def test_sigkill_mid_run_and_during_a_sharded_save_then_the_same_command_is_bit_identical(output_root: Path,
                                                                                          tmp_path: Path) -> None:
    run = ["train", "--nproc-per-node", "2", *TOY, "trainer.fsdp=True", "trainer.max_iter=12",
           "trainer.save_ckpt_iter=4"]
    reference = fastgen(*run, "log_config.name=straight", cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    killed = [*run, "log_config.name=killed",
              f"+trainer.callbacks.pid={{_target_:rank_probes.PidFile,folder:{tmp_path},pause_s:0.3}}",
              f"+trainer.callbacks.stall={{_target_:rank_probes.StallSave,flag:{tmp_path / 'stalled'},at:8}}"]
    folder = checkpoints(output_root, "toy", "killed")
    job = Job([FASTGEN, *killed], cwd=tmp_path)  # 1: SIGKILL to every process mid-run, after the first checkpoint
    wait_for(folder / "0000004.pth", job)
    job.kill()
    job.wait(30)
    job = Job([FASTGEN, *killed], cwd=tmp_path)  # 2: SIGKILL while rank 0 waits to write DCP's metadata at 8
    wait_for(tmp_path / "stalled", job)
    job.kill()
    job.wait(30)
    assert (folder / "0000008.dcp").is_dir() and not (folder / "0000008.pth").exists()
    (tmp_path / "stalled").unlink()
    again = fastgen(*killed[:-1], cwd=tmp_path)  # 3: the same command (without the stall) resumes from 4
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr and "0000004.pth" in again.stderr
    assert_identical(final_tensors(folder, 12), final_tensors(checkpoints(output_root, "toy", "straight"), 12))
    # the EMA is among what matched, and the folders hold shards of both ranks
    assert any(key.startswith("model.ema.") for key in final_tensors(folder, 12))
    assert {p.name for p in (folder / "0000012.dcp").glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}


@pytest.mark.slow
def test_dmd2_round_trips_through_a_sharded_checkpoint(output_root: Path, tmp_path: Path) -> None:
    run = ["train", "--nproc-per-node", "2", *DMD2, "trainer.fsdp=True", "trainer.save_ckpt_iter=2"]
    straight = fastgen(*run, "trainer.max_iter=4", "log_config.name=straight", cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    first = fastgen(*run, "trainer.max_iter=2", "log_config.name=resumed", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    second = fastgen(*run, "trainer.max_iter=4", "log_config.name=resumed", cwd=tmp_path)
    assert second.returncode == 0 and "resumed from" in second.stderr, second.stderr[-3000:]
    resumed = final_tensors(checkpoints(output_root, "digits", "resumed"), 4)
    assert {key.split(".")[1] for key in resumed if key.startswith("model.")} == {
        "net", "fake_score", "discriminator", "ema"}  # not the frozen teacher: rebuilt from its source
    assert {key.split(".")[1] for key in resumed if key.startswith("optimizers.")} == {
        "net", "fake_score", "discriminator"}
    assert_identical(resumed, final_tensors(checkpoints(output_root, "digits", "straight"), 4))


@pytest.mark.slow
def test_a_sharded_checkpoint_resumes_at_another_world_size(output_root: Path, tmp_path: Path) -> None:
    """2 ranks, then 1, then 2 again, at the same global batch (64): the loss curve continues where it stopped
    (the noise is keyed by sample, so only summation order differs from the uninterrupted 2-rank run) and every
    sample of the epoch is seen once."""
    def command(world: int, max_iter: int, name: str) -> list[str]:
        return ["train", "--nproc-per-node", str(world), *TOY, "trainer.fsdp=True", f"trainer.max_iter={max_iter}",
                "trainer.save_ckpt_iter=4", f"dataloader_train.batch_size={64 // world}", f"log_config.name={name}",
                f"+trainer.callbacks.loss_log={{_target_:rank_probes.LossLog,path:{tmp_path / (name + '.losses')}}}",
                f"+trainer.callbacks.ids={{_target_:rank_probes.SampleLog,prefix:{tmp_path / (name + '.ids')}}}"]

    straight = fastgen(*command(2, 12, "straight"), cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    for world, max_iter in ((2, 4), (1, 8), (2, 12)):
        result = fastgen(*command(world, max_iter, "moved"), cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        if max_iter > 4:
            before = 3 - world
            assert f"resumed a {before}-rank checkpoint on {world} rank(s)" in result.stderr, result.stderr[-3000:]
    reference, moved = losses(tmp_path / "straight.losses"), losses(tmp_path / "moved.losses")
    assert [it for it, _ in moved] == list(range(1, 13))
    for (it, expected), (_, value) in zip(reference, moved):
        assert value == pytest.approx(expected, rel=1e-4, abs=1e-6), (it, value, expected)
    ids = sample_ids(tmp_path / "moved.ids")
    assert sorted(ids) == list(range(12 * 64))  # no sample repeated or skipped (the toy epoch is longer)


@pytest.mark.slow
def test_a_rank_that_fails_a_sharded_save_fails_the_save_on_every_rank(output_root: Path, tmp_path: Path) -> None:
    result = fastgen("train", "--nproc-per-node", "2", *TOY, "trainer.fsdp=True", "trainer.max_iter=8",
                     "trainer.save_ckpt_iter=4", "log_config.name=full",
                     "+trainer.callbacks.fail={_target_:rank_probes.FailSave,rank:1,at:8}", cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0] and "rank 1" in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    folder = checkpoints(output_root, "toy", "full")
    assert (folder / "0000004.pth").exists() and not (folder / "0000008.pth").exists()


@pytest.mark.parametrize("ranks", [1, 2], ids=["monolithic", "sharded"])
def test_async_saves_write_what_synchronous_saves_write(ranks: int, output_root: Path, tmp_path: Path) -> None:
    """Async saves (one process: a writer thread; 2-rank FSDP: ``dcp.async_save`` with reused host buffers) hold
    exactly what synchronous saves hold, and each becomes valid (its marker written) as soon as it is written,
    while training goes on - not at the next save."""
    launch = [] if ranks == 1 else ["--nproc-per-node", "2"]
    layout = [] if ranks == 1 else ["trainer.fsdp=True"]
    for name, flag in (("sync", "False"), ("async", "True")):
        seen = (f"+trainer.callbacks.seen={{_target_:rank_probes.MarkerSeen,folder:{checkpoints(output_root, 'toy', name)},"
                f"path:{tmp_path / (name + '.seen')},every:2}}")
        result = fastgen("train", *launch, *TOY, *layout, "trainer.max_iter=6", "trainer.save_ckpt_iter=2",
                         f"log_config.name={name}", f"trainer.checkpointer.async_save={flag}",
                         "trainer.checkpointer.keep_last_n=2", seen, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert (tmp_path / f"{name}.seen").read_text().split() == ["2", "True", "4", "True"]
    sync, asynchronous = checkpoints(output_root, "toy", "sync"), checkpoints(output_root, "toy", "async")
    expected = ["0000004.pth", "0000006.pth"]
    if ranks == 2:
        expected = ["0000004.dcp", "0000004.pth", "0000006.dcp", "0000006.pth"]
    assert sorted(p.name for p in asynchronous.iterdir()) == expected
    for iteration in (4, 6):
        assert_identical(final_tensors(asynchronous, iteration), final_tensors(sync, iteration))


def test_a_failed_async_save_is_one_line_and_leaves_the_previous_checkpoint(output_root: Path, tmp_path: Path) -> None:
    result = run_cli("train", *TOY, "trainer.max_iter=8", "trainer.save_ckpt_iter=2", "log_config.name=a",
                     "trainer.checkpointer.async_save=True",
                     "+trainer.callbacks.fail={_target_:rank_probes.FailSave,rank:0,at:4}", cwd=tmp_path,
                     env={"PYTHONPATH": str(Path(__file__).parents[1])})
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "0000004.pth" in errors[0] and "No space left" in errors[0], result.stderr[-3000:]
    folder = checkpoints(output_root, "toy", "a")
    assert sorted(p.name for p in folder.iterdir()) == ["0000002.pth"]


def test_sharded_and_monolithic_checkpoints_do_not_mix_and_pretrained_bridges_them(output_root: Path,
                                                                                    tmp_path: Path) -> None:
    sharded = run_cli("train", *TOY, "trainer.fsdp=True", "trainer.max_iter=2", "log_config.name=s", cwd=tmp_path)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    marker = checkpoints(output_root, "toy", "s") / "0000002.pth"
    assert (marker.with_suffix(".dcp") / ".metadata").is_file()
    config_before = (marker.parents[1] / "config.yaml").read_text()
    refused = run_cli("train", *TOY, "trainer.max_iter=4", "log_config.name=s", cwd=tmp_path)
    assert refused.returncode == 1
    (line,) = [line for line in refused.stderr.splitlines() if line.strip()]
    assert "cannot resume from the sharded checkpoint" in line and "pretrained_ckpt_path=" in line, line
    assert (marker.parents[1] / "config.yaml").read_text() == config_before
    bridged = run_cli("train", *TOY, "trainer.max_iter=2", "log_config.name=m",
                      f"trainer.checkpointer.pretrained_ckpt_path={marker}", cwd=tmp_path)
    assert bridged.returncode == 0 and "initialised weights from" in bridged.stderr, bridged.stderr[-3000:]
    back = run_cli("train", *TOY, "trainer.fsdp=True", "trainer.max_iter=4", "log_config.name=m", cwd=tmp_path)
    assert back.returncode == 1 and "cannot resume from the monolithic checkpoint" in back.stderr


def test_keep_last_n_removes_folders_and_an_interrupted_save(output_root: Path, tmp_path: Path) -> None:
    folder = checkpoints(output_root, "toy", "k")
    folder.mkdir(parents=True)
    (folder / "0000001.dcp").mkdir()  # a save that never got its marker
    (folder / "0000001.dcp" / "__0_0.distcp").write_bytes(b"partial")
    result = run_cli("train", *TOY, "trainer.fsdp=True", "trainer.max_iter=6", "trainer.save_ckpt_iter=2",
                     "trainer.checkpointer.keep_last_n=2", "log_config.name=k", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" not in result.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["0000004.dcp", "0000004.pth", "0000006.dcp", "0000006.pth"]


def test_a_checkpoint_folder_whose_metadata_would_run_code_is_refused(tmp_path: Path) -> None:
    from fastgen.checkpoint.checkpointer import read_sharded_as_full
    from fastgen.utils.errors import CheckpointError

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    folder = tmp_path / "0000001.dcp"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointError, match=r"it names \w+\.system"):
        read_sharded_as_full(folder)
    assert not (tmp_path / "pwned").exists()


def test_a_sharded_marker_without_its_folder_names_the_folder(tmp_path: Path) -> None:
    """An FSDP run resuming from a marker whose ``.dcp`` folder is gone is told which folder is missing (it used
    to read "cannot resume from the monolithic checkpoint")."""
    from types import SimpleNamespace

    from fastgen.checkpoint.manager import CheckpointManager
    from fastgen.utils.errors import CheckpointError

    config = SimpleNamespace(save_dir="checkpoints", use_s3=False, s3_container=None, keep_last_n=None,
                             pretrained_ckpt_path=None, async_save=False)
    manager = CheckpointManager(config, tmp_path, sharded=True)
    marker = tmp_path / "checkpoints" / "0000004.pth"
    marker.parent.mkdir()
    torch.save({"format": "fastgen-checkpoint", "version": 3, "iteration": 4, "layout": "sharded"}, marker)
    with pytest.raises(CheckpointError, match=r"0000004\.dcp is missing or has no \.metadata"):
        manager.check_layout(str(marker))
