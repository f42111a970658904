"""The memory report: one self-contained HTML file (inline SVG, CSS and a few lines of JS; no network).

One tab per rank, each with: the memory in use over time as stacked areas per category, with the iteration
phases (data, forward, backward, optimizer, callbacks) as a coloured strip and shading, iteration boundaries,
the peak, the estimate of static memory and a crash or out-of-memory marker; the peak broken down by category
beside the estimate; the largest allocation sites; the run's config summary; and the snapshot files it came
from. Every number is also in a ``data-bytes`` attribute (exact bytes) so tools and tests can read the report.

The timeline is drawn server-side as SVG: the report looks the same in any browser, with scripts off, and in a
screenshot. The hover read-out is the only script.
"""

from __future__ import annotations

import datetime
import html
import json
import math
import os
from pathlib import Path
from typing import Any

from fastgen.profiling.analysis import Analysis, Phase, analyse
from fastgen.profiling.snapshot import CATEGORIES, PHASES

CATEGORY_COLORS: dict[str, str] = {
    "parameters": "#4e79a7",
    "gradients": "#f28e2b",
    "optimizer_state": "#59a14f",
    "activations": "#e15759",
    "other": "#b07aa1",
}
PHASE_COLORS: dict[str, str] = {
    "data": "#bab0ac",
    "forward": "#76b7b2",
    "backward": "#edc948",
    "optimizer": "#9c755f",
    "callbacks": "#ff9da7",
}
CATEGORY_LABELS: dict[str, str] = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations",
    "other": "other",
}
PHASE_HELP: dict[str, str] = {
    "data": "loading and moving the batch",
    "forward": "on_training_accum_step_begin \u2192 on_backward_begin",
    "backward": "on_backward_begin \u2192 end of backward",
    "optimizer": "on_optimizer_step_begin \u2192 on_training_step_end (step, zero_grad)",
    "callbacks": "on_training_step_end \u2192 next step (callbacks, validation, checkpoints)",
}
# The plot area's background: a colour used nowhere else, so a screenshot test can find the plot.
PLOT_BACKGROUND = "#fdfdfd"
# Bottom to top in the stacked timeline: what stays, then what comes and goes.
STACK_ORDER: tuple[str, ...] = ("parameters", "optimizer_state", "gradients", "activations", "other")

WIDTH, HEIGHT = 1100, 380
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 78, 24, 46, 40


def fmt_bytes(n: float) -> str:
    """``1536`` -> ``1.50 KiB``: binary units, about three significant digits."""
    n = float(n)
    if abs(n) < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if abs(n) < 1024 or unit == "TiB":
            break
    digits = 0 if abs(n) >= 100 else 1 if abs(n) >= 10 else 2
    return f"{n:.{digits}f} {unit}"


def fmt_time(ns: float) -> str:
    ms = ns / 1e6
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    return f"{ms:.4g} ms"


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = max(span / ticks, 1e-12)
    power = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if mult * power >= raw:
            return mult * power
    return 10 * power


def _byte_ticks(ymax: float) -> tuple[list[float], float, str]:
    """Ticks on a binary unit scale: returns (tick values in bytes, the unit's size, its name)."""
    unit, name = 1.0, "B"
    for candidate, label in ((1024.0, "KiB"), (1024.0**2, "MiB"), (1024.0**3, "GiB"), (1024.0**4, "TiB")):
        if ymax >= 2 * candidate:
            unit, name = candidate, label
    step = _nice_step(ymax / unit) * unit
    ticks = [i * step for i in range(int(ymax // step) + 1)]
    return ticks, unit, name


# ---- the timeline ----------------------------------------------------------------------------------------------
def timeline_svg(analysis: Analysis, rank: int, max_points: int = 700) -> tuple[str, list[Any]]:
    """The SVG of the timeline and the (reduced) series behind it, for the hover read-out."""
    series = analysis.series(max_points)
    estimate = analysis.snapshot.get("estimate") or {}
    est_total = int(estimate.get("total", 0) or 0)
    duration = max(analysis.duration, 1)
    ymax = max(analysis.peak_bytes, est_total, 1) * 1.1
    x0, x1 = MARGIN_LEFT, WIDTH - MARGIN_RIGHT
    y0, y1 = HEIGHT - MARGIN_BOTTOM, MARGIN_TOP

    def X(t: float) -> float:
        return x0 + (x1 - x0) * min(max(t, 0), duration) / duration

    def Y(b: float) -> float:
        return y0 - (y0 - y1) * b / ymax

    parts: list[str] = [
        f'<svg class="timeline" id="timeline-{rank}" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="memory in use over time, rank {rank}" data-rank="{rank}">',
        f'<rect class="plot-area" x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="{PLOT_BACKGROUND}" stroke="#c8c8c8"/>',
    ]
    # Phases: a strip above the plot and light shading inside it.
    for phase in analysis.phases:
        color = PHASE_COLORS.get(phase.name, "#dddddd")
        xa, xb = X(phase.start), X(phase.end)
        w = max(xb - xa, 0.6)
        title = f"{phase.name}, iteration {phase.iteration}" + (f", round {phase.accum}" if phase.accum else "")
        parts.append(f'<rect class="phase phase-{phase.name}" x="{xa:.2f}" y="{y1 - 18}" width="{w:.2f}" height="12" '
                     f'fill="{color}"><title>{_esc(title)} ({fmt_time(phase.end - phase.start)})</title></rect>')
        if phase.name in ("forward", "backward", "optimizer"):
            parts.append(f'<rect x="{xa:.2f}" y="{y1}" width="{w:.2f}" height="{y0 - y1}" fill="{color}" fill-opacity="0.10"/>')
    parts.append(f'<text x="{x0 - 6}" y="{y1 - 8}" text-anchor="end" class="axis-label">phase</text>')
    # Iteration boundaries.
    for phase in analysis.phases:
        if phase.name == "data" and phase.accum == 0:
            x = X(phase.start)
            parts.append(f'<line x1="{x:.2f}" y1="{y1 - 20}" x2="{x:.2f}" y2="{y0}" stroke="#555" stroke-dasharray="3,3" stroke-width="0.8"/>')
            parts.append(f'<text x="{x + 3:.2f}" y="{y1 - 24}" class="iter-label">iteration {phase.iteration}</text>')
    # Stacked areas (step-after), bottom to top in STACK_ORDER.
    index = {c: i for i, c in enumerate(CATEGORIES)}
    lower = [0] * len(series)
    for category in STACK_ORDER:
        upper = [lo + values[index[category]] for lo, (_, values) in zip(lower, series)]
        if any(u != lo for u, lo in zip(upper, lower)):
            path = _step_area(series, upper, lower, X, Y, x1)
            parts.append(f'<path class="area area-{category}" d="{path}" fill="{CATEGORY_COLORS[category]}" stroke="none">'
                         f'<title>{_esc(CATEGORY_LABELS[category])}</title></path>')
        lower = upper
    # The total as a line on top.
    parts.append(f'<path class="total-line" d="{_step_line(series, lower, X, Y, x1)}" fill="none" stroke="#222" stroke-width="1.2"/>')
    # Estimate of static memory.
    if est_total:
        y = Y(est_total)
        parts.append(f'<line class="estimate-line" x1="{x0}" y1="{y:.2f}" x2="{x1}" y2="{y:.2f}" stroke="#333" '
                     'stroke-dasharray="8,4" stroke-width="1.2"/>')
        parts.append(f'<text x="{x1 - 6}" y="{y - 5:.2f}" text-anchor="end" class="annot">estimate (parameters + gradients + '
                     f'optimizer state): {fmt_bytes(est_total)}</text>')
    # Peak.
    px, py = X(analysis.peak_time), Y(analysis.peak_bytes)
    anchor = "end" if px > (x0 + x1) / 2 else "start"
    dx = -8 if anchor == "end" else 8
    parts.append(f'<circle class="peak-marker" cx="{px:.2f}" cy="{py:.2f}" r="4.5" fill="#111"/>')
    parts.append(f'<text x="{px + dx:.2f}" y="{py + 4:.2f}" text-anchor="{anchor}" class="annot peak-label">'
                 f'peak {fmt_bytes(analysis.peak_bytes)}</text>')
    # Crash / out-of-memory / end markers.
    for t, name, iteration in analysis.point_markers:
        if name in ("crash", "oom"):
            x = X(t)
            label = "out of memory" if name == "oom" else "crash"
            parts.append(f'<line class="crash-marker" x1="{x:.2f}" y1="{y1}" x2="{x:.2f}" y2="{y0}" stroke="#d62728" stroke-width="2"/>')
            parts.append(f'<text x="{x - 4:.2f}" y="{y1 + 14}" text-anchor="end" class="annot crash-label">{label}</text>')
    # Axes.
    ticks, unit, unit_name = _byte_ticks(ymax)
    for value in ticks:
        y = Y(value)
        parts.append(f'<line x1="{x0 - 4}" y1="{y:.2f}" x2="{x1}" y2="{y:.2f}" stroke="#000" stroke-opacity="0.08"/>')
        parts.append(f'<text x="{x0 - 7}" y="{y + 4:.2f}" text-anchor="end" class="tick">{value / unit:g} {unit_name}</text>')
    step = _nice_step(duration / 1e6, 8) * 1e6
    t = 0.0
    while t <= duration + 1:
        x = X(t)
        parts.append(f'<line x1="{x:.2f}" y1="{y0}" x2="{x:.2f}" y2="{y0 + 4}" stroke="#666"/>')
        parts.append(f'<text x="{x:.2f}" y="{y0 + 16}" text-anchor="middle" class="tick">{fmt_time(t)}</text>')
        t += step
    parts.append(f'<text x="{(x0 + x1) / 2}" y="{HEIGHT - 6}" text-anchor="middle" class="axis-label">time since the window began</text>')
    parts.append(f'<line class="hover-line" x1="0" y1="{y1}" x2="0" y2="{y0}" stroke="#000" stroke-width="1" visibility="hidden"/>')
    parts.append("</svg>")
    data = [[t, *values] for t, values in series]
    return "\n".join(parts), data


def _step_line(series: list[Any], tops: list[int], X: Any, Y: Any, x_end: float) -> str:
    cmds = []
    for i, ((t, _), top) in enumerate(zip(series, tops)):
        x, y = X(t), Y(top)
        cmds.append(f"{'M' if i == 0 else 'L'}{x:.2f},{y:.2f}")
        x_next = X(series[i + 1][0]) if i + 1 < len(series) else x_end
        cmds.append(f"L{x_next:.2f},{y:.2f}")
    return "".join(cmds)


def _step_area(series: list[Any], upper: list[int], lower: list[int], X: Any, Y: Any, x_end: float) -> str:
    top = _step_line(series, upper, X, Y, x_end)
    back = []
    for i in range(len(series) - 1, -1, -1):
        x = X(series[i][0])
        x_next = X(series[i + 1][0]) if i + 1 < len(series) else x_end
        back.append(f"L{x_next:.2f},{Y(lower[i]):.2f}L{x:.2f},{Y(lower[i]):.2f}")
    return top + "".join(back) + "Z"


# ---- tables ----------------------------------------------------------------------------------------------------
def _bytes_cell(n: int) -> str:
    return f'<td class="num" data-bytes="{int(n)}">{_esc(fmt_bytes(n))}</td>'


def _phase_text(phase: Phase | None) -> str:
    if phase is None:
        return "before the first phase"
    text = f"{phase.name}, iteration {phase.iteration}"
    return text + (f", accumulation round {phase.accum}" if phase.accum else "")


def breakdown_html(analysis: Analysis) -> str:
    estimate = analysis.snapshot.get("estimate") or {}
    peak = max(analysis.peak_bytes, 1)
    bar = []
    x = 0.0
    for category in STACK_ORDER:
        value = analysis.peak_breakdown[category]
        w = 600 * value / peak
        if w > 0:
            bar.append(f'<rect x="{x:.2f}" y="0" width="{w:.2f}" height="22" fill="{CATEGORY_COLORS[category]}">'
                       f'<title>{_esc(CATEGORY_LABELS[category])}: {_esc(fmt_bytes(value))}</title></rect>')
        x += w
    rows = []
    for category in CATEGORIES:
        value = analysis.peak_breakdown[category]
        est = estimate.get(category)
        est_cell = _bytes_cell(int(est)) if est is not None else '<td class="num muted">not estimated</td>'
        rows.append(
            f'<tr data-category="{category}"><td><span class="swatch" style="background:{CATEGORY_COLORS[category]}"></span>'
            f"{_esc(CATEGORY_LABELS[category])}</td>{_bytes_cell(value)}<td class=\"num\">{100 * value / peak:.1f}%</td>"
            f"{_bytes_cell(analysis.max_by_category[category])}{est_cell}</tr>"
        )
    est_total = estimate.get("total")
    total_est_cell = _bytes_cell(int(est_total)) if est_total is not None else '<td class="num muted">-</td>'
    rows.append(f'<tr class="total" data-category="total"><td>total</td>{_bytes_cell(analysis.peak_bytes)}<td class="num">100%</td>'
                f'<td class="num muted">-</td>{total_est_cell}</tr>')
    note = ""
    if estimate:
        sharded = f", sharded over {estimate.get('world_size')} ranks" if estimate.get("sharded") else ""
        note = (f'<p class="muted">Estimate: computed on the meta device before training ({_esc(estimate.get("method", ""))}'
                f"{_esc(sharded)}); activations depend on the batch and are not estimated.</p>")
    return (
        f'<svg class="breakdown-bar" viewBox="0 0 600 22" width="600" height="22">{"".join(bar)}</svg>'
        '<table class="breakdown"><thead><tr><th>category</th><th>at peak</th><th>share</th><th>max in window</th>'
        f'<th>estimate (dryrun)</th></tr></thead><tbody>{"".join(rows)}</tbody></table>{note}'
    )


def sites_html(analysis: Analysis, top: int = 15) -> str:
    rows = []
    for row in analysis.sites[:top]:
        cats = ", ".join(f"{CATEGORY_LABELS.get(c, c)} {fmt_bytes(v)}" for c, v in
                         sorted(row.categories.items(), key=lambda kv: -kv[1]))
        detail = []
        if row.modules:
            detail.append("in " + ", ".join(row.modules[:3]) + (" \u2026" if len(row.modules) > 3 else ""))
        if row.via and row.op:
            detail.append("via " + ", ".join(row.via[:2]) + (" \u2026" if len(row.via) > 2 else ""))
        detail_html = f'<div class="muted">{_esc(" · ".join(detail))}</div>' if detail else ""
        rows.append(
            f'<tr class="site" data-site="{_esc(row.label)}"><td class="site-label"><code>{_esc(row.label)}</code>'
            f'{detail_html}</td>'
            f'{_bytes_cell(row.peak_bytes)}<td class="num" data-count="{row.peak_blocks}">{row.peak_blocks:,}</td>'
            f'{_bytes_cell(row.alloc_bytes)}<td class="num" data-count="{row.alloc_count}">{row.alloc_count:,}</td>'
            f"<td>{_esc(cats)}</td></tr>"
        )
    if not rows:
        return '<p class="muted">No allocations were recorded.</p>'
    return (
        '<table class="sites"><thead><tr><th>site (file:line function \u00b7 operator)</th><th>live at peak</th>'
        "<th>blocks</th><th>allocated in window</th><th>allocations</th><th>categories at peak</th></tr></thead>"
        f'<tbody>{"".join(rows)}</tbody></table>'
    )


def config_html(snapshot: dict[str, Any]) -> str:
    summary = snapshot.get("config") or {}
    rows = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in summary.items())
    window = snapshot.get("window") or {}
    rows += (f"<tr><th>tracked iterations</th><td>{_esc(window.get('start_iter'))} \u2013 "
             f"{_esc(int(window.get('end_iter', 0)) - 1)}</td></tr>")
    rows += f"<tr><th>recorded with</th><td>{_esc(_backend_text(snapshot))}</td></tr>"
    yaml_text = snapshot.get("config_yaml")
    details = (f"<details><summary>full config (secrets redacted)</summary><pre>{_esc(yaml_text)}</pre></details>"
               if yaml_text else "")
    return f'<table class="config">{rows}</table>{details}'


def _backend_text(snapshot: dict[str, Any]) -> str:
    if snapshot.get("backend") == "cuda_allocator":
        return f"CUDA caching allocator memory history on {snapshot.get('device')}"
    return f"torch.profiler memory events on {snapshot.get('device')} (profile_memory, record_shapes, with_stack)"


# ---- the page --------------------------------------------------------------------------------------------------
def rank_section(analysis: Analysis, visible: bool, source: str | None) -> tuple[str, list[Any]]:
    snap = analysis.snapshot
    rank = analysis.rank
    svg, series = timeline_svg(analysis, rank)
    estimate = snap.get("estimate") or {}
    crash = snap.get("crash")
    banner = ""
    if crash:
        kind = ("ran out of memory" if crash.get("oom") else
                "was interrupted" if crash.get("type") in ("TrainingInterrupted", "StartUpInterrupted", "KeyboardInterrupt") else "crashed")
        banner = (f'<div class="crash" data-crash-type="{_esc(crash.get("type"))}"><strong>The run {kind}</strong> in iteration '
                  f'{_esc(crash.get("iteration"))}: <code>{_esc(crash.get("type"))}: {_esc(str(crash.get("message", ""))[:500])}</code>. '
                  "The report shows the memory up to that moment.</div>")
    est_text = ""
    if estimate.get("total"):
        ratio = analysis.peak_bytes / max(int(estimate["total"]), 1)
        est_text = (f'<div class="card"><div class="k">estimate (static)</div><div class="v" data-bytes="{int(estimate["total"])}">'
                    f'{_esc(fmt_bytes(estimate["total"]))}</div><div class="muted">peak = {ratio:.2f} \u00d7 estimate</div></div>')
    legend = "".join(f'<span class="legend-item"><span class="swatch" style="background:{CATEGORY_COLORS[c]}"></span>'
                     f"{_esc(CATEGORY_LABELS[c])}</span>" for c in STACK_ORDER)
    phase_legend = "".join(f'<span class="legend-item" title="{_esc(PHASE_HELP[p])}"><span class="swatch" '
                           f'style="background:{PHASE_COLORS[p]}"></span>{p}</span>' for p in PHASES)
    notes = "".join(f"<li>{_esc(n)}</li>" for n in snap.get("notes", []))
    raw = snap.get("raw")
    files = []
    if source:
        files.append(f"<li>fastgen snapshot: <code>{_esc(source)}</code></li>")
    if raw:
        files.append(f"<li>PyTorch CUDA snapshot (opens in PyTorch's memory viewer, pytorch.org/memory_viz): "
                     f"<code>{_esc(raw)}</code></li>")
    style = "" if visible else ' style="display:none"'
    body = f"""
<section class="rank" id="rank-{rank}" data-rank="{rank}" data-peak-bytes="{analysis.peak_bytes}" data-peak-time-ns="{analysis.peak_time}"{style}>
{banner}
<div class="cards">
  <div class="card"><div class="k">peak in use</div><div class="v" data-bytes="{analysis.peak_bytes}">{_esc(fmt_bytes(analysis.peak_bytes))}</div>
    <div class="muted">at {_esc(fmt_time(analysis.peak_time))}: {_esc(_phase_text(analysis.peak_phase))}</div></div>
  <div class="card"><div class="k">at window start</div><div class="v" data-bytes="{analysis.start_bytes}">{_esc(fmt_bytes(analysis.start_bytes))}</div>
    <div class="muted">allocated before the first tracked step</div></div>
  <div class="card"><div class="k">at window end</div><div class="v" data-bytes="{analysis.end_bytes}">{_esc(fmt_bytes(analysis.end_bytes))}</div>
    <div class="muted">{len(snap["events"]):,} allocation events over {_esc(fmt_time(analysis.duration))}</div></div>
  {est_text}
</div>
<h2>Memory over time</h2>
<div class="chart-wrap">{svg}<div class="hover-box" id="hover-{rank}"></div></div>
<div class="legend">{legend}<span class="sep">phases:</span>{phase_legend}</div>
<h2>Peak by category</h2>
{breakdown_html(analysis)}
<h2>Largest allocation sites</h2>
<p class="muted">Blocks grouped by where they were allocated: the innermost Python frame outside PyTorch
({'the exact line' if snap.get('backend') == 'cuda_allocator' else "the function's first line, as the profiler records it"})
and the operator. Sorted by memory live at the peak.</p>
{sites_html(analysis)}
<h2>Run</h2>
{config_html(snap)}
{f'<h2>Files</h2><ul>{"".join(files)}</ul>' if files else ''}
{f'<h2>Notes</h2><ul>{notes}</ul>' if notes else ''}
</section>"""
    return body, series


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;background:#f6f6f4;color:#1d1d1d}
header{background:#20262e;color:#fff;padding:14px 24px}
header h1{font-size:20px;margin:0 0 4px 0}header .muted{color:#c8ccd2}
main{padding:12px 24px 40px 24px;max-width:1160px}
.tabs{display:flex;gap:6px;margin:12px 0}
.tab{border:1px solid #bbb;background:#fff;padding:6px 14px;border-radius:4px;cursor:pointer;font-size:14px}
.tab.active{background:#20262e;color:#fff;border-color:#20262e}
h2{font-size:16px;margin:22px 0 8px 0}
.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px 14px;min-width:190px}
.card .k{font-size:12px;text-transform:uppercase;color:#666;letter-spacing:.04em}.card .v{font-size:22px;font-weight:600}
.muted{color:#666;font-size:13px}
.chart-wrap{position:relative;background:#fff;border:1px solid #ddd;border-radius:6px;padding:6px;width:max-content}
.timeline text{font-size:11px;fill:#333}.timeline .annot{font-size:12px;fill:#111;paint-order:stroke;stroke:#fdfdfd;stroke-width:3px;stroke-linejoin:round}.timeline .iter-label{font-size:11px;fill:#333}
.timeline .crash-label{fill:#d62728;font-weight:600}.timeline .peak-label{font-weight:600}
.hover-box{position:absolute;display:none;background:rgba(255,255,255,.95);border:1px solid #999;border-radius:4px;padding:6px 8px;font-size:12px;pointer-events:none;white-space:nowrap}
.legend{margin:8px 0;font-size:13px}.legend-item{margin-right:14px;white-space:nowrap}.sep{margin:0 10px 0 8px;color:#666}
.swatch{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;vertical-align:-1px}
table{border-collapse:collapse;background:#fff;font-size:13px;margin-top:6px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}th{background:#f0f0ee}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.total td{font-weight:600}
.sites code{font-size:12px}.config th{width:210px}
.crash{background:#fdecea;border:1px solid #d62728;color:#611a15;padding:10px 14px;border-radius:6px;margin:6px 0 12px 0}
pre{background:#fff;border:1px solid #ddd;padding:8px;font-size:12px;max-height:420px;overflow:auto}
.breakdown-bar{display:block;margin:4px 0}
"""

_JS = """
(function(){
  var tabs=document.querySelectorAll('.tab');
  tabs.forEach(function(tab){tab.addEventListener('click',function(){
    tabs.forEach(function(t){t.classList.remove('active')});tab.classList.add('active');
    document.querySelectorAll('section.rank').forEach(function(s){s.style.display=(s.dataset.rank===tab.dataset.rank)?'':'none'});
  })});
  var names=JSON.parse(document.getElementById('category-names').textContent);
  function fmt(n){var u=['B','KiB','MiB','GiB','TiB'],i=0;while(Math.abs(n)>=1024&&i<4){n/=1024;i++}return (i?n.toFixed(2):n)+' '+u[i]}
  document.querySelectorAll('svg.timeline').forEach(function(svg){
    var rank=svg.dataset.rank,data=JSON.parse(document.getElementById('series-'+rank).textContent);
    var meta=data.meta,pts=data.points,box=document.getElementById('hover-'+rank),line=svg.querySelector('.hover-line');
    svg.addEventListener('mousemove',function(ev){
      var r=svg.getBoundingClientRect(),x=(ev.clientX-r.left)*meta.width/r.width;
      if(x<meta.x0||x>meta.x1){box.style.display='none';line.setAttribute('visibility','hidden');return}
      var t=(x-meta.x0)/(meta.x1-meta.x0)*meta.duration,lo=0,hi=pts.length-1;
      while(lo<hi){var mid=(lo+hi+1)>>1;if(pts[mid][0]<=t)lo=mid;else hi=mid-1}
      var p=pts[lo],total=0,rows='';
      for(var i=1;i<p.length;i++){total+=p[i];if(p[i])rows+='<div>'+names[i-1]+': '+fmt(p[i])+'</div>'}
      box.innerHTML='<b>'+(t/1e6).toFixed(2)+' ms: '+fmt(total)+'</b>'+rows;
      box.style.display='block';box.style.left=(ev.clientX-r.left+14)+'px';box.style.top=(ev.clientY-r.top+8)+'px';
      line.setAttribute('x1',x);line.setAttribute('x2',x);line.setAttribute('visibility','visible');
    });
    svg.addEventListener('mouseleave',function(){box.style.display='none';line.setAttribute('visibility','hidden')});
  });
})();
"""


def _script_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/")


def render_report(snapshots: list[dict[str, Any]], sources: list[str | None] | None = None,
                  title: str = "fastgen memory report") -> str:
    """The whole HTML page for one snapshot per rank (sorted by rank)."""
    sources = sources or [None] * len(snapshots)
    pairs = sorted(zip(snapshots, sources), key=lambda p: int(p[0].get("rank", 0)))
    analyses = [analyse(s) for s, _ in pairs]
    sections, scripts, tabs = [], [], []
    for i, (analysis, (_, source)) in enumerate(zip(analyses, pairs)):
        body, series = rank_section(analysis, visible=(i == 0), source=source)
        sections.append(body)
        meta = {"width": WIDTH, "x0": MARGIN_LEFT, "x1": WIDTH - MARGIN_RIGHT, "duration": max(analysis.duration, 1)}
        scripts.append(f'<script type="application/json" id="series-{analysis.rank}">'
                       f'{_script_json({"meta": meta, "points": series})}</script>')
        peak = fmt_bytes(analysis.peak_bytes)
        tabs.append(f'<button class="tab{" active" if i == 0 else ""}" data-rank="{analysis.rank}">rank {analysis.rank} '
                    f"\u00b7 peak {_esc(peak)}</button>")
    first = analyses[0].snapshot if analyses else {}
    run = (first.get("config") or {}).get("run", "")
    generated = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    names = [CATEGORY_LABELS[c] for c in CATEGORIES]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_esc(title)}{f" - {_esc(run)}" if run else ""}</title><style>{_CSS}</style></head>
<body data-ranks="{len(analyses)}">
<header><h1>{_esc(title)}</h1><div class="muted">{_esc(run)} \u00b7 {len(analyses)} rank(s) \u00b7 generated {generated}
\u00b7 one file, works offline</div></header>
<main>
<nav class="tabs">{"".join(tabs)}</nav>
{"".join(sections)}
</main>
<script type="application/json" id="category-names">{_script_json(names)}</script>
{"".join(scripts)}
<script>{_JS}</script>
</body></html>
"""


def write_report(snapshots: list[dict[str, Any]], path: str | os.PathLike[str],
                 sources: list[str | None] | None = None) -> Path:
    """Render and write the report atomically; returns its path."""
    from fastgen.utils.io import atomic_write_text

    path = Path(path)
    atomic_write_text(path, render_report(snapshots, sources))
    return path
