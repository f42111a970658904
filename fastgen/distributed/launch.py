"""Launch ``fastgen`` workers through the torchrun agent itself (``torch.distributed.run``), in this process.

``fastgen train --nproc-per-node N [--nnodes M --node-rank R --rdzv-endpoint HOST:PORT --rdzv-id ID
--max-restarts K] ...`` hands the same command, without those flags, to torchrun's elastic agent: every worker
runs ``python -m fastgen train ...`` with ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` set, and the flags mean what
they mean to ``torchrun`` (one node: ``--standalone`` rendezvous on a free local port; several: the static
rendezvous at ``--rdzv-endpoint`` with this node's ``--node-rank``).

Failures come back as one line. Each worker writes its error, already reduced to one line, into the file torch's
agent gives it (``TORCHELASTIC_ERROR_FILE``, the format torch's ``ProcessFailure`` reads), marking errors that only
follow another rank's failure as secondary. The agent gathers them in a ``ChildFailedError``, and
``describe_failure`` names the rank whose failure came first: the one that raised, or was killed.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from fastgen.utils.errors import FastGenRuntimeError, TrainingInterrupted, UsageError

LAUNCHED_ENV = "FASTGEN_LAUNCHER"  # set for workers started by `fastgen ... --nproc-per-node`
SECONDARY = "secondary: "  # prefix of a worker's error that only follows another rank's failure


def torchrun_args(nproc_per_node: int, nnodes: str = "1", node_rank: int = 0, rdzv_endpoint: str | None = None,
                  rdzv_id: str | None = None, max_restarts: int = 0) -> list[str]:
    """torchrun's command-line flags for these launch options (validated)."""
    if nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be at least 1, got {nproc_per_node}")
    if max_restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more, got {max_restarts}")
    parts = str(nnodes).split(":")
    if not all(p.isdigit() and int(p) >= 1 for p in parts) or len(parts) > 2:
        raise UsageError(f"--nnodes must be N or MIN:MAX (positive integers), got {nnodes!r}")
    multi_node = int(parts[-1]) > 1
    args = [f"--nproc-per-node={nproc_per_node}", f"--nnodes={nnodes}", f"--max-restarts={max_restarts}"]
    if rdzv_endpoint is None:
        if multi_node:
            raise UsageError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the address of node 0), and "
                             "--node-rank on each node")
        return [*args, "--standalone"]
    host, _, port = rdzv_endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--rdzv-endpoint must be HOST:PORT, got {rdzv_endpoint!r}")
    if node_rank < 0 or node_rank >= int(parts[-1]):
        raise UsageError(f"--node-rank must be in 0..{int(parts[-1]) - 1}, got {node_rank}")
    args += [f"--rdzv-endpoint={rdzv_endpoint}", f"--node-rank={node_rank}"]
    if rdzv_id is not None:
        args.append(f"--rdzv-id={rdzv_id}")
    return args


def launch(worker_args: list[str], launcher_args: list[str], nproc_per_node: int) -> None:
    """Run ``python -m fastgen <worker_args>`` on this node's ``nproc_per_node`` workers; return when all are
    done. A failure raises ``FastGenRuntimeError`` (or ``TrainingInterrupted``) with one line."""
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    # torch's agent warns at length (e.g. that it sets OMP_NUM_THREADS; that it forwards a signal); fastgen sets
    # the threads itself and reports failures in one line. Its modules set their own levels: quiet each of them.
    for name in [n for n in logging.root.manager.loggerDict if n.startswith(("torch.distributed.elastic",
                                                                            "torch.distributed.run"))]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    os.environ[LAUNCHED_ENV] = "1"
    from torch.distributed.elastic.multiprocessing.api import SignalException

    args = get_args_parser().parse_args([*launcher_args, "-m", "fastgen", *worker_args])
    try:
        run(args)
    except SignalException as exc:  # Ctrl-C / SIGTERM reached the agent, which passed it on to the workers
        name = _signal_name(int(exc.sigval))
        raise TrainingInterrupted(f"stopped by {name}: workers that were training finished their step and saved a "
                                  "checkpoint (a run still starting saved nothing and left no run directory); run the "
                                  "same command again to resume", int(exc.sigval)) from None
    except ChildFailedError as exc:
        message, code = describe_failure(exc.failures)
        if code > 128:
            raise TrainingInterrupted(message, code - 128) from None
        if code == 2:
            raise UsageError(message) from None
        raise FastGenRuntimeError(message) from None


def describe_failure(failures: dict[int, Any]) -> tuple[str, int]:
    """One line for the rank whose failure caused the others (first by time among the primary ones), and the exit
    code to end with."""
    if not failures:
        return "a worker failed", 1
    primary = {rank: f for rank, f in failures.items() if not str(f.message).startswith(SECONDARY)} or failures
    rank, failure = min(primary.items(), key=lambda item: (_likely_effect(item[1]), item[1].timestamp, item[0]))
    message = str(failure.message)
    if message.startswith(SECONDARY):
        message = message[len(SECONDARY):]
    recorded = failure.error_file != "<N/A>"  # the worker wrote its error before it was stopped
    if failure.exitcode < 0 and not recorded:
        name = _signal_name(-failure.exitcode)
        return f"rank {rank} was killed by {name} (pid {failure.pid}); the other ranks stopped", 1
    if not message or message.startswith("To enable traceback"):
        message = f"rank {rank} exited with code {failure.exitcode}"
    elif not message.startswith("rank "):
        message = f"rank {rank}: {message}"
    # 2: bad input a worker found; 128 + signal: a clean stop (SIGTERM, Ctrl-C); anything else is a failure
    code = failure.error_file_data.get("fastgen_exit_code", failure.exitcode) if recorded else failure.exitcode
    return message, code if code == 2 or code > 128 else 1


def _likely_effect(failure: Any) -> int:
    """How likely a failure is a consequence rather than the cause (timestamps have a resolution of one second):
    a recorded error 0, a death by a signal other than SIGTERM (a kill, a crash) 1, another exit 2, SIGTERM 3 -
    the agent stops the remaining workers with SIGTERM once one has failed."""
    if failure.error_file != "<N/A>":
        return 0
    if failure.exitcode < 0:
        return 3 if -failure.exitcode == signal.SIGTERM else 1
    return 2


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def launched() -> bool:
    """True in a worker that ``launch`` started (its errors go to the agent, which reports them)."""
    return os.environ.get(LAUNCHED_ENV) == "1"


def record_worker_error(message: str, secondary: bool = False, exit_code: int = 1) -> bool:
    """Write this worker's one-line error where torch's agent reads it, with the exit code the run should end with
    (the agent may stop the worker with a signal before it exits); False when no agent asked for one."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    try:
        with open(path, "w") as handle:
            json.dump({"message": (SECONDARY if secondary else "") + message, "timestamp": int(time.time()),
                       "fastgen_exit_code": int(exit_code)}, handle)
    except OSError:
        return False
    return True
