"""Helpers for tests that run real multi-rank jobs through the real launcher (``fastgen train --nproc-per-node``,
``torchrun``): every process in its own session, a timeout on each, and the whole process group killed when a
test fails or times out, so no worker outlives its test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from fastgen_testing import FASTGEN, interruptible

TESTS_DIR = Path(__file__).parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a job: the test's, one thread per worker, the tests folder importable (test callbacks)."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(TESTS_DIR), env.get("PYTHONPATH", "")]))
    env.update(extra or {})
    return env


JOB_TAG = "FASTGEN_TEST_JOB"


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries ``FASTGEN_TEST_JOB=tag``: a job's launcher and its workers (torch's
    agent starts each worker in a session of its own, so killing the launcher's process group misses them)."""
    needle = f"{JOB_TAG}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


class Job:
    """A command started in its own process session, its processes tagged in their environment; ``kill`` ends
    all of them (the launcher's session and every worker), ``wait`` kills them on timeout."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.tag = uuid.uuid4().hex
        self.process = subprocess.Popen(args, cwd=cwd, env=job_env({**(env or {}), JOB_TAG: self.tag}),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True, preexec_fn=interruptible)

    def wait(self, timeout: float = 300) -> subprocess.CompletedProcess:
        try:
            stdout, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            stdout, stderr = self.process.communicate()
            raise AssertionError(f"{' '.join(self.args)} did not finish within {timeout:.0f} s:\n{stderr[-4000:]}")
        finally:
            self.kill()  # workers left behind by a launcher that exited
        return subprocess.CompletedProcess(self.args, self.process.returncode, stdout, stderr)

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in tagged_pids(self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def fastgen(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``fastgen ARGS`` (possibly a launcher of several workers) and wait for it, killing its session on
    timeout."""
    return Job([FASTGEN, *args], cwd, env).wait(timeout)


def losses(path: Path) -> list[tuple[int, float]]:
    """The ``(iteration, loss averaged over ranks)`` rows a ``LossLog`` callback wrote."""
    return [(int(it), float(value)) for it, value in (line.split() for line in path.read_text().splitlines())]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
