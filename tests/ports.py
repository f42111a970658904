"""Free TCP ports on loopback that no other test process can be handed at the same time.

Why not ``bind(("127.0.0.1", 0))``: that asks the kernel for a port from its ephemeral range, and the socket has
to be closed before the test's server (a gloo TCPStore, torchrun's rendezvous, SeaweedFS) binds the number. In
that gap a test on another xdist worker can be handed the same number, and one of the two servers fails with
EADDRINUSE (seen in CI: a rank-0 TCPStore). So each test process draws from its own block of ports *below* the
kernel's ephemeral range (which the kernel never hands out for port 0 or outgoing connections), one block per
xdist worker, walking through it so consecutive tests in one process never reuse a number either. A port is
still checked by binding it, in case something outside the suite listens there.
"""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

_FIRST_PORT = 10_000
_BLOCK = 1_000


def _ephemeral_low(default: int = 32_768) -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def _worker_index() -> int:
    """``gw3`` -> 3 under pytest-xdist; 0 in a plain pytest run."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


def _block() -> range:
    start = _FIRST_PORT + _worker_index() * _BLOCK
    stop = min(start + _BLOCK, _ephemeral_low())
    if stop - start < 100:
        raise RuntimeError(f"no room for worker {_worker_index()}'s ports below the ephemeral range "
                           f"(ports {start}-{stop}); run fewer xdist workers")
    return range(start, stop)


def _walk() -> itertools.cycle:
    block = _block()
    offset = os.getpid() % len(block)  # two plain pytest runs side by side start at different places
    return itertools.cycle([*block[offset:], *block[:offset]])


_ports = _walk()


def _bindable(port: int) -> bool:
    # No SO_REUSEADDR: a port still in TIME_WAIT from an earlier test is skipped, not reused.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports from this process's block that nothing listens on now."""
    found: list[int] = []
    for _ in range(_BLOCK):
        port = next(_ports)
        if port not in found and _bindable(port):
            found.append(port)
            if len(found) == count:
                return found
    raise RuntimeError(f"no {count} free ports in {_block()}")


def free_port() -> int:
    """One port from this process's block that nothing listens on now (for a rendezvous or a test server)."""
    return free_ports(1)[0]
