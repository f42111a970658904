"""Training checkpoints in S3 (``trainer.checkpointer.use_s3``), against a real SeaweedFS server on loopback:
save and resume in both formats, a server that goes away mid-run, credentials that are rejected."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from fastgen_testing import FASTGEN, run_cli, state_tensors
from multirank import Job, fastgen
from s3server import S3Server, running_seaweedfs

TOY = ["-c", "Toy/config_sft_toy", "-", "trainer.logging_iter=2", "model.net.backbone.hidden_dim=64", "model.use_ema=true",
       "+trainer.callbacks.ema={_target_:fastgen.callbacks.ema.EMACallback,beta:0.9}"]


def s3_args(server: S3Server, credentials: Path, container: str) -> list[str]:
    return ["trainer.checkpointer.use_s3=True", f"trainer.checkpointer.s3_container={server.bucket}/{container}",
            f"credentials_dir={credentials}"]


def objects(server: S3Server, prefix: str) -> list[str]:
    client = server.client()
    found = client.list_objects_v2(Bucket=server.bucket, Prefix=prefix).get("Contents", [])
    return sorted(item["Key"][len(prefix):] for item in found)


def s3_tensors(server: S3Server, credentials: Path, url: str) -> dict[str, torch.Tensor]:
    from fastgen.checkpoint.stores import S3Store

    store = S3Store(url.rsplit("/", 1)[0], None, str(credentials))
    return state_tensors(store.read(url, whole=True))


def local_tensors(path: Path) -> dict[str, torch.Tensor]:
    from fastgen.checkpoint.checkpointer import load_checkpoint

    return state_tensors(load_checkpoint(path))


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert [key for key in a if not torch.equal(a[key], b[key])] == []


def test_a_run_saves_to_s3_and_the_same_command_resumes_from_it(s3_server: S3Server, output_root: Path,
                                                                  tmp_path: Path) -> None:
    credentials = s3_server.write_credentials(tmp_path / "credentials")
    run = ["train", *TOY, "trainer.save_ckpt_iter=2", "log_config.name=s3run", *s3_args(s3_server, credentials, "mono")]
    first = run_cli(*run, "trainer.max_iter=4", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    prefix = "mono/fastgen/toy/s3run/checkpoints/"
    assert objects(s3_server, prefix) == ["0000002.pth", "0000004.pth"]
    assert not (output_root / "fastgen" / "toy" / "s3run" / "checkpoints").exists()  # nothing local
    again = run_cli(*run, "trainer.max_iter=6", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from s3://{s3_server.bucket}/{prefix}0000004.pth" in again.stderr
    straight = run_cli("train", *TOY, "trainer.save_ckpt_iter=2", "trainer.max_iter=6", "log_config.name=local",
                       cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert_identical(s3_tensors(s3_server, credentials, f"s3://{s3_server.bucket}/{prefix}0000006.pth"),
                     local_tensors(output_root / "fastgen" / "toy" / "local" / "checkpoints" / "0000006.pth"))
    # a new local run starts from the S3 checkpoint's weights (lr 0: they stay exactly what was read)
    marker = f"s3://{s3_server.bucket}/{prefix}0000004.pth"
    bridged = run_cli("train", *TOY, "trainer.max_iter=2", "log_config.name=from_s3", "model.net_optimizer.lr=0",
                      f"credentials_dir={credentials}", f"trainer.checkpointer.pretrained_ckpt_path={marker}", cwd=tmp_path)
    assert bridged.returncode == 0 and f"initialised weights from {marker}" in bridged.stderr, bridged.stderr[-3000:]
    started = local_tensors(output_root / "fastgen" / "toy" / "from_s3" / "checkpoints" / "0000002.pth")
    read = s3_tensors(s3_server, credentials, marker)
    nets = [key for key in read if key.startswith("model.net.")]
    assert nets and all(torch.equal(started[key], read[key]) for key in nets)
    secrets = (s3_server.secret_access_key, s3_server.access_key_id)
    config_yaml = (output_root / "fastgen" / "toy" / "s3run" / "config.yaml").read_text()
    assert not any(secret in first.stderr + again.stderr + config_yaml for secret in secrets)


@pytest.mark.slow
def test_a_sharded_two_rank_run_saves_to_s3_and_resumes_bit_identical(s3_server: S3Server, output_root: Path,
                                                                      tmp_path: Path) -> None:
    credentials = s3_server.write_credentials(tmp_path / "credentials")
    run = ["train", "--nproc-per-node", "2", *TOY, "trainer.fsdp=True", "trainer.save_ckpt_iter=2",
           *s3_args(s3_server, credentials, "sharded")]
    straight = fastgen(*run, "trainer.max_iter=4", "log_config.name=straight", cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    first = fastgen(*run, "trainer.max_iter=2", "log_config.name=resumed", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    second = fastgen(*run, "trainer.max_iter=4", "log_config.name=resumed", cwd=tmp_path)
    assert second.returncode == 0 and "resumed from s3://" in second.stderr, second.stderr[-3000:]
    prefix = "sharded/fastgen/toy/resumed/checkpoints/"
    keys = objects(s3_server, prefix)
    assert {"0000002.pth", "0000002.dcp/.metadata", "0000004.pth", "0000004.dcp/.metadata"} <= set(keys), keys
    assert {key for key in keys if key.startswith("0000004.dcp/") and key.endswith(".distcp")} == {
        "0000004.dcp/__0_0.distcp", "0000004.dcp/__1_0.distcp"}
    bucket = f"s3://{s3_server.bucket}/"
    assert_identical(s3_tensors(s3_server, credentials, f"{bucket}{prefix}0000004.pth"),
                     s3_tensors(s3_server, credentials, f"{bucket}sharded/fastgen/toy/straight/checkpoints/0000004.pth"))
    # a one-process run starts from the sharded S3 checkpoint, assembled into whole tensors
    bridged = run_cli("train", *TOY, "trainer.max_iter=2", "log_config.name=from_sharded", f"credentials_dir={credentials}",
                      f"trainer.checkpointer.pretrained_ckpt_path={bucket}{prefix}0000004.pth", cwd=tmp_path)
    assert bridged.returncode == 0 and "initialised weights from s3://" in bridged.stderr, bridged.stderr[-3000:]


def test_a_server_that_goes_away_mid_run_is_one_line_after_retries(output_root: Path, tmp_path: Path) -> None:
    with running_seaweedfs(tmp_path / "doomed") as server:
        credentials = server.write_credentials(tmp_path / "credentials")
        job = Job([FASTGEN, "train", *TOY, "trainer.save_ckpt_iter=2", "trainer.max_iter=40", "log_config.name=gone",
                   *s3_args(server, credentials, "gone"),
                   f"+trainer.callbacks.pid={{_target_:rank_probes.PidFile,folder:{tmp_path},pause_s:0.2}}"],
                  cwd=tmp_path)
        deadline = time.monotonic() + 120
        while "0000002.pth" not in objects(server, "gone/fastgen/toy/gone/checkpoints/"):
            assert job.process.poll() is None, job.wait(10).stderr[-3000:]
            assert time.monotonic() < deadline, "the run never saved its first checkpoint"
            time.sleep(0.2)
        server.process.kill()  # the server crashes
        server.process.wait(timeout=10)
        result = job.wait(timeout=240)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "did not answer" in errors[0] and server.endpoint_url in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr and server.secret_access_key not in result.stderr


def test_rejected_credentials_name_their_source_and_print_no_secret(s3_server: S3Server, output_root: Path,
                                                                     tmp_path: Path) -> None:
    wrong = "not-the-secret-0123456789"
    credentials = s3_server.write_credentials(tmp_path / "credentials", aws_secret_access_key=wrong)
    result = run_cli("train", *TOY, "trainer.max_iter=2", "log_config.name=denied",
                     *s3_args(s3_server, credentials, "denied"), cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert "s3.json" in line and "rejected" in line, line
    assert wrong not in result.stderr and s3_server.access_key_id not in result.stderr
    assert not (output_root / "fastgen" / "toy" / "denied").exists()  # start-up failed: nothing left behind


def test_use_s3_without_a_container_is_a_config_error(tmp_path: Path) -> None:
    result = run_cli("train", *TOY, "trainer.max_iter=2", "trainer.checkpointer.use_s3=True", cwd=tmp_path)
    assert result.returncode == 2
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert "trainer.checkpointer.s3_container" in line, line


def test_two_ddp_ranks_copy_the_state_on_rank_0_alone_and_download_a_resume_once(
        s3_server: S3Server, output_root: Path, tmp_path: Path) -> None:
    """Issue 32, point 3: in a replicated (DDP) run only rank 0 builds the host copy of the state - at checkpoint
    saves and at EMA snapshots - and a resume from S3 downloads the checkpoint once per node, not once per rank
    (2 ranks, one node: one download; both ranks then map that file)."""
    credentials = s3_server.write_credentials(tmp_path / "credentials")
    ema = "+trainer.callbacks.ema={_target_:fastgen.callbacks.ema.EMACallback,type:power,sigma_rel:0.1,snapshot_iter:2}"
    run = ["train", "--nproc-per-node", "2", "-c", "Toy/config_sft_toy", "-", "trainer.ddp=True",
           "model.net.backbone.hidden_dim=64", "model.use_ema=true", ema, "trainer.save_ckpt_iter=2",
           "log_config.name=copies", *s3_args(s3_server, credentials, "copies")]
    counts = {}
    for phase, max_iter in (("first", 4), ("resumed", 6)):
        folder = tmp_path / phase
        folder.mkdir()
        probe = f"+trainer.callbacks.copies={{_target_:rank_probes.CountHostCopies,folder:{folder}}}"
        result = fastgen(*run, f"trainer.max_iter={max_iter}", probe, cwd=tmp_path, timeout=240)
        assert result.returncode == 0, result.stderr[-3000:]
        counts[phase] = [(folder / f"copies{rank}").read_text().splitlines() if (folder / f"copies{rank}").exists()
                         else [] for rank in (0, 1)]
    assert "resumed from s3://" in result.stderr
    for phase in counts:
        rank0, rank1 = counts[phase]
        assert [line for line in rank1 if line.startswith("full_")] == [], (phase, rank1)
        assert any(line.startswith("full_state_dict") for line in rank0), (phase, rank0)
    downloads = [line for rank in counts["resumed"] for line in rank if line.startswith("download")
                 and line.endswith("0000004.pth")]
    assert len(downloads) == 1, counts["resumed"]
    snapshots = output_root / "fastgen" / "toy" / "copies" / "ema_snapshots"
    assert len(list(snapshots.glob("*.pt"))) == 3  # t = 2, 4, 6: written by rank 0
