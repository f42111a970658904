"""Recording allocations: the profiler's memory events on CPU, the CUDA allocator's memory history on GPUs.

Both recorders have the same three calls - ``start()``, ``mark(index)`` at every trainer hook, ``stop(...)`` -
so the tracker does not care which device it runs on.

* ``CpuRecorder`` runs ``torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)``
  and reads PyTorch's event tree afterwards: every allocation and free (address, size), the operator that made it
  (``aten::linear``, ``AddmmBackward0``, ``Optimizer.step#Adam.step``), the ``nn.Module`` it ran in and the
  innermost Python frame outside PyTorch. Python frames in the profiler carry the *first line of the function*
  (the profiler's Python tracer records where a function starts, not the line being run). Hook times are
  ``record_function`` ranges named ``fastgen.mark:<index>``, so they share the profiler's clock.
* ``CudaRecorder`` turns on ``torch.cuda.memory._record_memory_history`` (Python stacks, exact lines), and at
  the end writes ``torch.cuda.memory._dump_snapshot`` - the pickle PyTorch's memory viewer opens - and reads it
  back with the safe loader. Its trace times are Unix microseconds, so hook times are ``time.time_ns()``.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Any

import torch

from fastgen.profiling.snapshot import UNKNOWN_SITE, SiteTable, is_internal_frame, load_cuda_pickle, short_path

MARK_PREFIX = "fastgen.mark:"
_PY_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<function>.*)$")
_MODULE_PREFIX = "nn.Module: "
_ENGINE_PREFIX = "autograd::engine::evaluate_function: "


class CpuRecorder:
    """Memory events of the CPU allocator through ``torch.profiler`` (see the module docstring)."""

    backend = "cpu_profiler"

    def __init__(self) -> None:
        self._prof: Any = None

    def start(self) -> None:
        # Kineto prints trace markers ("USDT: ... profiler_start") to stderr at every start and stop unless its
        # log level is above them; a level the user set is kept.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True)
        prof.start()
        self._prof = prof

    @property
    def active(self) -> bool:
        return self._prof is not None

    def mark(self, index: int) -> None:
        with torch.profiler.record_function(f"{MARK_PREFIX}{index}"):
            pass

    def stop(self) -> tuple[list[list[int]], list[dict[str, Any]], dict[int, int]]:
        """Stop profiling; return ``(events, sites, marker_times)``: events ``[t_ns, ptr, size, site]`` in time
        order (absolute Unix ns), the site table, and the profiler's time of each ``mark(index)``."""
        prof, self._prof = self._prof, None
        prof.stop()
        from torch._C._profiler import _EventType

        table = SiteTable()
        events: list[list[int]] = []
        marks: dict[int, int] = {}
        site_cache: dict[int, int] = {}
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            if node.tag == _EventType.Allocation:
                fields = node.extra_fields
                if fields.device.type != "cpu":
                    continue
                size = int(fields.alloc_size)
                site = UNKNOWN_SITE
                if size > 0:
                    parent = node.parent
                    key = id(parent) if parent is not None else 0
                    if key not in site_cache:
                        site_cache[key] = _site_of(parent, table)
                    site = site_cache[key]
                events.append([int(node.start_time_ns), int(fields.ptr), size, site])
            elif node.tag == _EventType.TorchOp and node.name.startswith(MARK_PREFIX):
                marks[int(node.name[len(MARK_PREFIX):])] = int(node.start_time_ns)
        events.sort(key=lambda e: e[0])  # a stable sort: same-time events keep the tree's order
        return events, table.sites, marks


def _site_of(node: Any, table: SiteTable) -> int:
    """The allocation's site: the innermost Python frame outside PyTorch, the outermost operator of the operator
    chain that allocated, the innermost ``nn.Module``, and the innermost PyTorch Python function on the way
    (``via``: e.g. ``torch/optim/adam.py:347 _single_tensor_adam`` when Adam allocated from a Python op)."""
    from torch._C._profiler import _EventType

    op = ""
    module = ""
    via = ""
    in_ops = True
    fallback: tuple[str, int, str] | None = None
    while node is not None:
        if node.tag == _EventType.TorchOp:
            if in_ops:
                op = node.name
        elif node.tag == _EventType.PyCall:
            in_ops = False
            name = node.name
            if name.startswith(_MODULE_PREFIX):
                module = module or name[len(_MODULE_PREFIX):]
            else:
                match = _PY_FRAME.match(name)
                if match:
                    frame = (match["file"], int(match["line"]), match["function"])
                    fallback = fallback or frame
                    if not is_internal_frame(frame[0]):
                        return table.add(short_path(frame[0]), frame[1], frame[2], _clean_op(op), module, via)
                    via = via or f"{short_path(frame[0])}:{frame[1]} {frame[2]}"
        else:
            in_ops = in_ops and node.tag != _EventType.PyCCall
        node = node.parent
    if fallback is not None:
        return table.add(short_path(fallback[0]), fallback[1], fallback[2], _clean_op(op), module, via)
    return table.add("", 0, "", _clean_op(op), module) if op else UNKNOWN_SITE


def _clean_op(op: str) -> str:
    return op[len(_ENGINE_PREFIX):] if op.startswith(_ENGINE_PREFIX) else op


class CudaRecorder:
    """The CUDA caching allocator's memory history (see the module docstring)."""

    backend = "cuda_allocator"

    def __init__(self, device: torch.device, max_entries: int = 1_000_000) -> None:
        self.device = device
        self.max_entries = int(max_entries)
        self._active = False

    @property
    def active(self) -> bool:
        return self._active

    def start(self) -> None:
        record = torch.cuda.memory._record_memory_history
        wanted = {"enabled": "all", "context": "all", "stacks": "python", "max_entries": self.max_entries,
                  "device": self.device, "clear_history": True}
        accepted = inspect.signature(record).parameters
        record(**{k: v for k, v in wanted.items() if k in accepted})
        self._active = True

    def mark(self, index: int) -> None:
        """Hook times come from ``time.time_ns()`` (the trace's clock is Unix time too)."""

    def stop(self, raw_path: Path) -> dict[str, Any]:
        """Write PyTorch's snapshot (a pickle its memory viewer opens) to ``raw_path``, stop recording, and
        return the snapshot as read back by the safe loader."""
        raw_path = Path(raw_path)
        raw_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = raw_path.with_name(f".{raw_path.name}.tmp")
        try:
            torch.cuda.memory._dump_snapshot(str(tmp))
            os.replace(tmp, raw_path)
        finally:
            self._active = False
            record = torch.cuda.memory._record_memory_history
            kwargs = {"device": self.device} if "device" in inspect.signature(record).parameters else {}
            record(enabled=None, **kwargs)
        return load_cuda_pickle(raw_path)
