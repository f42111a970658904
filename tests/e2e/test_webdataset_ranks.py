"""WebDataset through the real launcher: 2 gloo ranks x 2 DataLoader workers read shards from a local folder and
from a real SeaweedFS S3 server; one pass holds every sample exactly once, and a job SIGKILLed after saving its
loader state continues, in fresh processes, with exactly the batches the killed job read next."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fastgen.datasets.webdataset import write_shards
from multirank import TORCHRUN, Job
from s3server import S3Server

SHARDS, PER_SHARD, STOP, TOTAL = 8, 12, 5, 14  # one pass = 96 samples = 12 batches of 4 on each of 2 ranks


def write_local_shards(folder: Path) -> list[str]:
    samples = [{"__key__": f"shard{i // PER_SHARD}/{i:04d}", "cls": str(i % 10).encode()}
               for i in range(SHARDS * PER_SHARD)]
    write_shards(samples, folder, PER_SHARD)
    return [s["__key__"] for s in samples]


def run_job(tmp_path: Path, tag: str, env: dict[str, str]) -> tuple[list[list[list[str]]], list[list[list[str]]]]:
    """Start the job, SIGKILL it once both ranks are done, resume it; every rank's batches and resumed batches."""
    out = tmp_path / "out"
    out.mkdir()
    args = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(Path(__file__).parents[1] / "wds_job.py"),
            str(out), tag, str(STOP), str(TOTAL)]
    job = Job(args, cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 180
        while not all((out / f"ready{r}").exists() for r in (0, 1)):
            if job.process.poll() is not None:
                raise AssertionError(f"the job exited with {job.process.returncode}:\n{job.process.stderr.read()[-4000:]}")
            assert time.monotonic() < deadline, "the job did not read its batches within 180 s"
            time.sleep(0.2)
    finally:
        job.kill()  # SIGKILL: launcher, ranks and their DataLoader workers
    resumed = Job(args, cwd=tmp_path, env=env).wait(180)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    read = [json.loads((out / f"batches{r}.json").read_text()) for r in (0, 1)]
    again = [json.loads((out / f"resumed{r}.json").read_text()) for r in (0, 1)]
    return read, again


def check(read: list, again: list, keys: list[str]) -> None:
    first_pass = [key for rank in read for batch in rank[:12] for key in batch]
    assert sorted(first_pass) == sorted(keys)  # every sample exactly once in the pass, across ranks and workers
    for rank in (0, 1):
        assert again[rank] == read[rank][STOP:], rank


@pytest.mark.slow
def test_two_ranks_two_workers_local_shards_once_per_pass_and_exact_after_sigkill(tmp_path: Path) -> None:
    keys = write_local_shards(tmp_path / "shards")
    check(*run_job(tmp_path, f"WDS:{tmp_path / 'shards'}", {}), keys)


@pytest.mark.slow
def test_two_ranks_two_workers_s3_shards_once_per_pass_and_exact_after_sigkill(tmp_path: Path, s3_server: S3Server) -> None:
    keys = write_local_shards(tmp_path / "shards")
    client = s3_server.client()
    for shard in sorted((tmp_path / "shards").iterdir()):
        client.upload_file(str(shard), s3_server.bucket, f"wds-ranks/train/{shard.name}")
    check(*run_job(tmp_path, f"WDS:s3://{s3_server.bucket}/wds-ranks/train", s3_server.environment()), keys)
