"""How a rank of a multi-rank job ends (``cli.main._end_rank``): its atexit handlers run and its output is flushed,
but the interpreter is not finalized - finalizing while torch's gloo worker threads still release a finished
collective aborted ranks after successful runs ("terminate called without an active exception")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A command run as `fastgen --version` would be, with an atexit handler that leaves its write unflushed, a
# non-daemon thread still running when the command ends (the interpreter waits for it before atexit) and an idle
# thread pool (the interpreter stops its workers; waiting for them without that would hang). Run with
# `python -v`, whose "# cleanup ..." lines on stderr show that the interpreter was finalized.
PROGRAM = """
import atexit, sys, threading, time
atexit.register(lambda: sys.stdout.write("atexit ran, unflushed"))
threading.Thread(target=lambda: (time.sleep(0.5), sys.stdout.write("thread joined\\n"))).start()
from concurrent.futures import ThreadPoolExecutor
POOL = ThreadPoolExecutor(2)  # idle non-daemon workers, as torch.compile's pool leaves: stopped, not waited on forever
POOL.submit(int).result()
sys.argv = ["fastgen", *sys.argv[1:]]
from fastgen.cli.main import main
main()
"""


def run_command(world_size: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORLD_SIZE": world_size, "RANK": "0", "LOCAL_RANK": "0"}
    return subprocess.run([sys.executable, "-v", "-c", PROGRAM, *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_rank_runs_its_atexit_handlers_and_flushes_but_skips_finalization() -> None:
    rank = run_command("2", "--version")
    assert rank.returncode == 0, rank.stderr
    assert rank.stdout.startswith("fastgen ")
    assert "thread joined\n" in rank.stdout  # non-daemon threads are waited for, as the interpreter does
    assert rank.stdout.endswith("atexit ran, unflushed")  # the handler ran after them, and its write came out
    assert "# cleanup" not in rank.stderr  # the interpreter was not finalized


def test_a_single_process_command_ends_as_usual() -> None:
    alone = run_command("1", "--version")
    assert alone.returncode == 0, alone.stderr
    assert "thread joined\n" in alone.stdout and alone.stdout.endswith("atexit ran, unflushed")
    assert "# cleanup" in alone.stderr


@pytest.mark.parametrize(("args", "code"), [(("--version",), 0), (("no-such-command",), 2)])
def test_a_rank_keeps_the_commands_exit_code(args: tuple[str, ...], code: int) -> None:
    assert run_command("2", *args).returncode == code
