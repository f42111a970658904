"""The DMD2 digits study (docs/experiments/dmd2-digits.md): score every checkpoint of a run, plot FD against
iterations, draw the teacher-vs-student sample grid.

Why a script: the report's plot and grid must be reproducible from the run directories alone. ``score`` appends
one CSV row per (run, checkpoint, network, sampling seed) and skips rows already there, so it can be re-run after
a run has written more checkpoints; ``plot`` and ``grid`` only read. Scores are exactly ``fastgen eval``'s on the
``.npz`` that ``fastgen sample`` would write for the same checkpoint, network, count and seed (both go through
``fastgen.evaluation.evaluate_model``): FD is the Frechet distance (Heusel et al. 2017, Eq. 6) between Gaussians
fitted to the shipped digits classifier's 64-d features of the samples and of the 1,797 real digits.

    # train (checkpoints every 100 / 1,000 iterations), then score and draw:
    fastgen train --eval-samples 0 - trainer.save_ckpt_iter=100 log_config.name=study_quick
    fastgen train --config Digits/config_dmd2_digits_long - trainer.save_ckpt_iter=1000 log_config.name=study_long
    python benchmarks/dmd2_digits_study.py score --csv docs/experiments/dmd2-digits.csv --teacher \\
        --run quick-start FASTGEN_OUTPUT/fastgen/digits/study_quick \\
        --run long FASTGEN_OUTPUT/fastgen/digits/study_long
    python benchmarks/dmd2_digits_study.py plot --csv docs/experiments/dmd2-digits.csv \\
        --out docs/experiments/dmd2-digits-fd.png
    python benchmarks/dmd2_digits_study.py grid FASTGEN_OUTPUT/fastgen/digits/study_quick \\
        FASTGEN_OUTPUT/fastgen/digits/study_long --out docs/experiments/dmd2-digits-grid.png

Needs matplotlib for ``plot`` and ``grid`` (``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path
from typing import Any

FIELDS = ("run", "iteration", "net", "seed", "num_samples", "steps", "fd_digits", "accuracy", "min_per_class",
          "max_per_class", "seconds")
REAL = "real digits"  # the run name of the finite-sample floor's rows
TEACHER_STEPS = 18  # Heun: 2 * 18 - 1 = 35 network evaluations per sample (EDM's sampler, Karras et al. 2022)
SEPARATOR = 110  # grey lines between the 8x8 images of the grid (white would merge with the strokes)


# ------------------------------------------------------------------------------------------------------ score
def _read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _append_row(path: Path, row: dict[str, Any]) -> None:
    new = not path.is_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerow(row)


def _score(model: Any, net: Any, n: int, seed: int, steps: int | None) -> dict[str, Any]:
    """``evaluate_model``'s metrics plus the per-class sample counts (balanced labels: ``n / 10`` each)."""
    import numpy as np

    from fastgen.evaluation import draw_samples, evaluate_arrays
    from fastgen.evaluation.sampling import sample_arrays

    samples, labels = draw_samples(model, n, seed=seed, net=net, steps=steps)
    arrays = sample_arrays(samples, labels)
    metrics = evaluate_arrays(arrays["arr_0"], arrays["arr_1"], "digits")
    counts = np.bincount(arrays["arr_1"], minlength=10)
    return {**metrics, "min_per_class": int(counts.min()), "max_per_class": int(counts.max())}


def score(args: argparse.Namespace) -> None:
    import torch

    from fastgen.evaluation import load_run, select_net
    from fastgen.checkpoint.checkpointer import Checkpointer

    torch.set_num_threads(args.threads)
    done = {(r["run"], r["iteration"], r["net"], r["seed"], r["num_samples"]) for r in _read_rows(args.csv)}

    def record(run: str, iteration: int, net_name: str, seed: int, model: Any, net: Any, steps: int | None) -> None:
        key = (run, str(iteration), net_name, str(seed), str(args.num_samples))
        if key in done:
            return
        start = time.perf_counter()
        metrics = _score(model, net, args.num_samples, seed, steps)
        row = {"run": run, "iteration": iteration, "net": net_name, "seed": seed, "num_samples": args.num_samples,
               "steps": steps if steps is not None else 1, "fd_digits": f"{metrics['fd_digits']:.4f}",
               "accuracy": f"{metrics['accuracy']:.4f}", "min_per_class": metrics["min_per_class"],
               "max_per_class": metrics["max_per_class"], "seconds": f"{time.perf_counter() - start:.1f}"}
        _append_row(args.csv, row)
        done.add(key)
        print(",".join(str(row[f]) for f in FIELDS), flush=True)

    teacher_done = not args.teacher
    for label, run_dir in args.run:
        run_dir = Path(run_dir)
        found = Checkpointer(str((run_dir / "checkpoints").resolve()), run_dir).list()
        if not found:
            sys.exit(f"no checkpoints in {run_dir / 'checkpoints'}")
        checkpoints = found if args.every else found[-1:]
        for iteration, path in checkpoints:
            wanted = [(net, seed) for net in args.nets for seed in args.seeds
                      if (label, str(iteration), net, str(seed), str(args.num_samples)) not in done]
            if not wanted and teacher_done:
                continue
            run = load_run(path)
            for net_name, seed in wanted:
                record(label, iteration, net_name, seed, run.model, select_net(run, net_name), None)
            if not teacher_done:  # the teacher is the same in every run: score it once, from the first one
                for seed in args.seeds:
                    record("teacher", 0, "teacher", seed, run.model, select_net(run, "teacher"), TEACHER_STEPS)
                teacher_done = True


def floor(args: argparse.Namespace) -> None:
    """FD's finite-sample floor: ``n`` real digits drawn with replacement (``n / 10`` from each class) scored
    against the statistics of all 1,797. A model that scores inside this range matches the data as well as a
    resample of the data does."""
    import numpy as np
    import torch

    from fastgen.datasets.digits import load_digits_tensors
    from fastgen.evaluation.digits import frechet_distance_digits, quantize

    images, labels = load_digits_tensors()
    images, labels = quantize(images), torch.as_tensor(labels).long()
    done = {(r["run"], r["seed"], r["num_samples"]) for r in _read_rows(args.csv)}
    for seed in args.seeds:
        if (REAL, str(seed), str(args.num_samples)) in done:
            continue
        start, rng = time.perf_counter(), np.random.default_rng(seed)
        per_class = args.num_samples // 10
        chosen = np.concatenate([rng.choice(np.flatnonzero(labels.numpy() == c), per_class) for c in range(10)])
        metrics = frechet_distance_digits(images[chosen], labels[chosen])
        row = {"run": REAL, "iteration": 0, "net": "resample", "seed": seed, "num_samples": len(chosen), "steps": 0,
               "fd_digits": f"{metrics['fd_digits']:.4f}", "accuracy": f"{metrics['accuracy']:.4f}",
               "min_per_class": per_class, "max_per_class": per_class,
               "seconds": f"{time.perf_counter() - start:.1f}"}
        _append_row(args.csv, row)
        print(",".join(str(row[f]) for f in FIELDS), flush=True)


# ------------------------------------------------------------------------------------------------------- plot
def plot(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = [r for r in _read_rows(args.csv) if int(r["num_samples"]) == args.num_samples]
    rows = [r for r in every if int(r["seed"]) == args.seed]
    teacher = [float(r["fd_digits"]) for r in rows if r["net"] == "teacher"]
    resamples = [float(r["fd_digits"]) for r in every if r["run"] == REAL]
    runs = [label for label in dict.fromkeys(r["run"] for r in rows) if label not in ("teacher", REAL)]
    if not runs:
        sys.exit(f"no student rows with seed {args.seed} and {args.num_samples} samples in {args.csv}")
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for color, label in zip(colors, runs):
        for net, style, name in (("ema", "-o", "EMA"), ("net", ":", "raw")):
            points = sorted((int(r["iteration"]), float(r["fd_digits"])) for r in rows
                            if r["run"] == label and r["net"] == net)
            if points:
                ax.plot(*zip(*points), style, color=color, markersize=3.5, alpha=1.0 if net == "ema" else 0.55,
                        label=f"{label}, {name} student (1 evaluation)")
    if teacher:
        ax.axhline(teacher[0], color="black", linestyle="--", linewidth=1.2,
                   label=f"teacher, Heun 18 steps (35 evaluations): {teacher[0]:.2f}")
    if len(resamples) > 1:
        ax.axhspan(min(resamples), max(resamples), color="gray", alpha=0.18, linewidth=0,
                   label=f"real digits resampled, {args.num_samples // 10} per class ({len(resamples)} draws): "
                         f"{min(resamples):.2f}-{max(resamples):.2f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training iteration (log scale)")
    ax.set_ylabel(f"FD (digits), {args.num_samples:,} samples, seed {args.seed} (log scale)")
    ax.set_title(args.title)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: f"{v:g}" if round(v / 10 ** math.floor(math.log10(v))) in (2, 3, 5) else ""))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: f"{v:,.0f}" if round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""))
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")


# ------------------------------------------------------------------------------------------------------- grid
def grid(args: argparse.Namespace) -> None:
    """The teacher (35 evaluations) beside each run's 1-step EMA student: the same starting noise and labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from fastgen.evaluation import draw_samples, load_run, select_net
    from fastgen.utils.images import to_uint8

    torch.set_num_threads(args.threads)
    panels = []
    runs = [load_run(path) for path in args.runs]
    teacher, labels = draw_samples(runs[0].model, 100, seed=args.seed, net=select_net(runs[0], "teacher"),
                                   steps=TEACHER_STEPS)
    panels.append(("teacher: Heun, 35 evaluations", teacher))
    for run, name in zip(runs, args.names or [Path(p).name for p in args.runs]):
        samples, student_labels = draw_samples(run.model, 100, seed=args.seed, net=select_net(run, "ema"))
        assert torch.equal(labels, student_labels)
        panels.append((f"{name}: 1 evaluation (iteration {run.iteration:,})", samples))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.95), dpi=110)
    for ax, (title, samples) in zip(axes, panels):
        images = to_uint8(samples).numpy()[..., 0]  # (100, 8, 8); sample i has label i % 10
        padded = np.pad(images.reshape(10, 10, 8, 8), ((0, 0), (0, 0), (1, 0), (1, 0)), constant_values=SEPARATOR)
        mosaic = np.pad(padded.transpose(0, 2, 1, 3).reshape(90, 90), ((0, 1), (0, 1)), constant_values=SEPARATOR)
        ax.imshow(mosaic, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xticks([1 + c * 9 + 3.5 for c in range(10)], [str(c) for c in range(10)], fontsize=7)
        ax.set_yticks([])
        ax.tick_params(length=0)
    fig.suptitle(f"same starting noise and labels (sampling seed {args.seed}); each column one class", fontsize=9)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")


# -------------------------------------------------------------------------------------------------------- cli
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("score", help="score checkpoints of runs into a CSV (skips rows already there)")
    p.add_argument("--csv", type=Path, required=True)
    p.add_argument("--run", nargs=2, action="append", metavar=("LABEL", "RUN_DIR"), required=True)
    p.add_argument("--nets", nargs="+", default=["ema", "net"], choices=["ema", "net"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("-n", "--num-samples", type=int, default=5000)
    p.add_argument("--last", dest="every", action="store_false", help="only the newest checkpoint of each run")
    p.add_argument("--teacher", action="store_true", help="also score the teacher (Heun, 18 steps) at each seed")
    p.add_argument("--threads", type=int, default=1)
    p.set_defaults(func=score)

    p = sub.add_parser("floor", help="FD of real digits resampled with replacement (the metric's floor)")
    p.add_argument("--csv", type=Path, required=True)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4, 5])
    p.add_argument("-n", "--num-samples", type=int, default=5000)
    p.set_defaults(func=floor)

    p = sub.add_parser("plot", help="FD against iterations, one line per run, the teacher as a horizontal line")
    p.add_argument("--csv", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-n", "--num-samples", type=int, default=5000)
    p.add_argument("--title", default="DMD2 on digits: 1-step students against their 35-evaluation teacher")
    p.set_defaults(func=plot)

    p = sub.add_parser("grid", help="teacher vs 1-step EMA students, same noise and labels")
    p.add_argument("runs", nargs="+", help="run directories or checkpoints (the teacher comes from the first)")
    p.add_argument("--names", nargs="+", help="a title per run (default: the folder names)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.set_defaults(func=grid)

    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
