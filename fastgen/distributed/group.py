"""Process-group helpers that work the same with one process (no group) and under torchrun.

Library code asks these instead of ``torch.distributed`` directly, so nothing assumes a single process and
nothing crashes when no group exists.

``init_distributed(trainer_config)`` owns the start of a multi-rank run (torchrun sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` / ``MASTER_PORT``):

* it refuses ``WORLD_SIZE > 1`` when the config sets neither ``trainer.ddp`` nor ``trainer.fsdp`` - the ranks
  would train independent replicas and all but rank 0's work would be thrown away;
* the backend follows the device: NCCL for CUDA (after ``torch.cuda.set_device(LOCAL_RANK)``, before any CUDA
  work, so no rank creates a context on GPU 0), gloo on CPU;
* the collective timeout is ``trainer.dist_timeout_s``;
* the device mesh is 1-D (all ranks), or 2-D ``(replicate, shard)`` for hybrid sharding
  (``trainer.fsdp_shard_size``);
* ``teardown()`` destroys the group at exit.

A rank that fails tells the others through the rendezvous store (``FailureWatch``): every rank runs a small
thread that polls the store, so the other ranks stop within a second with one line naming the failing rank and
its error, instead of hanging in a collective until the timeout. Every failure is announced (the first one wins
the store's key), including ``DistError``s: a collective that fails on one rank for its own reason is as much a
cause as any other error. The store is reached through a private torch function; where it is missing the watch
cannot run, and ``init_distributed`` says so once on rank 0 (peers of a failed rank then wait up to
``trainer.dist_timeout_s``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from fastgen.utils.errors import StartUpInterrupted
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

FAILURE_KEY = "fastgen/failure"


_LOCAL_ONLY = threading.local()


def is_initialized() -> bool:
    """True when a process group exists and this thread is not inside ``local_only()``."""
    return dist.is_available() and dist.is_initialized() and not getattr(_LOCAL_ONLY, "active", False)


@contextlib.contextmanager
def local_only() -> Iterator[None]:
    """Run code on one rank as if it were a single process: these helpers skip their collectives (``barrier``,
    ``broadcast_object``, ``all_reduce_mean``, ``any_rank``) and report this rank's ``RANK``. For work only rank 0
    does while the others wait, such as building the real model under ``model.meta_init``."""
    previous = getattr(_LOCAL_ONLY, "active", False)
    _LOCAL_ONLY.active = True
    try:
        yield
    finally:
        _LOCAL_ONLY.active = previous


def get_rank() -> int:
    return dist.get_rank() if is_initialized() else int(os.environ.get("RANK", "0"))


def get_world_size() -> int:
    return dist.get_world_size() if is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_rank0() -> bool:
    return get_rank() == 0


def barrier() -> None:
    if is_initialized():
        dist.barrier()


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Mean over ranks (in place when distributed; the tensor itself otherwise)."""
    if is_initialized() and get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= get_world_size()
    return tensor


def any_rank(flag: bool, device: torch.device | None = None) -> bool:
    """True on every rank when ``flag`` is true on at least one: a decision that changes control flow (stop,
    skip, reject) must be taken by all ranks together, or they leave their collectives out of step."""
    if not (is_initialized() and get_world_size() > 1):
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device or collective_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def broadcast_object(obj: object, src: int = 0) -> object:
    if not is_initialized():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def collective_device() -> torch.device:
    """Where a collective's tensors must live: CPU for gloo, the current CUDA device for NCCL."""
    if is_initialized() and "nccl" in str(dist.get_backend()) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def select_device(preference: str = "auto", label: str | None = None) -> torch.device:
    """``auto``: this rank's CUDA device when CUDA is available, else CPU; otherwise the named device, which must
    exist here (a one-line ``ConfigError`` naming ``label``, default ``trainer.device=<preference>``)."""
    if preference == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", get_local_rank() % max(torch.cuda.device_count(), 1))
        return torch.device("cpu")
    from fastgen.utils.errors import ConfigError

    label = label or f"trainer.device={preference}"
    try:
        device = torch.device(preference)
    except RuntimeError:
        raise ConfigError(f"{label}: not a device name (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{label}: torch sees no CUDA device on this machine (a CPU-only torch build, or no GPU "
                          "visible); use auto or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"{label}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def launched_world_size() -> int:
    """``WORLD_SIZE`` as the launcher set it (1 when no launcher did)."""
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1") or 1), 1)
    except ValueError:
        return 1


# ---- the start and end of a multi-rank run ------------------------------------------------------------------------
def init_distributed(trainer_config: Any) -> Any:
    """Join the launcher's process group (when ``WORLD_SIZE > 1``) and return the device mesh, else ``None``.

    Raises ``ConfigError`` for a multi-rank launch of a config that distributes nothing, and for an FSDP shard
    size that does not divide the world size.
    """
    from fastgen.utils.errors import ConfigError

    world = launched_world_size()
    distributes = bool(trainer_config.ddp or trainer_config.fsdp)
    launched = "MASTER_ADDR" in os.environ and "RANK" in os.environ  # a launcher set up a rendezvous
    if not is_initialized() and (world == 1 and not (distributes and launched)):
        return None  # one process: nothing to join (a 1-rank torchrun job with ddp/fsdp still forms a group)
    if not distributes:
        raise ConfigError(
            f"this run was launched on {world} ranks, but torchrun distributes training only when the config sets "
            "trainer.ddp or trainer.fsdp: add - trainer.ddp=True (replicate the model) or - trainer.fsdp=True "
            "(shard it); without either every rank would train its own copy")
    shard_size = getattr(trainer_config, "fsdp_shard_size", None)
    if shard_size is not None and (shard_size < 1 or world % shard_size):
        raise ConfigError(f"trainer.fsdp_shard_size={shard_size} must divide the world size {world}")
    device = select_device(trainer_config.device)
    if not is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=float(trainer_config.dist_timeout_s))
        kwargs: dict[str, Any] = {"backend": backend, "timeout": timeout}
        if device.type == "cuda":
            kwargs["device_id"] = device
        dist.init_process_group(**kwargs)
        logger.debug("rank %d of %d joined the process group (%s, timeout %ss)", get_rank(), get_world_size(),
                     backend, trainer_config.dist_timeout_s)
    warn_if_failure_watch_unavailable(float(trainer_config.dist_timeout_s))
    return build_mesh(device.type, get_world_size(), shard_size if trainer_config.fsdp else None)


def build_mesh(device_type: str, world: int, shard_size: int | None = None) -> Any:
    """A 1-D mesh over every rank, or the 2-D ``("replicate", "shard")`` mesh of hybrid sharding."""
    from torch.distributed.device_mesh import init_device_mesh

    if shard_size is None or shard_size == world:
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (world // shard_size, shard_size), mesh_dim_names=("replicate", "shard"))


def teardown() -> None:
    """Leave the process group (every rank, at the end of a run or after a failure)."""
    if is_initialized():
        dist.destroy_process_group()


# ---- failures: one rank's error stops every rank promptly ---------------------------------------------------------
# Errors that say a peer went away: the failure of that peer (or its death) is the one to report, not this one. The
# first two (gloo's words) in any error; the others (a socket to a dead peer, NCCL's words) in a DistError only.
_PEER_LOSS_MARKERS = ("Connection closed by peer", "Connection reset by peer")
_DIST_PEER_LOSS_MARKERS = (*_PEER_LOSS_MARKERS, "Broken pipe", "remote process exited")
_VERDICT_ATTR = "_fastgen_follows_peer"  # is_peer_failure's verdict, kept on the exception (see there)
_WATCH_WARNED = False


def _default_store() -> tuple[Any, str | None]:
    """``(store, None)``, or ``(None, why there is none)``. The store of the default group is only reachable
    through a private torch function, which a torch release may rename or remove."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store
    except ImportError:
        return None, f"torch {torch.__version__} has no torch.distributed.distributed_c10d._get_default_store"
    try:
        return _get_default_store(), None
    except Exception as exc:  # noqa: BLE001 - any failure means the same: no store to announce failures through
        return None, f"torch.distributed.distributed_c10d._get_default_store() failed ({type(exc).__name__}: {exc})"


def _store() -> Any:
    """The default group's rendezvous store, or ``None`` (single process, or no store: see
    ``warn_if_failure_watch_unavailable``)."""
    if not is_initialized():
        return None
    return _default_store()[0]


def warn_if_failure_watch_unavailable(timeout_s: float) -> None:
    """Once per process, on rank 0 of a multi-rank group: warn when the store the failure watch polls cannot be
    reached. Why: without it ``FailureWatch`` does not run and ``report_failure`` cannot tell anyone, silently - the
    ranks still running after one failed then sit in their next collective until ``trainer.dist_timeout_s``."""
    global _WATCH_WARNED
    if _WATCH_WARNED or not is_initialized() or get_world_size() < 2:
        return
    store, reason = _default_store()
    if store is not None:
        return
    _WATCH_WARNED = True
    if get_rank() == 0:
        logger.warning("the failure watch cannot run: %s. A rank that fails cannot tell the others, which wait up to "
                       "trainer.dist_timeout_s=%gs in their next collective before they stop", reason, timeout_s)


def is_peer_failure(exc: BaseException) -> bool:
    """A failure that follows another rank's (that rank's failure is the one to report): a collective that failed
    because a peer went away (``_PEER_LOSS_MARKERS``), a stop during start-up (``StartUpInterrupted``: torch's
    agent stops the ranks still starting with SIGTERM once one has failed), or a ``DistError`` raised after
    another rank already reported its failure in the store.

    A ``DistError`` with no earlier failure in the store is this rank's own (a collective that failed here for a
    reason of its own): it is reported as the cause, so the other ranks are told and the launcher names it. Without
    a store to ask (no group any more, none reachable, or one that stopped answering with the rank that hosted it)
    a ``DistError`` is taken to follow another rank's failure, the likelier case. The verdict is kept on the
    exception: it is asked again after the group is gone (the command's last line, ``fastgen.cli.main``) and must
    not change then."""
    verdict = getattr(exc, _VERDICT_ATTR, None)
    if isinstance(verdict, bool):
        return verdict
    text = str(exc)
    if isinstance(exc, StartUpInterrupted) or any(marker in text for marker in _PEER_LOSS_MARKERS):
        verdict = True
    elif isinstance(exc, dist.DistError):
        verdict = True
        store = _store()
        if store is not None and not any(marker in text for marker in _DIST_PEER_LOSS_MARKERS):
            try:
                first = store.get(FAILURE_KEY).decode() if store.check([FAILURE_KEY]) else ""
            except Exception:  # noqa: BLE001 - the store is gone, most likely with the rank that hosted it
                first = None
            if first is not None:
                verdict = bool(first) and not first.startswith(f"rank {get_rank()}:")
    else:
        verdict = False
    with contextlib.suppress(AttributeError, TypeError):  # an exception type without instance attributes
        setattr(exc, _VERDICT_ATTR, verdict)
    return verdict


def report_failure(message: str, secondary: bool = False, exit_code: int = 1) -> None:
    """Tell the other ranks that this one failed, and a launcher's agent what the error was (before this rank's
    clean-up, during which the agent may already stop it); never raises.

    Every failure goes to the store, ``secondary`` ones too (the failure only follows another rank's,
    ``is_peer_failure``): the first failure wins the key, so a later one changes nothing, and when the first one
    came from a rank that could not announce it (killed) this one still stops the ranks that are waiting.
    ``secondary`` marks the agent's record, so the launcher names the cause, not a consequence."""
    from fastgen.distributed.launch import record_worker_error

    text = f"rank {get_rank()}: {message}"
    record_worker_error(text, secondary=secondary, exit_code=exit_code)
    store = _store()
    if store is None:
        return
    try:
        store.compare_set(FAILURE_KEY, "", text)
    except Exception:  # noqa: BLE001 - the store may be gone with the rank that hosted it
        pass


def reported_failure() -> str | None:
    """The first failure a rank reported, if any (non-blocking)."""
    store = _store()
    if store is None:
        return None
    try:
        if store.check([FAILURE_KEY]):
            text = store.get(FAILURE_KEY).decode()
            return text or None
    except Exception:  # noqa: BLE001
        return None
    return None


class FailureWatch:
    """A daemon thread that polls the store for another rank's failure and then ends this process with
    ``on_failure(message)`` (which must not return) - unless this rank's own work ends within ``grace_s`` (it hit
    the same error, or it was not waiting on the failed rank), which ``stop()`` signals. Start it once the group
    exists; ``stop()`` at the end."""

    def __init__(self, on_failure: Callable[[str], None], interval_s: float = 0.5, grace_s: float = 3.0) -> None:
        self.on_failure = on_failure
        self.interval_s = interval_s
        self.grace_s = grace_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> FailureWatch:
        if _store() is not None and get_world_size() > 1:
            self._thread = threading.Thread(target=self._run, name="fastgen-failure-watch", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        own = f"rank {get_rank()}:"
        while not self._stop.wait(self.interval_s):
            message = reported_failure()
            if message and not message.startswith(own):
                if not self._stop.wait(self.grace_s):
                    self.on_failure(message)
                return

    def stop(self) -> None:
        """End the watch and wait for its thread: a thread still inside a store call while the process group is
        destroyed and the interpreter exits can abort the process ("terminate called without an active
        exception") after a run that succeeded."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10.0)


def exit_on_peer_failure(message: str) -> None:
    """``FailureWatch``'s default action: say which rank failed (one line) and end this process at once - its
    main thread is likely blocked in a collective that will never complete. A worker of ``fastgen ...
    --nproc-per-node`` tells its launcher instead, which reports the first failure once."""
    import sys

    from fastgen.distributed.launch import launched, record_worker_error

    line = f"rank {get_rank()} stopped because {message}"
    if not (launched() and record_worker_error(line, secondary=True)):
        sys.stderr.write(f"error: {line}\n")
        sys.stderr.flush()
    time.sleep(0.05)
    os._exit(1)
