"""A run directory holds one run: its lock (``fastgen.checkpoint.run_lock``, local and S3), checkpoint retention that
never deletes what was just written, and a fresh start that never lands on another run's checkpoints."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastgen_testing import run_cli
from s3server import S3Server

from fastgen.checkpoint import run_lock
from fastgen.checkpoint.checkpointer import Checkpointer, iterations_to_prune
from fastgen.checkpoint.run_lock import RunDirectoryBusy, RunLock, S3RunLock

HOLD = """
import sys, time
from fastgen.checkpoint.run_lock import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


def hold_in_another_process(folder: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_held_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    holder = hold_in_another_process(tmp_path)
    try:
        with pytest.raises(RunDirectoryBusy, match=rf"in use by another run \(pid {holder.pid} on host "):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_killed_runs_lock_is_taken_over_with_a_warning(tmp_path: Path, fastgen_records) -> None:  # noqa: ANN001
    holder = hold_in_another_process(tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    lock = RunLock(tmp_path)
    lock.acquire()
    assert any(f"pid {holder.pid}" in r.getMessage() and "no longer running" in r.getMessage() for r in fastgen_records.records)
    assert json.loads((tmp_path / run_lock.LOCK_NAME).read_text())["pid"] != holder.pid
    lock.release()
    assert not (tmp_path / run_lock.LOCK_NAME).exists()
    again = RunLock(tmp_path)  # released: free at once, no warning needed
    again.acquire()
    again.release()


def test_two_locks_in_one_process_exclude_each_other(tmp_path: Path) -> None:
    first = RunLock(tmp_path)
    first.acquire()
    with pytest.raises(RunDirectoryBusy):
        RunLock(tmp_path).acquire()
    first.release()


# ---- S3 -------------------------------------------------------------------------------------------------------------
def s3_lock(server: S3Server, tmp_path: Path, key: str) -> S3RunLock:
    from fastgen.checkpoint.s3 import S3Location, S3Storage

    storage = S3Storage.from_config(str(server.write_credentials(tmp_path / "credentials")))
    return S3RunLock(storage, S3Location(server.bucket, key))


def test_an_s3_lock_refuses_a_second_run_and_a_stale_one_is_taken_over(s3_server: S3Server, tmp_path: Path,
                                                                        fastgen_records) -> None:  # noqa: ANN001
    first = s3_lock(s3_server, tmp_path, "locks/run/.fastgen.lock")
    first.acquire()
    with pytest.raises(RunDirectoryBusy, match=r"s3://.*/locks/run is in use by another run \(pid \d+ on host"):
        s3_lock(s3_server, tmp_path, "locks/run/.fastgen.lock").acquire()
    first.release()
    assert first._read() is None  # released: the object is gone
    # a run that died without releasing: its heartbeat ages past S3_STALE_S
    stale = {"host": "elsewhere", "pid": 4242, "since": "2026-01-01T00:00:00+00:00", "token": "old",
             "heartbeat": time.time() - run_lock.S3_STALE_S - 1}
    first.storage.upload_bytes(json.dumps(stale).encode(), first.location)
    second = s3_lock(s3_server, tmp_path, "locks/run/.fastgen.lock")
    second.acquire()
    assert any("pid 4242 on host elsewhere" in r.getMessage() for r in fastgen_records.records)
    second.release()


# ---- retention ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("valid", "written", "keep", "pruned"), [
    ([10, 20, 30], 30, 2, [10]),
    ([10, 20, 30], 30, 1, [10, 20]),
    ([10, 20, 30], 30, 5, []),
    ([10, 30, 40], 10, 1, [30]),  # higher iterations in the folder: never the one written, never the newest
    ([30, 40, 50, 10], 10, 2, [30]),
])
def test_retention_never_deletes_the_checkpoint_written_or_the_newest(valid: list[int], written: int, keep: int,
                                                                      pruned: list[int]) -> None:
    assert iterations_to_prune(valid, written, keep) == pruned


def test_a_save_below_higher_iterations_keeps_its_file(tmp_path: Path) -> None:
    files = Checkpointer("checkpoints", tmp_path, keep_last_n=1)
    for iteration in (30, 10):
        files.save({"iteration": iteration}, iteration)
    assert [iteration for iteration, _ in files.list()] == [10, 30]


# ---- the commands -----------------------------------------------------------------------------------------------
def test_one_run_per_directory_from_the_command_line(tmp_path: Path, output_root: Path) -> None:
    """The issue's repros: a second run on a live directory, a fresh start over another run's checkpoints and a
    retention that keeps nothing are each refused in one line (exit 2), and the first run's files stay intact."""
    train = ["train", "-c", "Toy/config_sft_toy", "-", "log_config.name=shared", "trainer.save_ckpt_iter=2"]
    run_dir = output_root / "fastgen" / "toy" / "shared"
    first = subprocess.Popen([str(Path(sys.executable).parent / "fastgen"), *train, "trainer.max_iter=400"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / run_lock.LOCK_NAME).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        second = run_cli(*train, "trainer.max_iter=4", cwd=tmp_path)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {first.pid} on host" in lines[0] and "log_config.name" in lines[0]
        _, stderr = first.communicate(timeout=300)
        assert first.returncode == 0, stderr[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert run_dir.is_dir() and (run_dir / "checkpoints" / "0000400.pth").is_file()
    assert not (run_dir / run_lock.LOCK_NAME).exists()  # released at the end
    fresh = run_cli(*train, "trainer.max_iter=10", "trainer.resume=False", cwd=tmp_path)
    assert fresh.returncode == 2 and "0000400.pth" in fresh.stderr and "log_config.name" in fresh.stderr, fresh.stderr
    assert len(fresh.stderr.strip().splitlines()) == 1
    nothing_kept = run_cli("train", "-c", "Toy/config_sft_toy", "-", "log_config.name=keep0",
                           "trainer.checkpointer.keep_last_n=0", cwd=tmp_path)
    assert nothing_kept.returncode == 2 and "keep_last_n=0" in nothing_kept.stderr, nothing_kept.stderr
    assert not (output_root / "fastgen" / "toy" / "keep0").exists()
    resumed = run_cli(*train, "trainer.max_iter=402", cwd=tmp_path)
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr and "0000400.pth" in resumed.stderr


def test_an_s3_retention_error_after_a_good_upload_warns_and_training_goes_on(
        s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fastgen_records) -> None:  # noqa: ANN001
    from fastgen.checkpoint import s3
    from fastgen.checkpoint.stores import S3Store, torch_save_to

    credentials = s3_server.write_credentials(tmp_path / "credentials")
    store = S3Store(f"s3://{s3_server.bucket}/retention/checkpoints", 1, str(credentials))
    store.write(2, torch_save_to({"iteration": 2}))

    def listing_fails(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise s3.S3StorageError("S3 request failed (SlowDown) while listing")

    monkeypatch.setattr(s3, "scan_checkpoints", listing_fails)
    url = store.write(4, torch_save_to({"iteration": 4}))  # no exception: the save succeeded
    assert url.endswith("0000004.pth") and store.storage.exists(s3.S3Location.parse(url))
    assert any("removing older ones" in r.getMessage() and "SlowDown" in r.getMessage()
               for r in fastgen_records.records)
