"""The snapshot format, the safe loaders and the analysis, on snapshots whose every number is worked out by hand."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import pytest

from fastgen.profiling.analysis import analyse, site_label
from fastgen.profiling.report import fmt_bytes, render_report
from fastgen.profiling.snapshot import (
    load_any,
    load_cuda_pickle,
    load_snapshot,
    new_snapshot,
    save_snapshot,
    snapshot_from_cuda,
)
from fastgen.utils.errors import UsageError

SITES = [
    {"file": "fastgen/networks/mlp.py", "line": 40, "function": "forward", "op": "aten::linear", "module": "Linear_0", "via": ""},
    {"file": "fastgen/methods/sft.py", "line": 26, "function": "single_train_step", "op": "aten::mul", "module": "", "via": ""},
    {"file": "fastgen/trainer.py", "line": 322, "function": "_train", "op": "AddmmBackward0", "module": "", "via": ""},
    {"file": "fastgen/trainer.py", "line": 322, "function": "_train", "op": "", "module": "",
     "via": "torch/optim/adam.py:139 _init_group"},
]


def hand_snapshot() -> dict:
    """One iteration, every category once. Times in ns; the running total is written beside each event."""
    snap = new_snapshot(backend="cpu_profiler", device="cpu")
    snap["sites"] = SITES
    snap["initial"] = [[0x1000, 1000, -1]]  # a parameter                                            start: 1000 + 300
    snap["events"] = [
        [110, 0x2000, 500, 0],   # forward output, alive when backward begins: activation                   1800
        [120, 0x2800, 64, 1],    # a forward temporary, freed before backward: other                         1864
        [150, 0x2800, -64, -1],  #                                                                           1800
        [250, 0x3000, 1000, 2],  # the gradient                                                              2800
        [260, 0x2000, -500, -1],  #                                                                          2300
        [350, 0x4000, 2000, 3],  # Adam's state                                                   peak:      4300
        [360, 0x3000, -1000, -1],  # zero_grad                                                               3300
        [450, 0x5000, 100, 1],   # something a callback keeps: other                                         3400
        [460, 0x9000, -300, -1],  # a block from before the window, freed now: counted from the start        3100
    ]
    snap["markers"] = [[0, "data", 0, 0], [100, "forward", 0, 0], [200, "backward", 0, 0], [300, "optimizer", 0, 0],
                       [400, "callbacks", 0, 0], [500, "end", 0, 0]]
    snap["roles"] = [[0, "parameters", 0x1000, 1000], [300, "parameters", 0x1000, 1000], [300, "gradients", 0x3000, 1000],
                     [400, "optimizer_state", 0x4000, 2000], [400, "parameters", 0x1000, 1000]]
    snap["estimate"] = {"parameters": 1000, "gradients": 1000, "optimizer_state": 2000, "total": 4000, "world_size": 1,
                        "sharded": False, "method": "by hand"}
    return snap


def test_analysis_of_a_hand_made_snapshot() -> None:
    a = analyse(hand_snapshot())
    assert a.start_bytes == 1300 and a.end_bytes == 3100
    assert a.peak_bytes == 4300 and a.peak_time == 350
    assert a.peak_phase is not None and (a.peak_phase.name, a.peak_phase.iteration) == ("optimizer", 0)
    assert a.peak_breakdown == {"parameters": 1000, "gradients": 1000, "optimizer_state": 2000, "activations": 0, "other": 300}
    assert a.max_by_category == {"parameters": 1000, "gradients": 1000, "optimizer_state": 2000, "activations": 500, "other": 400}
    by_label = {row.label: row for row in a.sites}
    adam = by_label["fastgen/trainer.py:322 _train \u00b7 torch/optim/adam.py:139 _init_group"]
    assert (adam.peak_bytes, adam.peak_blocks, adam.alloc_bytes, adam.alloc_count) == (2000, 1, 2000, 1)
    grads = by_label["fastgen/trainer.py:322 _train \u00b7 AddmmBackward0"]
    assert (grads.peak_bytes, grads.alloc_bytes, grads.categories) == (1000, 1000, {"gradients": 1000})
    forward = by_label["fastgen/networks/mlp.py:40 forward \u00b7 aten::linear"]
    assert (forward.peak_bytes, forward.alloc_bytes, forward.modules) == (0, 500, ["Linear_0"])
    mul = by_label["fastgen/methods/sft.py:26 single_train_step \u00b7 aten::mul"]
    assert (mul.alloc_bytes, mul.alloc_count) == (164, 2)
    assert a.sites[0].peak_bytes == 2000  # sorted by memory live at the peak
    assert [(p.name, p.start, p.end) for p in a.phases] == [
        ("data", 0, 100), ("forward", 100, 200), ("backward", 200, 300), ("optimizer", 300, 400), ("callbacks", 400, 500)]
    assert a.point_markers == [(500, "end", 0)]


def test_a_block_reused_at_the_same_address_gets_its_own_category() -> None:
    snap = hand_snapshot()
    # After zero_grad freed the gradient at 0x3000, a temporary takes the same address: it is not a gradient.
    snap["events"].insert(7, [370, 0x3000, 1000, 1])
    a = analyse(snap)
    reused = [b for b in a.blocks if b.ptr == 0x3000]
    assert [b.category for b in reused] == ["gradients", "other"]


def test_snapshot_round_trip_and_format_checks(tmp_path: Path) -> None:
    snap = hand_snapshot()
    path = save_snapshot(snap, tmp_path / "s_rank0.json.gz")
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # gzip
    assert load_snapshot(path) == json.loads(json.dumps(snap))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(snap))
    assert load_snapshot(plain)["events"] == snap["events"]
    (tmp_path / "other.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(UsageError, match="not a fastgen memory snapshot"):
        load_snapshot(tmp_path / "other.json")
    (tmp_path / "v9.json").write_text(json.dumps({**snap, "version": 9}))
    with pytest.raises(UsageError, match="version 9"):
        load_snapshot(tmp_path / "v9.json")
    (tmp_path / "broken.json.gz").write_bytes(gzip.compress(b"{not json"))
    with pytest.raises(UsageError, match="gzip JSON"):
        load_snapshot(tmp_path / "broken.json.gz")
    with pytest.raises(UsageError, match="not found"):
        load_snapshot(tmp_path / "missing.json.gz")


def cuda_raw(t0_us: int) -> dict:
    """A CUDA allocator snapshot in the layout of ``torch.cuda.memory._snapshot()`` (segments with blocks, and one
    trace per device, innermost frame first)."""
    torch_frame = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/functional.py", "line": 5, "name": "linear"}
    user_frame = {"filename": "/home/u/proj/fastgen/networks/mlp.py", "line": 42, "name": "forward"}
    return {
        "segments": [{
            "device": 0, "address": 0x10000, "total_size": 4096, "stream": 0, "segment_type": "small",
            "blocks": [
                {"address": 0x10000, "size": 1024, "requested_size": 1000, "state": "active_allocated", "frames": []},
                {"address": 0x10400, "size": 512, "requested_size": 512, "state": "active_allocated",
                 "frames": [torch_frame, user_frame]},
                {"address": 0x10600, "size": 2560, "requested_size": 0, "state": "inactive", "frames": []},
            ],
        }],
        "device_traces": [[
            {"action": "alloc", "addr": 0x10400, "size": 512, "stream": 0, "time_us": t0_us + 10,
             "frames": [torch_frame, user_frame]},
            {"action": "alloc", "addr": 0x20000, "size": 256, "stream": 0, "time_us": t0_us + 20, "frames": [user_frame]},
            {"action": "free_requested", "addr": 0x20000, "size": 256, "stream": 0, "time_us": t0_us + 30, "frames": []},
            {"action": "free_completed", "addr": 0x20000, "size": 256, "stream": 0, "time_us": t0_us + 31, "frames": []},
            {"action": "free_completed", "addr": 0x30000, "size": 128, "stream": 0, "time_us": t0_us + 40, "frames": []},
            {"action": "oom", "device_free": 0, "size": 1 << 30, "stream": 0, "time_us": t0_us + 50, "frames": []},
        ]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
        "external_annotations": [],
    }


def test_cuda_allocator_snapshot_is_converted_with_its_history(tmp_path: Path) -> None:
    t0_us = 1_700_000_000_000_000
    base = new_snapshot(backend="cuda_allocator", device="cuda:0", t0_ns=t0_us * 1000)
    base["markers"] = [[0, "data", 0, 0], [15_000, "forward", 0, 0]]
    raw_path = tmp_path / "memory_report_rank0.pickle"
    raw_path.write_bytes(pickle.dumps(cuda_raw(t0_us)))
    save_snapshot(base, tmp_path / "memory_report_rank0.json.gz")  # the sidecar with the hook times
    snap = load_any(raw_path)
    assert snap["raw"] == "memory_report_rank0.pickle"
    assert snap["initial"] == [[0x10000, 1024, -1]]  # still allocated, never seen allocated: from before the window
    assert [e[:3] for e in snap["events"]] == [[10_000, 0x10400, 512], [20_000, 0x20000, 256], [31_000, 0x20000, -256],
                                              [40_000, 0x30000, -128]]
    site = snap["sites"][snap["events"][0][3]]
    assert (site["file"], site["line"], site["function"]) == ("fastgen/networks/mlp.py", 42, "forward")  # not torch's frame
    assert [m[1] for m in snap["markers"]] == ["data", "forward", "oom"]
    a = analyse(snap)
    assert a.start_bytes == 1024 + 128 and a.peak_bytes == 1024 + 128 + 512 + 256
    assert a.point_markers == [(50_000, "oom", -1)]
    html = render_report([snap])
    assert "out of memory" in html


def test_cuda_pickle_loader_refuses_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # noqa: ANN204 - what a crafted pickle does: call a function on load
            return (os.system, (f"touch {marker}",))

    bad = tmp_path / "evil.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "device_traces": [Evil()]}))
    with pytest.raises(UsageError, match=r"it names \w+\.system"):
        load_cuda_pickle(bad)
    assert not marker.exists()
    good = tmp_path / "good.pickle"
    good.write_bytes(pickle.dumps(cuda_raw(0)))
    assert load_cuda_pickle(good)["segments"][0]["total_size"] == 4096
    alone = snapshot_from_cuda(load_cuda_pickle(good))  # no sidecar: memory without phases
    assert alone["markers"] == [[50_000 - 10_000, "oom", -1, 0]] and analyse(alone).peak_bytes == 1920


def test_report_numbers_and_escaping() -> None:
    snap = hand_snapshot()
    snap["config"] = {"run": "p/g/<script>alert(1)</script>"}
    html = render_report([snap], ["s_rank0.json.gz"])
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html
    assert 'data-peak-bytes="4300"' in html
    assert f'data-bytes="4300">{fmt_bytes(4300)}' in html
    assert 'data-category="optimizer_state"' in html and 'id="timeline-0"' in html
    assert site_label(SITES[0]) in html
    assert "http://" not in html and "https://" not in html
