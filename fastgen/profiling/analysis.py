"""From a snapshot's raw events to what the report shows: blocks, categories, the timeline, the peak, the sites.

**Blocks.** Each allocation event opens a block at its address; the next free of that address closes it. A block
alive when the window began (``initial``), or freed in the window without its allocation having been seen, counts
from the start of the window. The memory in use at any moment is the sum of the open blocks - exactly the
running sum of the snapshot's events on top of its initial blocks, so the report can be checked against the
raw file by adding numbers.

**Categories** (one per block, first match wins):

1. ``parameters`` / ``gradients`` / ``optimizer_state`` - a tensor with that role (recorded by the tracker at
   the trainer's hooks: model parameters and buffers, their ``.grad``, the tensors in ``optimizer.state``) had
   its storage at the block's address at some moment while the block was alive;
2. ``activations`` - allocated during a forward phase and still alive when the backward phase of the same
   iteration began (what autograd saved for backward, and the outputs);
3. ``other`` - everything else: the data batch, temporaries of forward, backward and the optimizer step,
   callbacks' work.

**Sites** group blocks by where they were allocated (file, line, function and operator, see ``capture``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from fastgen.profiling.snapshot import CATEGORIES, PHASES, ROLES, UNKNOWN_SITE

_NEVER = 1 << 62


@dataclass
class Block:
    ptr: int
    size: int
    site: int
    alloc_seq: int  # index of the allocating event; -1: alive when the window began
    free_seq: int = _NEVER  # index of the freeing event; _NEVER: still alive at the end
    t_alloc: int | None = None
    t_free: int | None = None
    category: str = "other"


@dataclass
class SiteRow:
    label: str
    file: str
    line: int
    function: str
    op: str
    modules: list[str]
    via: list[str] = field(default_factory=list)
    peak_bytes: int = 0
    peak_blocks: int = 0
    alloc_bytes: int = 0
    alloc_count: int = 0
    categories: dict[str, int] = field(default_factory=dict)


@dataclass
class Phase:
    name: str
    iteration: int
    accum: int
    start: int
    end: int


@dataclass
class Analysis:
    snapshot: dict[str, Any]
    blocks: list[Block]
    phases: list[Phase]
    points: list[tuple[int, tuple[int, ...]]]  # (t, bytes per category) after each event; the first is the start
    peak_bytes: int
    peak_time: int
    peak_index: int  # index into ``points``
    peak_breakdown: dict[str, int]
    max_by_category: dict[str, int]
    start_bytes: int
    end_bytes: int
    duration: int
    sites: list[SiteRow]
    point_markers: list[tuple[int, str, int]]  # (t, "crash" | "oom" | "end", iteration)

    @property
    def rank(self) -> int:
        return int(self.snapshot.get("rank", 0))

    @property
    def peak_phase(self) -> Phase | None:
        return phase_at(self.phases, self.peak_time)

    def series(self, max_points: int = 1200) -> list[tuple[int, tuple[int, ...]]]:
        """The timeline reduced to at most ``max_points`` points: in each time bin the moment with the most
        memory in use (so no peak is lost), plus the first and last points."""
        points = self.points
        if len(points) <= max_points:
            return list(points)
        span = max(self.duration, 1)
        bins: dict[int, tuple[int, tuple[int, ...]]] = {}
        for t, values in points[1:-1]:
            b = min(int(t * (max_points - 2) / span), max_points - 3)
            best = bins.get(b)
            if best is None or sum(values) > sum(best[1]):
                bins[b] = (t, values)
        return [points[0], *(bins[b] for b in sorted(bins)), points[-1]]


def phase_at(phases: list[Phase], t: int) -> Phase | None:
    for phase in phases:
        if phase.start <= t < phase.end or (phase.start == phase.end == t):
            return phase
    return phases[-1] if phases and t >= phases[-1].end else None


def build_phases(markers: list[list[Any]], end_time: int) -> tuple[list[Phase], list[tuple[int, str, int]]]:
    """Phases (a marker of a phase lasts until the next marker) and point markers (end, crash, oom)."""
    ordered = sorted((m for m in markers), key=lambda m: int(m[0]))
    phases: list[Phase] = []
    points: list[tuple[int, str, int]] = []
    for i, (t, name, iteration, accum) in enumerate(ordered):
        if name not in PHASES:
            points.append((int(t), str(name), int(iteration)))
            continue
        following = [int(m[0]) for m in ordered[i + 1:]]
        end = following[0] if following else max(end_time, int(t))
        last = phases[-1] if phases else None
        if last is not None and (last.name, last.iteration, last.accum) == (name, iteration, accum) and last.end == int(t):
            last.end = end  # the same phase marked twice in a row (e.g. the optimizer phase)
            continue
        phases.append(Phase(str(name), int(iteration), int(accum), int(t), end))
    return phases, points


def site_label(site: dict[str, Any] | None) -> str:
    """``file:line function · operator`` (or ``· the PyTorch function`` that allocated, when no operator)."""
    if not site:
        return "(unknown site)"
    where = f"{site['file']}:{site['line']} {site['function']}".strip() if site.get("file") else ""
    what = site.get("op") or site.get("via") or ""
    if where and what:
        return f"{where} \u00b7 {what}"
    return where or what or "(unknown site)"


def analyse(snapshot: dict[str, Any]) -> Analysis:
    """Replay the snapshot's events into blocks, categories, the timeline, the peak and the site table."""
    blocks: list[Block] = []
    live: dict[int, int] = {}
    for ptr, size, site in snapshot["initial"]:
        if int(ptr) in live:
            continue
        live[int(ptr)] = len(blocks)
        blocks.append(Block(int(ptr), int(size), int(site), -1))
    steps: list[tuple[int, int, int]] = []  # (t, block index, +1 allocated / -1 freed)
    for seq, (t, ptr, size, site) in enumerate(snapshot["events"]):
        t, ptr, size = int(t), int(ptr), int(size)
        if size > 0:
            live[ptr] = len(blocks)
            blocks.append(Block(ptr, size, int(site), seq, t_alloc=t))
            steps.append((t, live[ptr], 1))
            continue
        index = live.pop(ptr, None)
        if index is None:  # allocated before the window: it counted from the start
            index = len(blocks)
            blocks.append(Block(ptr, -size, UNKNOWN_SITE, -1))
        blocks[index].free_seq = seq
        blocks[index].t_free = t
        steps.append((t, index, -1))

    last_event = int(snapshot["events"][-1][0]) if snapshot["events"] else 0
    last_marker = max((int(m[0]) for m in snapshot["markers"]), default=0)
    duration = max(last_event, last_marker, 1)
    phases, point_markers = build_phases(snapshot["markers"], duration)
    _categorise(blocks, snapshot["roles"], phases)

    cat_index = {c: i for i, c in enumerate(CATEGORIES)}
    totals = [0] * len(CATEGORIES)
    for block in blocks:
        if block.alloc_seq < 0:
            totals[cat_index[block.category]] += block.size
    points: list[tuple[int, tuple[int, ...]]] = [(0, tuple(totals))]
    max_by = list(totals)
    peak_index, peak_total = 0, sum(totals)
    for t, index, sign in steps:
        block = blocks[index]
        totals[cat_index[block.category]] += sign * block.size
        points.append((t, tuple(totals)))
        total = sum(totals)
        if total > peak_total:
            peak_total, peak_index = total, len(points) - 1
        for i, value in enumerate(totals):
            max_by[i] = max(max_by[i], value)
    peak_time = points[peak_index][0]
    peak_seq = peak_index - 1  # points[k] is the state after steps[k - 1]
    sites = _site_rows(snapshot, blocks, steps, peak_seq)
    return Analysis(
        snapshot=snapshot,
        blocks=blocks,
        phases=phases,
        points=points,
        peak_bytes=peak_total,
        peak_time=peak_time,
        peak_index=peak_index,
        peak_breakdown=dict(zip(CATEGORIES, points[peak_index][1])),
        max_by_category=dict(zip(CATEGORIES, max_by)),
        start_bytes=sum(points[0][1]),
        end_bytes=sum(points[-1][1]),
        duration=duration,
        sites=sites,
        point_markers=point_markers,
    )


def _categorise(blocks: list[Block], roles: list[list[Any]], phases: list[Phase]) -> None:
    priority = {role: i for i, role in enumerate(ROLES)}
    by_ptr: dict[int, list[tuple[int, str]]] = {}
    for t, role, ptr, _nbytes in roles:
        if role in priority:
            by_ptr.setdefault(int(ptr), []).append((int(t), str(role)))
    backward_start: dict[tuple[int, int], int] = {}
    for phase in phases:
        if phase.name == "backward":
            backward_start.setdefault((phase.iteration, phase.accum), phase.start)
    phase_starts = [p.start for p in phases]
    for block in blocks:
        best = None
        for t, role in by_ptr.get(block.ptr, ()):
            alive = (block.t_alloc is None or t >= block.t_alloc) and (block.t_free is None or t < block.t_free)
            if alive and (best is None or priority[role] < priority[best]):
                best = role
        if best is not None:
            block.category = best
            continue
        if block.t_alloc is None or not phases:
            continue
        i = bisect.bisect_right(phase_starts, block.t_alloc) - 1
        if i < 0 or phases[i].name != "forward" or block.t_alloc >= phases[i].end:
            continue
        forward = phases[i]
        # Alive when backward began (or, if the window ended or crashed before backward, when forward ended).
        until = backward_start.get((forward.iteration, forward.accum), forward.end)
        if block.t_free is None or block.t_free > until:
            block.category = "activations"


def _site_rows(snapshot: dict[str, Any], blocks: list[Block], steps: list[tuple[int, int, int]],
               peak_seq: int) -> list[SiteRow]:
    sites = snapshot["sites"]
    rows: dict[tuple[Any, ...], SiteRow] = {}

    def row_for(block: Block) -> SiteRow:
        site = sites[block.site] if 0 <= block.site < len(sites) else None
        if site is None:
            label = f"(allocated before the window: {block.category.replace('_', ' ')})" if block.alloc_seq < 0 \
                else "(unknown site)"
            key: tuple[Any, ...] = ("", label)
            if key not in rows:
                rows[key] = SiteRow(label, "", 0, "", "", [])
            return rows[key]
        key = (site.get("file"), site.get("line"), site.get("function"), site.get("op") or site.get("via"))
        if key not in rows:
            rows[key] = SiteRow(site_label(site), site.get("file", ""), int(site.get("line", 0)),
                                site.get("function", ""), site.get("op", ""), [])
        row = rows[key]
        for name, values in (("module", row.modules), ("via", row.via)):
            value = site.get(name)
            if value and value not in values:
                values.append(value)
        return row

    for block in blocks:
        row = row_for(block)
        if block.alloc_seq >= 0:
            row.alloc_bytes += block.size
            row.alloc_count += 1
        alive_at_peak = block.alloc_seq <= peak_seq < block.free_seq if block.alloc_seq >= 0 else peak_seq < block.free_seq
        if alive_at_peak:
            row.peak_bytes += block.size
            row.peak_blocks += 1
            row.categories[block.category] = row.categories.get(block.category, 0) + block.size
    return sorted(rows.values(), key=lambda r: (-r.peak_bytes, -r.alloc_bytes, r.label))


STATE_ROLES = ("parameters", "gradients", "optimizer_state")
TRAINING_PHASES = ("data", "forward", "backward", "optimizer")


def measured_memory(snapshot: dict[str, Any]) -> dict[str, int]:
    """What one rank's snapshot measured, in the terms ``fastgen dryrun`` estimates (bytes):

    * ``state`` - at the trainer's notes (the start of the window, before and after every optimizer step), the bytes
      of the distinct storages holding parameters, gradients and optimizer state, summed; the largest such sum;
    * ``replayed_state`` - those three categories at their largest simultaneous sum in the replay of every block;
    * ``training_peak`` - the largest total of all live blocks during the data / forward / backward / optimizer
      phases (the callbacks phase is left out: a checkpoint there gathers full tensors, which is not training);
    * ``peak`` - the largest total overall; plus ``state_<role>`` for each role at the ``state`` note.
    """
    notes: dict[int, dict[str, dict[int, int]]] = {}
    for t, role, ptr, nbytes in snapshot["roles"]:
        notes.setdefault(int(t), {}).setdefault(role, {})[int(ptr)] = int(nbytes)
    by_note = [{role: sum(notes[t].get(role, {}).values()) for role in STATE_ROLES} for t in sorted(notes)]
    state = max(by_note, key=lambda roles: sum(roles.values()), default=dict.fromkeys(STATE_ROLES, 0))
    analysis = analyse(snapshot)
    index = {c: i for i, c in enumerate(CATEGORIES)}
    replayed = training_peak = 0
    for t, values in analysis.points:
        replayed = max(replayed, sum(values[index[c]] for c in STATE_ROLES))
        phase = phase_at(analysis.phases, t)
        if phase is not None and phase.name in TRAINING_PHASES:
            training_peak = max(training_peak, sum(values))
    return {"state": sum(state.values()), **{f"state_{k}": v for k, v in state.items()}, "replayed_state": replayed,
            "training_peak": training_peak, "peak": analysis.peak_bytes}
