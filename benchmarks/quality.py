"""Sample quality of every distillation method on digits, measured in one run.

For each digits recipe it trains the recipe from scratch (``fastgen train --config Digits/config_<m>_digits``,
wall time measured around the whole command, single process), then scores 5,000 samples of the student with
``fastgen.evaluation`` (Frechet distance in the shipped digits classifier's feature space, and that classifier's
accuracy on the conditioning labels) and counts the student's network evaluations per sample. The shipped
teacher is scored once with 18 Heun steps (35 evaluations), and at 1-13 steps: the column "teacher evaluations at
equal FD" is the fewest evaluations at which the teacher is as good as the student (what the student saves). Prints a markdown table; ``--write`` also writes it
into docs/experiments/digits-quality.md between the ``quality-table`` markers.

    .venv/bin/python benchmarks/quality.py                       # every method (~35 min on 2 CPU cores)
    .venv/bin/python benchmarks/quality.py --methods dmd2 kd     # a subset
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["dmd2", "sid", "f_distill", "ladd", "kd", "cm", "scm", "tcm", "meanflow", "sft"]
BEGIN, END = "<!-- quality-table:begin -->", "<!-- quality-table:end -->"


def count_evaluations(model, net) -> int:  # noqa: ANN001
    """Network evaluations to draw one batch (per sample), counted with a forward hook."""
    from fastgen.evaluation.sampling import draw_samples

    calls = []
    handle = net.register_forward_hook(lambda *args: calls.append(1))
    try:
        draw_samples(model, 2, seed=0, net=net)
    finally:
        handle.remove()
    return len(calls)


# Two-step sampling times of the methods that define them (network time; CM's two steps, Song et al. 2023, Sec. 6;
# sCM's intermediate TrigFlow time 1.1, Lu & Song 2024, Sec. 5, is sigma = 0.5 tan(1.1) = 0.98; MeanFlow's uniform
# steps, Geng et al. 2025, Sec. 5). Training does not read t_list for these methods, so the 1-step run is scored again.
TWO_STEP = {"cm": [80.0, 0.8], "scm": [80.0, 0.98], "tcm": [80.0, 0.8], "meanflow": [1.0, 0.5]}


def score(run_dir: Path, n: int, teacher: bool = False, t_list: list[float] | None = None) -> dict:
    from fastgen.evaluation.evaluate import evaluate_model
    from fastgen.evaluation.sampling import load_run

    run = load_run(run_dir)
    model = run.model
    if t_list is not None:
        model.config.t_list = list(t_list)
    if teacher and getattr(model, "teacher", None) is None:
        raise AttributeError("this run keeps no teacher (e.g. consistency training)")
    net = model.teacher if teacher else model.sampling_net()
    steps = model.config.sample_steps if teacher else None
    metrics = evaluate_model(model, n, seed=0, steps=steps, net=net, dataset="digits")
    if teacher:
        metrics["evaluations"] = 2 * model.config.sample_steps - 1
    else:
        metrics["evaluations"] = count_evaluations(model, net)
    return metrics


TEACHER_STEPS = [1, 2, 3, 4, 5, 6, 8, 10, 13, 18]  # Heun steps: 2 s - 1 network evaluations per sample


def teacher_curve(run_dir: Path, n: int) -> list[tuple[int, float]]:
    """The teacher's FD at each of ``TEACHER_STEPS`` (``(evaluations, fd)``, same samples count and seed)."""
    from fastgen.evaluation.evaluate import evaluate_model
    from fastgen.evaluation.sampling import load_run

    model = load_run(run_dir).model
    curve = []
    for steps in TEACHER_STEPS:
        metrics = evaluate_model(model, n, seed=0, steps=steps, net=model.teacher, dataset="digits")
        curve.append((2 * steps - 1, metrics["fd_digits"]))
        print(f"teacher {steps} Heun steps ({2 * steps - 1} evaluations): FD {metrics['fd_digits']:.3f}", flush=True)
    return curve


def evaluations_at_equal_quality(curve: list[tuple[int, float]], fd: float) -> str:
    """The fewest teacher evaluations per sample whose FD is at most the student's ``fd`` ("> N" if none)."""
    for evaluations, teacher_fd in curve:
        if teacher_fd <= fd:
            return str(evaluations)
    return f"> {curve[-1][0]}"


def train(method: str, root: Path, extra: list[str]) -> tuple[Path, float]:
    recipe = f"Digits/config_{method}_digits"
    env = {**os.environ, "FASTGEN_OUTPUT_ROOT": str(root), "WANDB_MODE": "disabled", "FASTGEN_NO_PROGRESS": "1"}
    cmd = [str(Path(sys.executable).parent / "fastgen"), "train", "--config", recipe, "--eval-samples", "0", "-",
           f"log_config.name=bench_{method}", "trainer.resume=false", *extra]
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{recipe} failed:\n{result.stderr[-3000:]}")
    run_dir = next(root.glob(f"*/*/bench_{method}"))
    return run_dir, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--write", action="store_true", help="write the table into docs/experiments/digits-quality.md")
    parser.add_argument("--json", default=None)
    parser.add_argument("--override", nargs="*", default=[], help="overrides applied to every recipe")
    parser.add_argument("--skip-teacher", action="store_true", help="score the students only (no teacher rows)")
    args = parser.parse_args()
    rows = []
    teacher_row = None
    curve: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            run_dir, wall = train(method, Path(tmp), args.override)
            metrics = score(run_dir, args.samples)
            rows.append((method, wall, metrics))
            print(f"{method}: {json.dumps(metrics)}  wall {wall:.0f} s", flush=True)
            if method in TWO_STEP:
                two = score(run_dir, args.samples, t_list=TWO_STEP[method])
                rows.append((f"{method}, 2 steps", wall, two))
                print(f"{method}, 2 steps: {json.dumps(two)}", flush=True)
            if teacher_row is None and method != "sft" and not args.skip_teacher:
                try:
                    teacher_row = score(run_dir, args.samples, teacher=True)
                    print(f"teacher: {json.dumps(teacher_row)}", flush=True)
                    curve = teacher_curve(run_dir, args.samples)
                except AttributeError:
                    pass
    lines = ["| method | network evaluations | teacher evaluations at equal FD | FD (digits) | accuracy | train wall time |",
             "|---|---:|---:|---:|---:|---:|"]
    if teacher_row is not None:
        lines.append(f"| teacher (Heun, 18 steps) | {teacher_row['evaluations']} | - | {teacher_row['fd_digits']:.3f} | "
                     f"{teacher_row['accuracy']:.3f} | shipped |")
    for method, wall, m in rows:
        equal = evaluations_at_equal_quality(curve, m["fd_digits"]) if curve else "-"
        lines.append(f"| {method} | {m['evaluations']} | {equal} | {m['fd_digits']:.3f} | {m['accuracy']:.3f} | "
                     f"{wall:.0f} s |")
    table = "\n".join(lines)
    print(table)
    print(f"torch {torch.__version__}, {args.samples} samples, threads {torch.get_num_threads()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": [(m, w, x) for m, w, x in rows], "teacher": teacher_row,
                                               "teacher_curve": curve}, indent=2))
    if args.write:
        report = ROOT / "docs" / "experiments" / "digits-quality.md"
        text = report.read_text()
        if BEGIN not in text:
            raise SystemExit(f"{report} lacks the {BEGIN} ... {END} markers")
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), BEGIN + "\n" + table + "\n" + END, text, flags=re.S)
        report.write_text(text)


if __name__ == "__main__":
    main()
