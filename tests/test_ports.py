"""The test suite's port helper: blocks that cannot collide across xdist workers or with the kernel's own picks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import ports


def _ports_of_worker(worker: str, count: int) -> list[int]:
    code = "import ports; print(*ports.free_ports(%d))" % count
    env = {**os.environ, "PYTEST_XDIST_WORKER": worker}
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return [int(p) for p in out.split()]


def test_two_workers_draw_from_disjoint_blocks_below_the_ephemeral_range():
    gw0, gw1 = _ports_of_worker("gw0", 20), _ports_of_worker("gw1", 20)
    assert not set(gw0) & set(gw1)
    assert max(gw0) < min(gw1)
    assert max(gw0 + gw1) < ports._ephemeral_low()


def test_consecutive_ports_never_repeat_and_a_listening_port_is_skipped():
    first = ports.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        block = ports._block()
        # Listen on the port the walk reaches next, then ask: it must be stepped over.
        upcoming = first + 1 if first + 1 in block else block.start
        taken.bind(("127.0.0.1", upcoming))
        taken.listen()
        second = ports.free_port()
    assert second not in (first, upcoming)
    assert len(set(ports.free_ports(50))) == 50
