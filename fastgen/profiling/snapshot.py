"""The saved memory snapshot: one gzip-compressed JSON file per rank, and how to load it safely.

A snapshot holds *raw facts* only - every allocation and free seen during the tracked window, the tensors that
had a known role (parameter, gradient, optimizer state) at the trainer's hooks, and the hook times - so the
report can always be recomputed from it (``fastgen profile-memory report SNAPSHOT``) and a reader can check the
report's numbers against it. Format ``fastgen.memory_snapshot``, version 1 (all times are integer nanoseconds
since ``t0_ns``, a Unix time; all sizes are bytes; ``ptr`` is the address of a block, which is the
``untyped_storage().data_ptr()`` of the tensors living in it)::

    {
      "format": "fastgen.memory_snapshot", "version": 1,
      "backend": "cpu_profiler" | "cuda_allocator", "device": "cpu" | "cuda:0",
      "rank": 0, "world_size": 1, "t0_ns": 1732000000000000000, "created_unix": 1732000000.0,
      "window": {"start_iter": 0, "end_iter": 2},        # iterations [start, end) were tracked
      "crash": null | {"type": "RuntimeError", "message": "...", "iteration": 1, "oom": false},
      "config": {"run": "...", ...},                     # a short summary of the run's config (strings)
      "config_yaml": null | "...",                       # the whole config as YAML, secrets redacted
      "estimate": null | {"parameters": ..., "gradients": ..., "optimizer_state": ..., "total": ...,
                          "world_size": 1, "sharded": false},
      "sites": [{"file": "fastgen/networks/mlp.py", "line": 40, "function": "forward",
                 "op": "aten::linear", "module": "Linear_0", "via": "torch/nn/modules/linear.py:130 forward"}],
      "initial": [[ptr, size, site], ...],   # blocks alive when the window began (allocated before it)
      "events":  [[t, ptr, size, site], ...],  # size > 0: allocation, size < 0: free of that block; by time
      "markers": [[t, phase, iteration, accum], ...],   # trainer hooks: where each phase begins
      "roles":   [[t, role, ptr, nbytes], ...],         # at time t, a tensor with this role lived at ptr
      "raw": null | "memory_report_rank0.pickle",       # CUDA: PyTorch's own snapshot, beside this file
      "notes": ["..."]
    }

``site`` indexes ``sites`` (``-1``: unknown). ``phase`` is one of ``PHASES`` or ``"end"`` / ``"crash"``; a phase
lasts until the next marker. ``role`` is one of ``ROLES``.

Loading never executes code: JSON is data. PyTorch's CUDA snapshot (``torch.cuda.memory._dump_snapshot``, the
file its memory viewer opens) is a pickle; ``load_cuda_pickle`` reads it with an unpickler that refuses every
class and function, which that file never needs (it holds only dicts, lists, tuples, strings and numbers), so
a crafted pickle cannot run anything - it fails to load instead.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import re
import time
from pathlib import Path
from typing import Any

from fastgen.utils.errors import UsageError
from fastgen.utils.safe_pickle import SafeUnpickler

FORMAT = "fastgen.memory_snapshot"
VERSION = 1
CATEGORIES: tuple[str, ...] = ("parameters", "gradients", "optimizer_state", "activations", "other")
ROLES: tuple[str, ...] = ("parameters", "gradients", "optimizer_state")
PHASES: tuple[str, ...] = ("data", "forward", "backward", "optimizer", "callbacks")
UNKNOWN_SITE = -1


def new_snapshot(*, backend: str, device: str, rank: int = 0, world_size: int = 1, t0_ns: int = 0) -> dict[str, Any]:
    """An empty snapshot with every key of the format present."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "backend": backend,
        "device": device,
        "rank": int(rank),
        "world_size": int(world_size),
        "t0_ns": int(t0_ns),
        "created_unix": time.time(),
        "window": {"start_iter": 0, "end_iter": 0},
        "crash": None,
        "config": {},
        "config_yaml": None,
        "estimate": None,
        "sites": [],
        "initial": [],
        "events": [],
        "markers": [],
        "roles": [],
        "raw": None,
        "notes": [],
    }


def save_snapshot(snapshot: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``snapshot`` as gzip JSON, atomically (a reader sees the old file or the whole new one)."""
    from fastgen.utils.io import atomic_write_with

    path = Path(path)
    data = json.dumps(snapshot, separators=(",", ":")).encode()

    def write(handle: Any) -> None:
        # mtime=0: the same snapshot always compresses to the same bytes.
        with gzip.GzipFile(fileobj=handle, mode="wb", compresslevel=6, mtime=0) as gz:
            gz.write(data)

    atomic_write_with(path, write)
    return path


def load_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a snapshot saved by ``save_snapshot`` (``.json.gz`` or plain ``.json``) and check its format.

    A CUDA allocator pickle is refused here (it needs the run's hook times and roles from the fastgen snapshot
    saved beside it); see ``load_any`` for re-rendering one explicitly.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"memory snapshot not found: {path}")
    raw = path.read_bytes()
    try:
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        snapshot = json.loads(text)
    except (OSError, EOFError, ValueError) as exc:
        raise UsageError(f"{path} is not a fastgen memory snapshot (gzip JSON): {exc}") from None
    return check_snapshot(snapshot, path)


def check_snapshot(snapshot: Any, path: Any = "snapshot") -> dict[str, Any]:
    """Validate the keys and the version; return the snapshot."""
    if not isinstance(snapshot, dict) or snapshot.get("format") != FORMAT:
        raise UsageError(f"{path} is not a fastgen memory snapshot (no format {FORMAT!r})")
    if snapshot.get("version") != VERSION:
        raise UsageError(f"{path}: snapshot version {snapshot.get('version')!r} is not supported (this fastgen reads {VERSION})")
    for key, kind in (("events", list), ("initial", list), ("sites", list), ("markers", list), ("roles", list)):
        if not isinstance(snapshot.get(key), kind):
            raise UsageError(f"{path}: snapshot field {key!r} is missing or not a {kind.__name__}")
    return snapshot


# ---- PyTorch's CUDA allocator snapshot -------------------------------------------------------------------------
def load_cuda_pickle(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``torch.cuda.memory._dump_snapshot`` file without executing code (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"memory snapshot not found: {path}")
    try:
        # plain data only: a CUDA memory snapshot holds dicts, lists, strings and numbers, no class or function
        raw = SafeUnpickler(io.BytesIO(path.read_bytes()), allowed=frozenset()).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as exc:
        raise UsageError(f"{path} is not a CUDA memory snapshot that can be read safely: {exc}") from None
    if not isinstance(raw, dict) or "segments" not in raw:
        raise UsageError(f"{path} is not a CUDA memory snapshot (no 'segments')")
    return raw


def sidecar_for_pickle(path: Path) -> Path:
    """``memory_report_rank0.pickle`` -> ``memory_report_rank0.json.gz`` (the fastgen snapshot beside it)."""
    return path.with_name(path.name[: -len(path.suffix)] + ".json.gz")


def load_any(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a fastgen snapshot, or a CUDA allocator pickle (converted; hook times and roles are taken from the
    fastgen snapshot beside it when there is one, else the report shows the memory without phases)."""
    path = Path(path)
    if path.suffix == ".pickle" or path.suffix == ".pkl":
        raw = load_cuda_pickle(path)
        sidecar = sidecar_for_pickle(path)
        base = load_snapshot(sidecar) if sidecar.is_file() else None
        return snapshot_from_cuda(raw, base=base, raw_name=path.name)
    return load_snapshot(path)


# ---- allocation sites ------------------------------------------------------------------------------------------
_INTERNAL = re.compile(
    r"(^|/)(torch|typing_extensions|contextlib\.py|functools\.py|threading\.py|runpy\.py)(/|$)"
    r"|(^|/)fastgen/(profiling|callbacks/mem_tracker\.py)|^<|site-packages/torch/"
)


def is_internal_frame(filename: str) -> bool:
    """Frames that never explain an allocation to a user: PyTorch itself, the standard library's plumbing, the
    profiler's own code. The innermost frame that is not internal is the allocation's site."""
    name = filename.replace("\\", "/")
    return bool(_INTERNAL.search(name)) or name.endswith(("/contextlib.py", "/functools.py", "/threading.py"))


def short_path(filename: str) -> str:
    """A readable path: from the package folder on (``fastgen/networks/mlp.py``) when under site-packages or
    this repository, else as given."""
    name = filename.replace("\\", "/")
    for anchor in ("/site-packages/", "/dist-packages/"):
        if anchor in name:
            return name.split(anchor, 1)[1]
    marker = name.rfind("/fastgen/")
    if marker >= 0:
        return name[marker + 1:]
    cwd = os.getcwd().replace("\\", "/") + "/"
    return name[len(cwd):] if name.startswith(cwd) else name


class SiteTable:
    """Interns allocation sites: equal sites get one index in ``snapshot["sites"]``."""

    def __init__(self, sites: list[dict[str, Any]] | None = None) -> None:
        self.sites: list[dict[str, Any]] = sites if sites is not None else []
        self._index = {self._key(s): i for i, s in enumerate(self.sites)}

    @staticmethod
    def _key(site: dict[str, Any]) -> tuple[Any, ...]:
        return (site.get("file"), site.get("line"), site.get("function"), site.get("op"), site.get("module"),
                site.get("via"))

    def add(self, file: str = "", line: int = 0, function: str = "", op: str = "", module: str = "",
            via: str = "") -> int:
        site = {"file": file, "line": int(line), "function": function, "op": op, "module": module, "via": via}
        key = self._key(site)
        if key not in self._index:
            self._index[key] = len(self.sites)
            self.sites.append(site)
        return self._index[key]


def _cuda_site(frames: Any, table: SiteTable) -> int:
    if not frames:
        return UNKNOWN_SITE
    fallback = None
    for frame in frames:  # innermost first
        filename = str(frame.get("filename", ""))
        if not filename or filename.startswith("??"):
            continue
        if fallback is None:
            fallback = frame
        if not is_internal_frame(filename):
            return table.add(short_path(filename), int(frame.get("line", 0)), str(frame.get("name", "")))
    if fallback is None:
        return UNKNOWN_SITE
    return table.add(short_path(str(fallback["filename"])), int(fallback.get("line", 0)), str(fallback.get("name", "")))


def snapshot_from_cuda(raw: dict[str, Any], base: dict[str, Any] | None = None, device_index: int | None = None,
                       raw_name: str | None = None) -> dict[str, Any]:
    """Convert PyTorch's CUDA allocator snapshot (``torch.cuda.memory._snapshot()``) into the fastgen format.

    ``base`` supplies the run's metadata, hook markers and roles (a snapshot made by the tracker with empty
    events); its ``t0_ns`` anchors the trace's ``time_us`` (Unix microseconds). Allocations are the trace's
    ``alloc`` entries and frees its ``free_completed`` entries (``free_requested`` when the trace has no
    completions); blocks freed in the window that the trace never saw allocated, and blocks still allocated at
    the end with no ``alloc`` in the trace, were allocated before the window began (``initial``).
    """
    if base is not None:
        snapshot = json.loads(json.dumps(base))  # a deep copy of plain data
    else:
        snapshot = new_snapshot(backend="cuda_allocator", device="cuda")
        snapshot["notes"].append("re-rendered from a CUDA allocator snapshot alone: no phases or roles")
    snapshot["backend"] = "cuda_allocator"
    snapshot["raw"] = raw_name or snapshot.get("raw")
    traces = raw.get("device_traces") or []
    if device_index is None:
        device = str(snapshot.get("device", "cuda"))
        device_index = int(device.split(":")[1]) if ":" in device else next((i for i, t in enumerate(traces) if t), 0)
    trace = traces[device_index] if device_index < len(traces) else []
    table = SiteTable()
    t0_ns = int(snapshot.get("t0_ns") or 0)
    if not t0_ns:
        times = [int(e["time_us"]) * 1000 for e in trace if "time_us" in e]
        t0_ns = min(times) if times else 0
        snapshot["t0_ns"] = t0_ns
    free_action = "free_completed" if any(e.get("action") == "free_completed" for e in trace) else "free_requested"
    events: list[list[int]] = []
    initial: list[list[int]] = []
    live: dict[int, int] = {}
    markers = list(snapshot.get("markers", []))
    last_t = 0
    for entry in trace:  # the trace is in allocator order; its approximate clock is made monotonic here
        action = entry.get("action")
        t = last_t = max(last_t, int(entry.get("time_us", 0)) * 1000 - t0_ns)
        if action == "alloc":
            addr, size = int(entry["addr"]), int(entry["size"])
            live[addr] = size
            events.append([t, addr, size, _cuda_site(entry.get("frames"), table)])
        elif action == free_action:
            addr, size = int(entry["addr"]), int(entry["size"])
            live.pop(addr, None)
            events.append([t, addr, -size, UNKNOWN_SITE])
        elif action == "oom":
            markers.append([t, "oom", -1, 0])
    allocated_in_trace = {e[1] for e in events if e[2] > 0}
    for segment in raw.get("segments", []):
        if device_index is not None and int(segment.get("device", device_index)) != device_index:
            continue
        address = int(segment.get("address", 0))
        for block in segment.get("blocks", []):
            block_addr = int(block.get("address", address))
            if block.get("state") == "active_allocated" and block_addr not in allocated_in_trace:
                initial.append([block_addr, int(block["size"]), _cuda_site(block.get("frames"), table)])
            address = block_addr + int(block["size"])
    snapshot["events"] = events
    snapshot["initial"] = initial
    snapshot["sites"] = table.sites
    snapshot["markers"] = sorted(markers, key=lambda m: m[0])
    return snapshot
