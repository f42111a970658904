"""Peak memory of ``fastgen convert-ckpt`` against the size of the network it converts.

    .venv/bin/python benchmarks/convert_ckpt_memory.py [--recipe EDM/config_sft_cifar10] [--piece-mb 64]
        [--keep DIR] [--json PATH]

What runs
---------
A checkpoint of the recipe's network (``EDM/config_sft_cifar10``: the 55M-parameter EDM U-Net, 220 MB in float32)
with random weights, as the checkpoint manager lays it out: ``net``, an ``ema`` copy, and Adam's state for ``net``
(``exp_avg``, ``exp_avg_sq``, ``step``), written once with ``torch.save`` (about 4.0x the network's bytes). Then
each conversion runs in a fresh Python process (``fastgen.checkpoint.convert.convert_checkpoint``, as the command calls
it) that imports everything first, reads its resident set size (``VmRSS``), converts, and reports
``ru_maxrss``. The **growth** is ``ru_maxrss`` minus that baseline: the most memory the conversion itself held,
file-backed pages of ``mmap`` included (they count in RSS while mapped).

**Ratio** = growth / the bytes of one network (the converted module; for a whole-checkpoint conversion the
largest network). Goal: <= 1.3. For reference the same table has the direct way - ``load_checkpoint`` then
``torch.save`` of the whole payload or of one network (what ``scripts/export_teacher.py`` did) - in the same kind
of process.

Conversions: ``--only ema`` to ``.pth`` and ``.safetensors``, the whole checkpoint to DCP and back, and the
sharded checkpoint's EMA to ``.pth`` with ``--dtype bfloat16``. Timings are noisy on a shared machine and are
not the point; memory does not depend on load.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = textwrap.dedent("""
    import json, os, resource, sys, time, warnings
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(1)
    import torch.distributed.checkpoint, safetensors.torch  # noqa: F401 - imported before the baseline
    from fastgen.checkpoint import convert
    from fastgen.checkpoint.checkpointer import load_checkpoint
    from fastgen.utils.io import atomic_write_with

    def rss_kib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

    mode, src, dst, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    baseline = rss_kib()
    start = time.perf_counter()
    if mode == "convert":
        convert.convert_checkpoint(src, dst, **options)
    elif mode == "direct":  # load everything, save what is asked
        payload = load_checkpoint(src)
        only = options.get("only")
        out = {"format": payload["format"], "model": {"net": payload["model"][only]}} if only else payload
        atomic_write_with(__import__("pathlib").Path(dst), lambda f: torch.save(out, f))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"baseline_kib": baseline, "peak_kib": peak, "seconds": seconds}))
""")


def build_checkpoint(recipe: str, path: Path) -> int:
    """Write the benchmark checkpoint (in its own process, so the measured ones start clean); return the bytes of
    one network."""
    script = textwrap.dedent(f"""
        import torch
        torch.set_num_threads(1)
        from fastgen.configs.config_utils import load_config
        from fastgen.configs.instantiate import instantiate
        from fastgen.checkpoint.checkpointer import FORMAT
        torch.manual_seed(0)
        config = load_config({recipe!r})
        net = instantiate(config.model.net)
        state = {{k: v.detach().clone() for k, v in net.state_dict().items()}}
        del net
        ema = {{k: v + 0.01 if v.is_floating_point() else v.clone() for k, v in state.items()}}
        params = [k for k, v in state.items() if v.is_floating_point()]
        adam = {{"state": {{k: {{"step": torch.tensor(10.0), "exp_avg": torch.randn_like(state[k]),
                                 "exp_avg_sq": torch.rand_like(state[k])}} for k in params}},
                 "param_groups": [{{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                                    "params": params}}]}}
        payload = {{"format": FORMAT, "version": 3, "iteration": 1000, "layout": "monolithic", "world_size": 1,
                   "model": {{"net": state, "ema": ema}}, "optimizers": {{"net": adam}}, "schedulers": {{}},
                   "rng": {{0: {{"torch": torch.get_rng_state()}}}}, "callbacks": {{}}, "dataloaders": {{}}}}
        torch.save(payload, {str(path)!r})
        print(sum(v.numel() * v.element_size() for v in state.values()))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    return int(result.stdout.strip().splitlines()[-1])


def measure(mode: str, src: Path, dst: Path, options: dict) -> dict:
    result = subprocess.run([sys.executable, "-c", MEASURE, mode, str(src), str(dst), json.dumps(options)],
                            capture_output=True, text=True, cwd=ROOT, check=False,
                            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    if result.returncode != 0:
        raise SystemExit(f"{mode} {src} -> {dst} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="EDM/config_sft_cifar10")
    parser.add_argument("--piece-mb", type=int, default=64)
    parser.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temporary one)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fastgen-convert-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        source = work / "0001000.pth"
        module_bytes = build_checkpoint(args.recipe, source)
        piece = {"piece_bytes": args.piece_mb << 20}
        sharded = work / "sharded.dcp"
        cases = [
            ("convert", "pth --only ema -> pth", source, work / "ema.pth", {"only": "ema", **piece}),
            ("convert", "pth --only ema -> safetensors", source, work / "ema.safetensors", {"only": "ema", **piece}),
            ("convert", "pth (all) -> dcp", source, sharded, piece),
            ("convert", "dcp (all) -> pth", sharded, work / "from_dcp.pth", piece),
            ("convert", "dcp --only ema --dtype bfloat16 -> pth", sharded, work / "ema_bf16.pth",
             {"only": "ema", "dtype": "bfloat16", **piece}),
            ("direct", "reference: load_checkpoint + torch.save (ema)", source, work / "direct_ema.pth", {"only": "ema"}),
            ("direct", "reference: load_checkpoint + torch.save (all)", source, work / "direct_all.pth", {}),
        ]
        rows = []
        print(f"{args.recipe}: one network = {module_bytes / 2**20:.1f} MiB; checkpoint = "
              f"{source.stat().st_size / 2**20:.1f} MiB; pieces of {args.piece_mb} MiB")
        print(f"{'conversion':48s} {'growth MiB':>11s} {'ratio':>6s} {'s':>6s}")
        for mode, name, src, dst, options in cases:
            figures = measure(mode, src, dst, options)
            growth = (figures["peak_kib"] - figures["baseline_kib"]) * 1024
            row = {"conversion": name, "growth_bytes": growth, "module_bytes": module_bytes,
                   "ratio": growth / module_bytes, "seconds": figures["seconds"]}
            rows.append(row)
            print(f"{name:48s} {growth / 2**20:11.1f} {row['ratio']:6.2f} {figures['seconds']:6.1f}", flush=True)
            if dst != sharded and dst.exists():
                dst.unlink()
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
