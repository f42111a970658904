"""``fastgen profile-memory`` as a user runs it: a real CPU profile of a small recipe, the HTML report checked
against the raw snapshot, re-rendering, a headless Chromium screenshot, usage errors, and the dryrun estimate."""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fastgen_testing import run_cli

from fastgen.profiling.analysis import site_label
from fastgen.profiling.report import CATEGORY_COLORS, PLOT_BACKGROUND, fmt_bytes
from fastgen.profiling.snapshot import CATEGORIES, load_snapshot

SMALL = ["dataloader_train.batch_size=64", "model.net.backbone.hidden_dim=16", "trainer.validation_iter=null"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real `fastgen profile-memory` run of the toy recipe on CPU, shared by the tests of this module."""
    root = tmp_path_factory.mktemp("profile_memory")
    report = root / "mem" / "report.html"
    result = run_cli("profile-memory", "--config=Toy/config_sft_toy", "--iters", "2", "--out", str(report), "-", *SMALL,
                     cwd=root, env={"FASTGEN_OUTPUT_ROOT": str(root / "out"), "WANDB_MODE": "disabled",
                                    "FASTGEN_NO_PROGRESS": "1"})
    assert result.returncode == 0, result.stderr
    return {"root": root, "report": report, "snapshot": root / "mem" / "report_rank0.json.gz", "result": result}


def raw_peak(snapshot: dict[str, Any]) -> int:
    """The peak straight from the raw events: blocks alive at the start, then the running sum."""
    allocated: set[int] = set()
    baseline = sum(size for _, size, _ in snapshot["initial"])
    for _, ptr, size, _ in snapshot["events"]:  # a free of a block never seen allocated was alive from the start
        if size > 0:
            allocated.add(ptr)
        elif ptr in allocated:
            allocated.discard(ptr)
        else:
            baseline += -size
    total = peak = baseline
    for _, _, size, _ in snapshot["events"]:
        total += size
        peak = max(peak, total)
    return peak


def site_rows(page: str) -> dict[str, tuple[int, int, int, int]]:
    rows = {}
    pattern = re.compile(r'<tr class="site" data-site="([^"]*)">.*?data-bytes="(\d+)".*?data-count="(\d+)".*?'
                         r'data-bytes="(\d+)".*?data-count="(\d+)"', re.S)
    for match in pattern.finditer(page):
        rows[html_lib.unescape(match[1])] = tuple(int(match[i]) for i in range(2, 6))
    return rows


def test_report_is_self_contained_and_agrees_with_the_raw_snapshot(profiled: dict[str, Any]) -> None:
    page = profiled["report"].read_text()
    snapshot = load_snapshot(profiled["snapshot"])
    # Works offline: no network references of any kind, everything inline.
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"""\b(src|href)\s*=|<link\b|@import|url\(""", page)
    assert page.count("<svg") >= 2 and "<script>" in page and "<style>" in page
    # The timeline with its phases, the categories, the top sites, the config summary.
    assert '<svg class="timeline" id="timeline-0"' in page
    for phase in ("forward", "backward", "optimizer", "callbacks"):
        assert f'class="phase phase-{phase}"' in page
    for category in ("parameters", "gradients", "optimizer_state", "activations"):
        assert f'class="area area-{category}"' in page and f'data-category="{category}"' in page
    assert '<table class="sites">' in page and "fastgen/toy/config_sft_toy_memory" in page
    # Numbers agree with the raw file.
    peak = raw_peak(snapshot)
    assert f'data-peak-bytes="{peak}"' in page
    assert f'<div class="v" data-bytes="{peak}">{fmt_bytes(peak)}</div>' in page
    at_peak = {c: int(re.search(rf'data-category="{c}">.*?data-bytes="(\d+)"', page, re.S)[1]) for c in CATEGORIES}
    assert sum(at_peak.values()) == peak
    # The window starts at iteration 0: what existed before it is exactly the model's parameters and buffers.
    assert at_peak["parameters"] == sum(size for _, size, _ in snapshot["initial"]) == snapshot["estimate"]["parameters"]
    for key in ("gradients", "optimizer_state"):
        assert re.search(rf'data-category="{key}">(?:.*?data-bytes="\d+"){{2}}.*?data-bytes="{snapshot["estimate"][key]}"',
                         page, re.S), key
    # Each site row's "allocated in window" is the sum of the raw allocation events at that site.
    expected: dict[str, list[int]] = {}
    for _, _, size, site in snapshot["events"]:
        if size > 0:
            label = site_label(snapshot["sites"][site]) if site >= 0 else "(unknown site)"
            expected.setdefault(label, [0, 0])
            expected[label][0] += size
            expected[label][1] += 1
    rows = site_rows(page)
    assert len(rows) >= 10
    for label, (_, _, alloc_bytes, alloc_count) in rows.items():
        if not label.startswith("(allocated before the window"):
            assert [alloc_bytes, alloc_count] == expected[label], label
    # The terminal summary: the peak, the tables, the path to open.
    out = profiled["result"].stdout
    assert f"peak {fmt_bytes(peak)}" in out and "peak by category" in out and "largest allocation sites" in out
    assert profiled["report"].resolve().as_uri() in out


def test_report_subcommand_rerenders_the_same_report(profiled: dict[str, Any], tmp_path: Path) -> None:
    again = tmp_path / "again.html"
    result = run_cli("profile-memory", "report", str(profiled["snapshot"]), "--out", str(again))
    assert result.returncode == 0, result.stderr
    original, rerendered = profiled["report"].read_text(), again.read_text()
    peak = re.search(r'data-peak-bytes="(\d+)"', original)[1]
    assert f'data-peak-bytes="{peak}"' in rerendered
    assert site_rows(rerendered) == site_rows(original)
    # A folder works too; the report goes beside the snapshots.
    folder = tmp_path / "copy"
    folder.mkdir()
    shutil.copy(profiled["snapshot"], folder / "report_rank0.json.gz")
    result = run_cli("profile-memory", "report", str(folder))
    assert result.returncode == 0, result.stderr
    assert site_rows((folder / "report.html").read_text()) == site_rows(original)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _rgb(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def test_report_renders_in_headless_chromium(profiled: dict[str, Any], tmp_path: Path) -> None:
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no Chromium on this machine: .ci/run installs Debian's `chromium` package, which could not be "
                    "installed here, so the report cannot be opened in a browser")
    from PIL import Image

    shot = tmp_path / "report.png"
    # Every request except to loopback goes to a closed local port: the page must render from the file alone.
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--proxy-server=127.0.0.1:9",
         "--proxy-bypass-list=<-loopback>", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
         "--window-size=1200,900", profiled["report"].resolve().as_uri()],
        capture_output=True, text=True, timeout=120, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert shot.is_file(), result.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    pixels = image.load()
    width, height = image.size
    background = _rgb(PLOT_BACKGROUND)
    inside = [(x, y) for y in range(height) for x in range(width) if pixels[x, y] == background]
    assert len(inside) > 1000, "the plot area is not on the screenshot"
    left, right = min(x for x, _ in inside), max(x for x, _ in inside)
    top, bottom = min(y for _, y in inside), max(y for _, y in inside)
    assert right - left > 600 and bottom - top > 150  # the timeline at its full size
    colors = {_rgb(c): name for name, c in CATEGORY_COLORS.items()}
    drawn = Counter(colors[pixels[x, y]] for y in range(top, bottom + 1) for x in range(left, right + 1)
                    if pixels[x, y] in colors)
    area = (right - left + 1) * (bottom - top + 1)
    assert sum(drawn.values()) > 0.1 * area, drawn  # the plot is not blank: stacked areas fill it
    assert drawn["parameters"] > 0.02 * area and drawn["activations"] > 0 and len(drawn) >= 3, drawn


def _one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_usage_errors_are_one_line_exit_2(tmp_path: Path, output_root: Path) -> None:
    _one_line_error(run_cli("profile-memory", "--iters", "0", cwd=tmp_path), "--iters must be at least 1")
    _one_line_error(run_cli("profile-memory", "--out", "r.txt", cwd=tmp_path), "--out must name an .html file")
    _one_line_error(run_cli("profile-memory", "-c", "Toy/config_sft_toy", "trainer.max_itr=3", cwd=tmp_path),
                    "unknown key 'trainer.max_itr'")
    _one_line_error(run_cli("profile-memory", "report", cwd=tmp_path), "give the snapshot to render")
    _one_line_error(run_cli("profile-memory", "report", "missing_rank0.json.gz", cwd=tmp_path), "not found")
    (tmp_path / "x.json.gz").write_text("not a snapshot")
    _one_line_error(run_cli("profile-memory", "report", "x.json.gz", cwd=tmp_path), "not a fastgen memory snapshot")
    assert not any(output_root.rglob("*"))


def test_help_shows_both_forms_with_examples() -> None:
    main = run_cli("profile-memory", "--help")
    assert main.returncode == 0
    assert "Usage: fastgen profile-memory [OPTIONS]" in main.stdout and "Examples" in main.stdout
    assert "fastgen profile-memory report" in main.stdout and "--iters" in main.stdout
    report = run_cli("profile-memory", "report", "--help")
    assert report.returncode == 0
    assert "Usage: fastgen profile-memory report" in report.stdout and "Examples" in report.stdout
    assert "profile-memory" in run_cli("--help").stdout


def test_dryrun_prints_the_per_rank_memory_estimate() -> None:
    from fastgen.cli.dryrun import memory_table
    from rich.console import Console

    from fastgen.configs.config_utils import load_config
    from fastgen.profiling.estimate import build_meta_model
    from fastgen.profiling.plan import estimate_memory

    config = load_config("Toy/config_sft_toy")
    estimate = estimate_memory(config)
    result = run_cli("dryrun", "-c", "Toy/config_sft_toy", "--world-size", "4", "-", "trainer.ddp=True")
    assert result.returncode == 0, result.stderr
    assert "memory per rank (plan: replicated on 4 ranks (DDP))" in result.stdout
    for key in ("parameters", "gradients", "optimizer_state", "total"):
        assert f"{estimate[key]:,}" in result.stdout, key
    config.trainer.fsdp = True
    console = Console(record=True, width=200)
    console.print(memory_table(config, build_meta_model(config), world_size=4)[0])
    text = console.export_text()
    from fastgen.profiling.plan import plan_state

    assert "sharded over 4 ranks" in text and f"{plan_state(config, 4).busiest.parameters:,}" in text
    json.dumps(estimate)  # plain data: it goes into the snapshot as is
