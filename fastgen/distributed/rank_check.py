"""Do the ranks of a job agree, before it trains? The three tiers of ``fastgen check-ranks``.

A multi-rank job trusts that every rank runs the same software on the same config, that every rank gets going,
and that every rank holds the same model. None of that fails loudly when it is false: a node with another torch
build, one that hangs reading a checkpoint from a sick mount, or one that reads different bytes from its copy of
the checkpoint shows up as a hang at the first collective or, worse, as a model that trains on and is quietly
wrong. ``run_rank_checks`` checks, on every rank of the launched job:

1. **environment** - python, torch, CUDA, NCCL and fastgen versions and the config's fingerprint (sha256 of the
   resolved config YAML, secrets redacted) are gathered from every rank (``all_gather_object``) and compared; a
   differing config is narrowed down to the keys that differ. Host name, device and the distributed debug level
   are reported, not compared.
2. **liveness** - each rank builds the model (and reads the checkpoint, if given), then enters
   ``torch.distributed.monitored_barrier`` on a gloo group (a gloo side group when the job's backend is NCCL).
   Rank 0 waits ``timeout_s`` and names every rank that did not arrive; it then tells the other ranks through the
   rendezvous store, so that they - the stuck one included, through ``FailureWatch`` - stop instead of hanging.
3. **fingerprints** (``fastgen.distributed.fingerprint``) - the model is built exactly as the trainer builds it (the
   shared seed; on a fresh start the initial weights; ``parallelize`` by ``trainer.ddp`` / ``trainer.fsdp`` on
   the mesh of ``init_distributed``; a checkpoint loaded as a resume loads it, from *this rank's own read* of the
   file - never a broadcast, since the point is to catch a node that reads other bytes). Compared are:

   * every tensor of every network as built, before ``parallelize`` (across ranks): the shared-seed
     initialisation and the initial-weight files each rank read;
   * replicated parameters and buffers after loading (across ranks);
   * sharded DTensors (FSDP2): each rank's local shard against the same slice of the full tensor this rank read
     from the checkpoint (or, without one, of this rank's tensor before sharding); and, under hybrid sharding,
     the same shard across its replicas;
   * every tensor of the checkpoint as each rank read it (across ranks).

Every disagreement is a ``Finding`` naming the rank(s) and the key or tensor. A failure that every rank hits
alike (a missing checkpoint, one that does not fit the model) is not a disagreement: it comes back as
``RankCheckReport.error``.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import re
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from fastgen.distributed import group as dist_utils
from fastgen.distributed.fingerprint import (
    Disagreement,
    disagreements,
    fingerprint_tensors,
    gather_fingerprints,
    is_sharded,
    tensor_fingerprint,
)
from fastgen.utils.errors import FastGenError, FastGenRuntimeError, UsageError, one_line
from fastgen.utils.logging import get_logger

logger = get_logger(__name__)

TIERS = ("environment", "liveness", "fingerprints")
COMPARED_KEYS = {"python": "python version", "torch": "torch version", "cuda": "CUDA version",
                 "nccl": "NCCL version", "fastgen": "fastgen version", "config": "config"}
REPORTED_KEYS = ("hostname", "device", "debug")
DEFAULT_TIMEOUT_S = 60.0
# A rank other than 0 waits this much longer than rank 0 at the barrier: rank 0 names the missing ranks first.
_FOLLOWER_WAIT = (2.0, 10.0)  # (factor, seconds added)
_GRACE_S = 1.5  # after rank 0 reports a stuck rank: time for the other ranks' FailureWatch to see it (3 polls)
_REPORT_WAIT_S = 5.0  # a rank whose barrier failed looks this long for rank 0's report before naming rank 0


@dataclass(frozen=True)
class Finding:
    """One disagreement: the tier, the rank(s) at odds with the rest, what differs and how."""

    tier: str
    ranks: tuple[int, ...]
    subject: str
    detail: str

    def line(self) -> str:
        who = f"rank {self.ranks[0]}" if len(self.ranks) == 1 else f"ranks {', '.join(map(str, self.ranks))}"
        return f"{who}: {self.subject}: {self.detail}"


@dataclass
class RankCheckReport:
    """What every rank learned (identical on all ranks, except after a stuck rank: then rank 0 knows most)."""

    world_size: int
    ranks: list[dict[str, str]] = field(default_factory=list)  # tier-1 facts of each rank, by rank
    tiers: dict[str, str] = field(default_factory=dict)  # tier -> one-line result
    findings: list[Finding] = field(default_factory=list)
    timeout_s: float = DEFAULT_TIMEOUT_S
    stuck: tuple[int, ...] = ()  # ranks that did not arrive at the barrier: no collective can follow
    error: FastGenError | None = None  # the same failure on every rank (bad input rather than a disagreement)

    @property
    def consistent(self) -> bool:
        return not self.findings and not self.stuck and self.error is None


# ---- tier 1: environment ---------------------------------------------------------------------------------------------
def _nccl_version() -> str:
    try:
        if not torch.cuda.is_available():
            return "none"
        version = torch.cuda.nccl.version()
        return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception:  # noqa: BLE001 - torch built without NCCL
        return "none"


def _device_name(trainer_config: Any) -> str:
    device = dist_utils.select_device(trainer_config.device)
    if device.type == "cuda":
        return f"{device} {torch.cuda.get_device_name(device)}"
    return f"{device} {platform.machine()}"


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def config_fingerprint(config: Any) -> tuple[str, dict[str, str]]:
    """sha256 of the resolved config YAML (secrets redacted), and a short digest per dotted key (to name the keys
    that differ when the fingerprints do)."""
    from omegaconf import OmegaConf

    from fastgen.configs.config_utils import config_to_dict

    # import_paths are where this node found the config file (its folder, its working directory): they may differ
    # between nodes that run the same config, so they are not part of what the ranks must agree on
    plain = {k: v for k, v in config_to_dict(config).items() if k not in NODE_LOCAL_KEYS}
    keys = {k: hashlib.sha256(repr(v).encode()).hexdigest()[:16] for k, v in _flatten(plain).items()}
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.create(plain)).encode()).hexdigest(), keys


NODE_LOCAL_KEYS = ("import_paths",)


def environment_info(config: Any) -> dict[str, Any]:
    """This rank's tier-1 facts: the ``COMPARED_KEYS`` and ``REPORTED_KEYS``, and ``config_keys``."""
    from fastgen import __version__

    sha, keys = config_fingerprint(config)
    return {
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda or "none",
        "nccl": _nccl_version(), "fastgen": __version__, "config": sha, "config_keys": keys,
        "hostname": socket.gethostname(), "device": _device_name(config.trainer),
        "debug": os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF") or "OFF",
    }


def environment_findings(infos: list[dict[str, Any]]) -> list[Finding]:
    found = []
    for key, label in COMPARED_KEYS.items():
        for d in disagreements([{key: info[key]} for info in infos]):
            reference = d.reference_ranks[0]
            if key == "config":
                differing = disagreements([info["config_keys"] for info in infos])
                odd = set(d.odd_ranks)
                keys = [x.name for x in differing if odd & set(x.odd_ranks) or reference in x.odd_ranks]
                shown = ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
                detail = (f"differs from rank {reference}'s (sha256 {infos[d.odd_ranks[0]][key][:12]} vs "
                          f"{infos[reference][key][:12]})" + (f" at {shown}" if shown else ""))
            else:
                detail = "; ".join(f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))} "
                                   f"{'has' if len(ranks) == 1 else 'have'} {value}" for value, ranks in d.groups)
            found.append(Finding("environment", d.odd_ranks, label, detail))
    return found


# ---- tier 2: liveness -------------------------------------------------------------------------------------------------
_MISSING_RANKS = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


def liveness_barrier(group: Any, timeout_s: float) -> tuple[int, ...]:
    """``torch.distributed.monitored_barrier`` on the gloo ``group``: the ranks that did not arrive within
    ``timeout_s`` (seen from rank 0), or ``(0,)`` on another rank when rank 0 itself never answered.

    Rank 0 reports the missing ranks through the store before returning, and waits a moment, so every other rank
    (the stuck one included) stops through its ``FailureWatch``. Another rank waits longer than rank 0
    (``_FOLLOWER_WAIT``: rank 0 should be the one to name the missing ranks); see ``_follow``.
    """
    if dist_utils.get_world_size() == 1:
        return ()
    if dist_utils.get_rank() != 0:
        return _follow(group, timeout_s)
    try:
        dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
        return ()
    except RuntimeError as exc:  # torch raises RuntimeError (DistError is one) naming the missing ranks
        match = _MISSING_RANKS.search(str(exc))
        if not match:
            raise
        missing = tuple(int(r) for r in match.group(1).replace(",", " ").split())
        dist_utils.report_failure(stuck_message(missing, timeout_s))
        time.sleep(_GRACE_S)
        return missing


def _follow(group: Any, timeout_s: float) -> tuple[int, ...]:
    """A rank other than 0 at the barrier. Its side of gloo's monitored barrier does not give up while rank 0 is
    away (its send to rank 0 waits on), so a timer ends this process when rank 0 has not come by the follower's
    deadline. When the barrier fails early - rank 0 gave up on another rank - rank 0's report is in the store
    (or about to be): this rank ends with it, or, without one after a few seconds, names rank 0."""
    factor, extra = _FOLLOWER_WAIT
    wait = factor * timeout_s + extra
    gave_up = threading.Event()
    timer = threading.Timer(wait, _end_without_rank0, args=(timeout_s, gave_up))
    timer.daemon = True
    timer.start()
    try:
        dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=wait), wait_all_ranks=True)
        return ()
    except RuntimeError:
        if gave_up.is_set():  # the timer is ending this process (rank 0 went away because it told rank 0)
            time.sleep(4 * _GRACE_S)
    finally:
        timer.cancel()
    deadline = time.monotonic() + _REPORT_WAIT_S
    own = f"rank {dist_utils.get_rank()}:"
    while time.monotonic() < deadline:
        message = dist_utils.reported_failure()
        if message and not message.startswith(own):
            dist_utils.exit_on_peer_failure(message)  # rank 0 named the stuck rank(s): end with its line
        time.sleep(0.2)
    _report_rank0_missing(timeout_s)
    return (0,)


def _report_rank0_missing(timeout_s: float) -> None:
    """Tell the agent (one line) and rank 0 (through the store: its FailureWatch ends it, if it can run)."""
    dist_utils.report_failure(stuck_message((0,), timeout_s))
    time.sleep(_GRACE_S)


def _end_without_rank0(timeout_s: float, gave_up: threading.Event) -> None:
    """The follower's timer: rank 0 never came to the barrier. The main thread is blocked in it, so end here."""
    import sys

    from fastgen.distributed.launch import launched

    gave_up.set()
    _report_rank0_missing(timeout_s)
    if not launched():
        sys.stderr.write(f"error: rank {dist_utils.get_rank()}: {stuck_message((0,), timeout_s)}\n")
    sys.stderr.flush()
    os._exit(1)


def stuck_message(ranks: tuple[int, ...], timeout_s: float) -> str:
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    return (f"{who} did not arrive at the barrier within {timeout_s:g} s (stuck or slow while building the model "
            "or reading the checkpoint)")


# ---- tier 3: fingerprints ----------------------------------------------------------------------------------------------
def named_model_tensors(model: Any) -> list[tuple[str, str, torch.Tensor]]:
    """``(network.name, "parameter" | "buffer", tensor)`` for every network of the method, in a fixed order."""
    from fastgen.distributed.parallelize import named_networks

    out = []
    for network, module in named_networks(model).items():
        out += [(f"{network}.{name}", "parameter", p) for name, p in module.named_parameters()]
        out += [(f"{network}.{name}", "buffer", b) for name, b in module.named_buffers() if b is not None]
    return [(name, kind, t) for name, kind, t in out if not t.is_meta]


def checkpoint_tensors(payload: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint by its path (``model.net.<key>``, ``optimizers.net.state.<key>.exp_avg``...)."""
    if isinstance(payload, torch.Tensor):
        return {prefix: payload}
    items: Any = payload.items() if isinstance(payload, dict) else (
        enumerate(payload) if isinstance(payload, (list, tuple)) else ())
    out: dict[str, torch.Tensor] = {}
    for key, value in items:
        out.update(checkpoint_tensors(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def check_checkpoint_path(path: str) -> str:
    """The checkpoint ``path`` names - itself, or the newest valid one of a checkpoints folder or run directory,
    local or ``s3://`` (``fastgen.checkpoint.source``); ``UsageError`` when it names nothing."""
    from fastgen.checkpoint.source import resolve_checkpoint

    if not path.startswith("s3:") and not Path(path).exists():
        raise UsageError(f"--checkpoint {path}: no such file")
    if not path.startswith("s3:") and not Path(path).is_dir():
        return path  # a file, or a FIFO / device (read_checkpoint copies those)
    try:
        return resolve_checkpoint(path).checkpoint
    except UsageError as exc:
        raise UsageError(f"--checkpoint {path}: {exc}") from None


def read_checkpoint(path: str) -> dict[str, Any]:
    """This rank's own read of ``path`` (safe loading, clear errors; a folder, run directory or ``s3://`` source
    as ``check_checkpoint_path`` resolves it). A FIFO or a device is copied to a temporary file first, as
    ``torch.load`` needs to seek."""
    from fastgen.checkpoint.checkpointer import load_checkpoint
    from fastgen.checkpoint.stores import read_whole_checkpoint

    resolved = check_checkpoint_path(path)
    if resolved.startswith("s3://"):
        return read_whole_checkpoint(resolved, None)
    source = Path(resolved)
    if source.is_file():
        return load_checkpoint(source)
    if source.is_dir():  # a .dcp folder: through the marker beside it
        from fastgen.checkpoint.source import ResolvedCheckpoint, read_resolved

        return read_resolved(ResolvedCheckpoint(resolved, None))
    with open(source, "rb") as handle, tempfile.NamedTemporaryFile(suffix=".pth") as copy:
        shutil.copyfileobj(handle, copy)
        copy.flush()
        return load_checkpoint(copy.name)


def _local_region(tensor: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(shape, offset)`` of DTensor ``tensor``'s local shard within the full tensor (as torch's state-dict
    loading computes it)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return tuple(shape), tuple(offset)


def _label(region: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
    """``[16:32, 0:32]``: the rows, columns ... of a shard."""
    return "[" + ", ".join(f"{o}:{o + n}" for n, o in zip(*region)) + "]"


def _no_fingerprints() -> tuple[list[str], torch.Tensor]:
    return [], torch.empty(0, dtype=torch.int64)


@dataclass
class _Tier3:
    """One rank's tier-3 material before the comparison: ``(names, fingerprints)`` per kind of comparison."""

    initial: tuple[list[str], torch.Tensor] = field(default_factory=_no_fingerprints)
    replicated: tuple[list[str], torch.Tensor] = field(default_factory=_no_fingerprints)
    shards: tuple[list[str], torch.Tensor] = field(default_factory=_no_fingerprints)
    checkpoint: tuple[list[str], torch.Tensor] = field(default_factory=_no_fingerprints)
    kinds: dict[str, str] = field(default_factory=dict)  # model tensor -> "parameter" / "sharded parameter" ...
    local: list[tuple[str, str]] = field(default_factory=list)  # (subject, detail): shard vs this rank's full tensor
    error: tuple[int, str] | None = None  # (exit code, one-line message) of a failure on this rank


def _fingerprinted(named: list[tuple[str, torch.Tensor]]) -> tuple[list[str], torch.Tensor]:
    return [name for name, _ in named], fingerprint_tensors(t for _, t in named)


def _coded_line(exc: FastGenError) -> tuple[int, str]:
    return exc.exit_code, one_line(exc)


class _Rank:
    """This rank's side of tier 3, in the order the trainer works: build the networks whole (``build``), read
    the checkpoint (``read``), then - after the liveness barrier, as these involve collectives -
    ``parallelize`` and load the checkpoint as a resume does (``load``), and fingerprint the result."""

    def __init__(self, config: Any, mesh: Any, checkpoint: str | None, trainer_class: type) -> None:
        self.trainer_class = trainer_class
        self.config, self.mesh, self.checkpoint = config, mesh, checkpoint
        self.material = _Tier3()
        self.full: dict[str, torch.Tensor] = {}  # network.name -> full tensor this rank holds (shard reference)
        self.from_checkpoint: set[str] = set()
        self.payload: dict[str, Any] | None = None
        self.model: Any = None

    def build(self) -> None:
        """Instantiate the method as ``Trainer._build_model`` does: the shared seed, the device, and on a fresh
        start ``init_weights`` and the pretrained checkpoint; the full tensors are fingerprinted (and kept
        referenced, so that a shard can be compared with them after ``parallelize``). Under ``model.meta_init``
        only rank 0 builds real weights and every rank receives them by broadcast: nothing to compare as built,
        and the trainer's own build runs after the barrier."""
        from fastgen.configs.instantiate import instantiate
        from fastgen.utils.rng import seed_everything

        seed_everything(self.config.trainer.seed)
        self.trainer = self.trainer_class(self.config)  # for its loading code; no run directory is created
        self.trainer.mesh = self.mesh
        if self.config.model.meta_init:
            return  # rank 0 alone builds and broadcasts (collectives): the trainer's own build, in ``load``
        self.model = instantiate(self.config.model_class, config=self.config.model)
        self.model.to(self.trainer.device)
        if self.checkpoint is None:
            self.model.init_weights()
            self.trainer._load_pretrained(self.model)
        built = [(name, t.detach()) for name, _, t in named_model_tensors(self.model)]
        self.material.initial = _fingerprinted(built)
        self.full = dict(built)

    def read(self) -> None:
        """This rank's own read of the checkpoint, fingerprinted tensor by tensor; a failure is kept as this
        rank's error (the other ranks may read the file fine: that is a finding, not a crash)."""
        if self.checkpoint is None:
            return
        try:
            self.payload = read_checkpoint(self.checkpoint)
        except FastGenError as exc:
            self.material.error = _coded_line(exc)
            return
        tensors = checkpoint_tensors(self.payload)
        self.material.checkpoint = _fingerprinted(list(tensors.items()))
        # the full tensors as read are the shards' reference (loading may replace the payload's entries)
        model_part = {key[len("model."):]: t for key, t in tensors.items() if key.startswith("model.")}
        self.full.update(model_part)
        self.from_checkpoint = set(model_part)

    def load(self) -> None:
        """``parallelize`` (collectives: every rank, also one whose read failed), load the checkpoint, and
        fingerprint the replicated tensors and the local shards."""
        from fastgen.checkpoint.manager import restore_modules
        from fastgen.distributed.parallelize import parallelize

        if self.model is None:  # model.meta_init
            self.model = self.trainer._build_model(fresh=self.checkpoint is None)
        else:
            parallelize(self.model, self.config.trainer, self.mesh)
            self.model.train()
            for ema in getattr(self.model, "ema_nets", {}).values():
                ema.eval()
        if self.payload is not None:
            try:
                restore_modules(self.model, self.payload, self.checkpoint, allow_missing=True)
            except FastGenError as exc:
                self.material.error = _coded_line(exc)
            self.payload = None
        replicated, shards = [], []
        for name, kind, tensor in named_model_tensors(self.model):
            if not is_sharded(tensor):
                self.material.kinds[name] = kind
                replicated.append((name, tensor))
                continue
            self.material.kinds[name] = f"sharded {kind}"
            where = _local_region(tensor)
            shards.append((f"{name} {_label(where)}", tensor))
            if name not in self.full:  # meta_init without a checkpoint: this rank never held the full tensor
                continue
            reference = self.full[name][tuple(slice(o, o + n) for n, o in zip(*where))]
            if int(tensor_fingerprint(tensor)) != int(tensor_fingerprint(reference)):
                source = ("the checkpoint this rank read" if name in self.from_checkpoint
                          else "this rank's tensor before sharding")
                self.material.local.append((f"sharded {kind} {name} {_label(where)}",
                                            f"the local shard differs from the same slice of {source}"))
        self.material.replicated = _fingerprinted(replicated)
        self.material.shards = _fingerprinted(shards)
        self.full = {}


def _findings(tier_items: list[Disagreement], subject: Any, detail: Any) -> list[Finding]:
    return [Finding("fingerprints", d.odd_ranks, subject(d), detail(d)) for d in tier_items]


def _differs(d: Disagreement) -> str:
    if not d.groups:
        return "missing"
    head = f"differs from rank {d.reference_ranks[0]}" if len(d.groups) > 1 else "present on some ranks only"
    return f"{head} ({d.describe()})"


def compare_tier3(mine: _Tier3, group: Any) -> tuple[list[Finding], dict[str, int], tuple[int, str] | None]:
    """Gather every rank's tier-3 material (collectives on ``group``) and compare: the findings, how many tensors
    of each kind were compared, and the error every rank hit alike (if so)."""
    world = dist_utils.get_world_size()
    errors: list[Any] = [mine.error]
    extras: list[Any] = [(mine.kinds, mine.local)]
    if world > 1:
        errors, extras = [None] * world, [None] * world
        dist.all_gather_object(errors, mine.error, group=group)
        dist.all_gather_object(extras, (mine.kinds, mine.local), group=group)
    failed = [r for r, e in enumerate(errors) if e is not None]
    if failed and len(failed) == world and len({e[1] for e in errors}) == 1:
        return [], {}, errors[0]
    findings = [Finding("fingerprints", (r,), "failed", errors[r][1]) for r in failed]
    kinds: dict[str, str] = {}
    for rank_kinds, _ in extras:
        kinds.update(rank_kinds)

    def keep(per_rank: list[dict[str, int]]) -> list[dict[str, int] | None]:
        return [None if r in failed else values for r, values in enumerate(per_rank)]

    initial = keep(gather_fingerprints(*mine.initial, group=group))
    replicated = keep(gather_fingerprints(*mine.replicated, group=group))
    shards = keep(gather_fingerprints(*mine.shards, group=group))
    checkpoint = keep(gather_fingerprints(*mine.checkpoint, group=group))
    compared = {kind: len(set().union(*(values for values in per_rank if values is not None)))
                for kind, per_rank in (("initial", initial), ("replicated", replicated), ("shards", shards),
                                       ("checkpoint", checkpoint))}

    def kind_of(name: str) -> str:
        return kinds.get(name, "tensor")

    def checkpoint_subject(d: Disagreement) -> str:
        network_name = d.name[len("model."):] if d.name.startswith("model.") else None
        also = f" ({kind_of(network_name)} {network_name})" if network_name in kinds else ""
        return f"checkpoint tensor {d.name}{also}"

    findings += _findings(disagreements(initial), lambda d: f"initial {kind_of(d.name)} {d.name}",
                          lambda d: _differs(d) + " as built, before any checkpoint: seed, code or an initial-"
                          "weights file differs")
    findings += _findings(disagreements(replicated), lambda d: f"{kind_of(d.name)} {d.name}", _differs)
    findings += _findings(disagreements(shards, require_all=False), lambda d: f"{kind_of(d.name.split()[0])} "
                          f"{d.name}", lambda d: _differs(d) + " across hybrid-sharding replicas")
    findings += _findings(disagreements(checkpoint), checkpoint_subject, lambda d: "as read, " + _differs(d))
    for rank, (_, local) in enumerate(extras):
        findings += [Finding("fingerprints", (rank,), subject, detail) for subject, detail in local]
    return findings, compared, None


def _fingerprint_summary(compared: dict[str, int], checkpoint: str | None) -> str:
    parts = [f"{compared['initial']} tensors as built"] if compared.get("initial") else []
    parts.append(f"{compared.get('replicated', 0)} replicated")
    if compared.get("shards"):
        parts.append(f"{compared['shards']} shards against the full tensors")
    if checkpoint is not None:
        parts.append(f"{compared.get('checkpoint', 0)} checkpoint tensors as read")
    return ", ".join(parts)


def refuse_detail_with_gloo_ddp(config: Any) -> None:
    """Raise ``UsageError`` for ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` with a DDP config on CPU: torch's
    ``DistributedDataParallel`` then crashes the process (SIGSEGV in ``c10d::Logger::set_env_variables``, seen
    with torch 2.13 on a gloo group), so the check would end in a signal rather than a report."""
    from fastgen.distributed.parallelize import distributed_mode

    if distributed_mode(config.trainer) == "ddp" and dist_utils.select_device(config.trainer.device).type == "cpu":
        raise UsageError("--detail (TORCH_DISTRIBUTED_DEBUG=DETAIL) cannot check a DDP config on CPU: torch's "
                         "DistributedDataParallel crashes (SIGSEGV) under DETAIL on a gloo group; run without "
                         "--detail, or check the config with - trainer.fsdp=True")


# ---- the whole check ----------------------------------------------------------------------------------------------------
def _gloo_group(timeout_s: float) -> Any:
    """The group to run tiers 1-3's own collectives on: the default group under gloo, a gloo side group under
    NCCL (``monitored_barrier`` is gloo-only; objects and CPU fingerprints need no device copies there)."""
    if dist_utils.get_world_size() == 1 or not dist_utils.is_initialized():
        return None
    if "gloo" in str(dist.get_backend()):
        return None
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def run_rank_checks(config: Any, trainer_class: type, checkpoint: str | None = None,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> RankCheckReport:
    """Join the launched job's process group (``init_distributed``) and run the three tiers (module docstring).

    ``trainer_class``: ``fastgen.trainer.Trainer`` - its build and loading code is what tier 3 replays (passed in:
    this engine module sits below the trainer and never imports it).

    Every rank calls it and gets the report (rank 0 renders it). The group is left at the end, unless a rank got
    stuck: then no collective can finish, and the caller should end the process.
    """
    if timeout_s <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout_s:g}")
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL":
        refuse_detail_with_gloo_ddp(config)
    owns_group = not dist_utils.is_initialized()
    mesh = dist_utils.init_distributed(config.trainer)
    watch = dist_utils.FailureWatch(dist_utils.exit_on_peer_failure).start()
    report = RankCheckReport(world_size=dist_utils.get_world_size(), timeout_s=timeout_s)
    try:
        group = _gloo_group(float(config.trainer.dist_timeout_s))
        world = report.world_size
        info = environment_info(config)
        infos: list[Any] = [info]
        if world > 1:
            infos = [None] * world
            dist.all_gather_object(infos, info, group=group)
        report.ranks = [{k: str(v) for k, v in i.items() if k != "config_keys"} for i in infos]
        env = environment_findings(infos)
        report.findings += env
        report.tiers["environment"] = _status(env, "consistent (" + ", ".join(COMPARED_KEYS) + " compared)")

        rank = _Rank(config, mesh, checkpoint, trainer_class)
        rank.build()
        rank.read()
        report.stuck = liveness_barrier(group, timeout_s)
        if report.stuck:
            report.tiers["liveness"] = stuck_message(report.stuck, timeout_s)
            report.tiers["fingerprints"] = "not run: a rank did not arrive"
            return report
        report.tiers["liveness"] = f"all {world} rank(s) arrived within {timeout_s:g} s"
        rank.load()
        found, compared, error = compare_tier3(rank.material, group)
        if error is not None:
            code, message = error
            report.error = UsageError(message) if code == 2 else FastGenRuntimeError(message)
            report.tiers["fingerprints"] = "not run: " + message
            return report
        report.findings += found
        report.tiers["fingerprints"] = _status(found, "consistent: " + _fingerprint_summary(compared, checkpoint))
        return report
    except BaseException as exc:
        if report.world_size > 1 and not isinstance(exc, SystemExit):
            dist_utils.report_failure(one_line(exc), secondary=dist_utils.is_peer_failure(exc),
                                      exit_code=getattr(exc, "exit_code", 1))
        if owns_group:
            dist_utils.teardown()
        raise
    finally:
        watch.stop()
        if owns_group and not report.stuck and dist_utils.is_initialized():
            _leave()


def _status(findings: list[Finding], ok: str) -> str:
    return ok if not findings else f"{len(findings)} mismatch{'es' if len(findings) != 1 else ''}"


def _leave() -> None:
    """A last barrier (no rank tears its connections down while another still uses them), then leave."""
    try:
        if dist_utils.get_world_size() > 1:
            dist.barrier()
    finally:
        dist_utils.teardown()
